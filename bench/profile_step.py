"""Profile one training step (not a test): where a HACPO step's time goes, by phase, function and operator.

Builds the trainer of a config (the quickstart by default; evaluations off), runs one warm-up step, then
one step under both profilers and prints:

- the step's phases as the trainer reports them (``time/*`` of `workbench.train.trainer.Trainer.train_step`);
- the workbench functions with the largest cumulative time (cProfile; a function's time includes its callees;
  cProfile's per-call cost inflates functions of many small Python calls, e.g. transformers' config reads);
- the torch operators with the largest self CPU time (torch.profiler, every thread), with their share of the
  step's wall time (under ``executor: threads`` two agents' operators overlap, so the shares may add up past
  100%).

cProfile sees the calling thread only: under ``executor: threads`` (the quickstart's) the agents' functions
run on threads of their own and are missing from the function table; ``--executor local`` runs them here.

    .venv/bin/python bench/profile_step.py [--config experiments/quickstart.yaml] [--algorithm hacpo]
        [--executor local] [--top 15] [--dump step.prof]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]


def _functions(profile: cProfile.Profile, step_s: float, top: int) -> None:
    """The workbench functions of the profiled step with the largest cumulative time."""
    stats = pstats.Stats(profile, stream=io.StringIO())
    rows = []
    for (path, line, name), (_, calls, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        if "/workbench/" in path:
            rows.append((cumulative, calls, f"{path.split('/workbench/')[-1]}:{line} {name}"))
    rows.sort(reverse=True)
    print(f"\nworkbench functions by cumulative time (top {top}; includes callees)")
    print(f"{'s':>8}{'share':>8}{'calls':>8}  function")
    for cumulative, calls, where in rows[:top]:
        print(f"{cumulative:>8.3f}{cumulative / step_s:>8.1%}{calls:>8}  {where}")


def _operators(profiler, step_s: float, top: int) -> None:
    """The torch operators of the profiled step with the largest self CPU time."""
    events = sorted(profiler.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    print(f"\ntorch operators by self CPU time (top {top})")
    print(f"{'s':>8}{'share':>8}{'calls':>8}  operator")
    for event in events[:top]:
        seconds = event.self_cpu_time_total / 1e6
        print(f"{seconds:>8.3f}{seconds / step_s:>8.1%}{event.count:>8}  {event.key}")


def _all_threads():
    """torch.profiler's option to record the operators of every thread, not only the caller's (the agents'
    threads under ``executor: threads``); experimental in torch, so None where this torch lacks it."""
    from torch.profiler import _ExperimentalConfig

    try:
        return _ExperimentalConfig(profile_all_threads=True)
    except TypeError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="experiments/quickstart.yaml")
    parser.add_argument("--algorithm", default="hacpo")
    parser.add_argument("--executor", help="local, threads or ray (default: the config's)")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--dump", type=Path, help="also write the cProfile statistics here (for pstats, snakeviz)"
    )
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from workbench.config.loading import load_experiment
    from workbench.train.rundir import RunWriter, create_run_dir
    from workbench.train.trainer import start_trainer

    overrides = {"task.eval_size": 0, "train.eval_every": 0, "algorithm": args.algorithm}
    if args.executor:
        overrides["executor"] = args.executor
    with tempfile.TemporaryDirectory() as root:
        cfg = load_experiment(ROOT / args.config, {**overrides, "output.root": root})
        run_dir = create_run_dir(root, cfg.experiment)
        RunWriter(run_dir).write_config(cfg.to_dict())
        trainer = start_trainer(cfg, run_dir)
        trainer.train_step()  # warm-up: first-call allocations, lazy imports
        functions = cProfile.Profile()
        with profile(activities=[ProfilerActivity.CPU], experimental_config=_all_threads()) as operators:
            start = time.perf_counter()
            functions.enable()
            metrics = trainer.train_step()
            functions.disable()
            wall = time.perf_counter() - start
        trainer.close()
    if args.dump:
        functions.dump_stats(args.dump)

    print(
        f"{args.config} ({args.algorithm}, executor {cfg.executor}), one step after a warm-up, torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads; the profilers add overhead: shares, not "
        "seconds, carry over"
    )
    print(f"step {wall:.2f} s profiled; phases (time/*):")
    for key in sorted(k for k in metrics if k.startswith("time/")):
        print(f"  {key:<22}{metrics[key]:>8.3f} s{metrics[key] / metrics['time/step_s']:>8.1%}")
    _functions(functions, wall, args.top)
    _operators(operators, wall, args.top)


if __name__ == "__main__":
    main()
