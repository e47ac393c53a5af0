"""Benchmark: the real pair's training step with the built-in loop (``train.engine: hf``) vs vLLM
(``train.engine: vllm``), side by side in one run.

Trains ``--experiment`` (default ``experiments/real_pair.yaml``) for ``--steps`` steps under each engine
in turn, ``--reps`` times (A B A B), each a fresh run directory in a temporary folder, evaluating 8 held-out
items at the start and the end only. Per engine it prints the median over runs of each run's median over
steps 2..N (step 1 under vLLM includes starting the servers, printed apart as ``start``) of the step,
rollout, generation and update times and the sync time summed over agents, then the ratios vLLM / hf.
Needs the engine environment (``make engine``; without it, it says so and exits); ``--engines hf`` times
the built-in loop alone.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_engine_step.py [--steps 4] [--reps 2] [--method hacpo]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from workbench.agents.generation.vllm_engine import EngineError, engine_python
from workbench.core.env import PROJECT_ROOT

PHASES = ("step", "rollout", "generate", "update")


def _run(experiment: str, engine: str, steps: int, method: str, root: Path) -> list[dict]:
    """One fresh run under ``engine``; its per-step metrics (step 0, the evaluation, left out)."""
    overrides = [
        f"algorithm={method}",
        f"train.engine={engine}",
        f"train.steps={steps}",
        "train.eval_every=0",
        f"train.save_every={steps}",
        "task.eval_size=8",
        f"output.root={root}",
    ]
    cmd = [
        sys.executable,
        "-m",
        "workbench",
        "run",
        experiment,
        "--seeds",
        "0",
        "--fresh",
        "--set",
        *overrides,
    ]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{engine} run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    (metrics,) = root.glob("*/*/metrics.jsonl")
    rows = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines()]
    return [r for r in rows if r.get("step", 0) >= 1]


def _seconds(rows: list[dict]) -> dict[str, float]:
    """Median over steps 2..N of each phase, the summed sync; ``start``: step 1's excess over the median."""
    later = rows[1:] or rows
    out = {p: statistics.median(r.get(f"time/{p}_s", 0.0) for r in later) for p in PHASES}
    out["sync"] = statistics.median(
        sum(v for k, v in r.items() if k.startswith("engine/") and k.endswith("/sync_s")) for r in later
    )
    out["start"] = rows[0].get("time/step_s", 0.0) - out["step"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="experiments/real_pair.yaml")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--method", default="hacpo")
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    args = parser.parse_args()
    engines = list(dict.fromkeys(args.engines))
    if "vllm" in engines:
        try:
            engine_python()
        except EngineError as exc:  # make bench runs every benchmark: without the engine this one says why
            print(f"skipped: {exc}")
            return
    print(
        f"{args.experiment}, {args.method}, {args.steps} steps x {args.reps} reps; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    results: dict[str, list[dict[str, float]]] = {e: [] for e in engines}
    for rep in range(args.reps):
        for engine in engines:
            with tempfile.TemporaryDirectory(prefix=f"bench-{engine}-") as tmp:
                results[engine].append(
                    _seconds(_run(args.experiment, engine, args.steps, args.method, Path(tmp)))
                )
            print(
                f"rep {rep} {engine}: " + ", ".join(f"{k} {v:.1f} s" for k, v in results[engine][-1].items())
            )
    keys = [*PHASES, "sync", "start"]
    median = {e: {k: statistics.median(r[k] for r in results[e]) for k in keys} for e in engines}
    print("| engine | " + " | ".join(f"{k} s" for k in keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for engine in engines:
        print(f"| {engine} | " + " | ".join(f"{median[engine][k]:.1f}" for k in keys) + " |")
    if {"hf", "vllm"} <= set(median):
        ratios = {k: median["vllm"][k] / median["hf"][k] for k in PHASES if median["hf"][k] > 0}
        print("vLLM / hf: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
