"""Benchmark: the workbench's GSPO step against TRL's ``GRPOTrainer`` in GSPO mode, on the same work.

Same weights (one tiny agent's model directory, loaded by both), the same prompts in the same order (the
trainer's seeded prompt batches, formatted by the agent's own prompt template), the same batch (P prompts x G
samples per generation round), response cap, sampling (temperature 1, top-p 1), learning rate, clip range,
gradient clip and optimizer steps per round (TRL: ``steps_per_generation`` optimizer steps of
``per_device_train_batch_size`` sequences; workbench: ``minibatch_prompts`` x G per step), KL off on both
sides, dropout off on both sides. Each side runs in its own process (its own peak RSS); repetitions alternate.

Prints medians per round: step time (and the CPU seconds of the process, all threads: a check on a loaded
machine), generation tokens/s, update ms per sequence (round time minus
generation/scoring, per trained sequence), peak RSS, and the workbench/TRL ratios (the goal: a step <= 0.5x
TRL's), then what still differs between the two.

TRL runs in the bench-only venv made by ``make bench-peers`` (``.venv-bench/``); without it this prints how to
make it and exits 0.

    .venv/bin/python bench/bench_peers.py [--rounds 4] [--reps 2] [--model tiny:gpt2-char]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
TRL_PYTHON = HERE.parent / ".venv-bench" / "bin" / "python"
SIZES = {"prompts": 8, "group": 8, "minibatch_prompts": 2, "max_new_tokens": 32}
"""8 prompts x G 8 = 64 samples per round, 4 optimizer steps of 16 sequences, 32 new tokens."""
DIFFERENCES = """\
What still differs (same weights, prompts, batch, lengths, sampling, optimizer steps, lr, clip, KL off):
- TRL computes per-token entropies in every loss forward (logged); the workbench does not.
- TRL's generation is transformers' ``model.generate`` (dynamic cache, multinomial sampling, every prompt
  prefilled G times); the workbench's is `workbench.agents.generation.rollout.generate` (one prefill per
  distinct prompt, preallocated cache, inverse-CDF sampling). Different random draws: the responses, and so
  their lengths and the update's token counts, differ between the two sides.
- Reward: TRL's side checks the last integer of the completion in Python; the workbench grades with
  `workbench.tasks.rewards.grade_batch` (exact fast path for integers). Both are < 1% of a round.
- TRL's loop adds accelerate / Trainer bookkeeping (dataloader, callbacks, logging every step); the loss
  normalization follows each side's own GSPO formula (same compute).
- Old log-probs: the workbench scores every sample once before the update (its ratio of the first
  mini-batch is then exactly 1); TRL computes them when a generation feeds several optimizer steps."""


def _config(model: str, root: str):
    from workbench.config.loading import load_experiment

    return load_experiment(
        "experiments/quickstart.yaml",
        {
            "agents": [{"name": "peer", "model": model}],
            "algorithm": "gspo",
            "executor": "local",  # one agent: nothing to run at once
            "output.root": root,
            "task.eval_size": 0,
            "train.eval_every": 0,
            "train.prompts_per_step": SIZES["prompts"],
            "train.group_size": SIZES["group"],
            "train.minibatch_prompts": SIZES["minibatch_prompts"],
            "train.micro_batch_size": SIZES["minibatch_prompts"] * SIZES["group"],
            "train.max_new_tokens": SIZES["max_new_tokens"],
            "train.kl_coef": 0.0,
        },
    )


def worker_ours(model: str, rounds: int, spec_path: str) -> dict:
    """Trains ``rounds`` GSPO steps; writes TRL's spec (same prompts, weights, settings) to ``spec_path``."""
    from workbench.agents.models.loading import load_agent
    from workbench.tasks.prompts import build_prompt
    from workbench.train.rundir import RunWriter, create_run_dir
    from workbench.train.trainer import start_trainer

    with tempfile.TemporaryDirectory() as root:
        cfg = _config(model, root)
        agent = load_agent(cfg.agents[0])
        run_dir = create_run_dir(root, cfg.experiment)
        RunWriter(run_dir).write_config(cfg.to_dict())
        trainer = start_trainer(cfg, run_dir)
        items = [item for step in range(1, rounds + 1) for item in trainer.data.prompt_batch(step)]
        t, h = cfg.train, cfg.hacpo
        spec = {
            "model_dir": agent.source,
            "prompts": [agent.format_prompt(build_prompt(i.question, cfg.task.instruction)) for i in items],
            "answers": [i.answer for i in items],
            "rounds": rounds,
            "group_size": t.group_size,
            "sequences_per_update": t.minibatch_prompts * t.group_size,
            "updates_per_round": t.prompts_per_step // t.minibatch_prompts,
            "max_new_tokens": t.max_new_tokens,
            "temperature": t.temperature,
            "top_p": t.top_p,
            "lr": t.lr,
            "weight_decay": t.weight_decay,
            "grad_clip": t.grad_clip,
            "eps_low": h.eps_low,
            "eps_high": h.eps_high,
            "seed": cfg.seed,
        }
        Path(spec_path).write_text(json.dumps(spec))
        out = []
        tokens_before = 0.0
        for _ in range(rounds):
            cpu = _cpu_s()
            metrics = trainer.train_step()
            cpu = _cpu_s() - cpu
            tokens = metrics["cost/peer/generated_tokens"]
            out.append(
                {
                    "step_s": metrics["time/step_s"],
                    "generate": metrics.get("time/generate_s", metrics["time/rollout_s"]),
                    "generate_and_score": metrics["time/step_s"] - metrics["time/update_s"],
                    "tokens": tokens - tokens_before,
                    "cpu_s": cpu,
                }
            )
            tokens_before = tokens
        if hasattr(trainer, "close"):
            trainer.close()
    return {"rounds": out, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _cpu_s() -> float:
    """CPU seconds this process has used (all threads): less sensitive to other jobs than wall time."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _run(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=HERE.parent)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def _summary(results: list[dict]) -> dict[str, float]:
    """Medians over every round but each process's first (warm-up)."""
    rounds = [r for result in results for r in result["rounds"][1:]]
    sequences = SIZES["prompts"] * SIZES["group"]
    return {
        "step_s": statistics.median(r["step_s"] for r in rounds),
        "cpu_s": statistics.median(r["cpu_s"] for r in rounds),
        "gen_tok_s": sum(r["tokens"] for r in rounds) / sum(r["generate"] for r in rounds),
        "update_ms_per_seq": statistics.median(
            (r["step_s"] - r["generate_and_score"]) / sequences * 1e3 for r in rounds
        ),
        "tokens_per_round": statistics.median(r["tokens"] for r in rounds),
        "peak_rss_mb": max(result["peak_rss_mb"] for result in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=4, help="generation rounds per process (first = warm-up)"
    )
    parser.add_argument("--reps", type=int, default=2, help="processes per side, alternating")
    parser.add_argument("--model", default="tiny:gpt2-char")
    parser.add_argument("--trl-python", default=str(TRL_PYTHON))
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        model, rounds, spec_path = args.worker
        print(json.dumps(worker_ours(model, int(rounds), spec_path)), flush=True)
        return
    if not Path(args.trl_python).exists():
        print(f"no TRL environment at {args.trl_python}: run `make bench-peers` (creates .venv-bench/)")
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        spec = str(Path(tmp) / "spec.json")
        for _ in range(args.reps):
            ours.append(_run([sys.executable, __file__, "--worker", args.model, str(args.rounds), spec]))
            theirs.append(_run([args.trl_python, str(HERE / "peers_trl.py"), spec]))
    o, t = _summary(ours), _summary(theirs)
    p, g = SIZES["prompts"], SIZES["group"]
    print(
        f"{args.model}: {p} prompts x G {g}, {SIZES['max_new_tokens']} new tokens, "
        f"{p // SIZES['minibatch_prompts']} optimizer steps of {SIZES['minibatch_prompts'] * g} sequences "
        f"per round; medians over {args.reps} x {args.rounds - 1} rounds; TRL {theirs[0]['versions']['trl']}"
    )
    print(f"{'':<22}{'workbench':>11}{'TRL':>11}{'ratio':>8}")
    rows = [
        ("step s / round", "step_s", "{:.3f}"),
        ("CPU s / round", "cpu_s", "{:.3f}"),
        ("generation tok/s", "gen_tok_s", "{:.0f}"),
        ("update ms / sequence", "update_ms_per_seq", "{:.2f}"),
        ("tokens / round", "tokens_per_round", "{:.0f}"),
        ("peak RSS MB", "peak_rss_mb", "{:.0f}"),
    ]
    for label, key, fmt in rows:
        print(f"{label:<22}{fmt.format(o[key]):>11}{fmt.format(t[key]):>11}{o[key] / t[key]:>8.2f}")
    ratio, cpu_ratio = o["step_s"] / t["step_s"], o["cpu_s"] / t["cpu_s"]
    verdict = "met" if ratio <= 0.5 else "MISSED"
    print(f"goal workbench/TRL step <= 0.5: {ratio:.2f} {verdict} (CPU seconds: {cpu_ratio:.2f})")
    print(f"load average at end: {os.getloadavg()[0]:.2f}\n")
    print(DIFFERENCES)


if __name__ == "__main__":
    main()
