"""Benchmark: the quickstart step under the three executors (in-process, threads, Ray), side by side.

All start from the same tiny agents and seed, so they run the same steps. ``local`` runs the two agents one
after another with torch's default threads (all cores); ``threads`` runs them at once in the same process, a
Python thread and cores / agents torch threads each; under Ray each agent's actor gets ``cpus_per_agent`` =
cores / agents CPUs (= its torch threads) and the agents roll out, score and update in parallel. Prints Ray's
import/init time, then medians over steps of the agents' start-up, the whole step and its phases, and each
executor's ratio to ``local``. Repetitions alternate the executors.

    .venv/bin/python bench/bench_executors.py [--steps 5] [--reps 2] [--config experiments/quickstart.yaml]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from workbench.config.loading import load_experiment
from workbench.train.rundir import RunWriter, create_run_dir
from workbench.train.trainer import start_trainer

PHASES = ("step", "rollout", "update")
EXECUTORS = ("local", "threads", "ray")


def _time_steps(
    config: str, executor: str, steps: int, root: str, cpus_per_agent: float
) -> dict[str, list[float]]:
    overrides = {"output.root": root, "task.eval_size": 0, "ray.cpus_per_agent": cpus_per_agent}
    cfg = load_experiment(config, overrides)
    run_dir = create_run_dir(root, cfg.experiment)
    RunWriter(run_dir).write_config(cfg.to_dict())
    t0 = time.perf_counter()
    trainer = start_trainer(cfg, run_dir, executor=executor)
    times: dict[str, list[float]] = {"start": [time.perf_counter() - t0]} | {p: [] for p in PHASES}
    trainer.train_step()  # warm-up (first-call allocations, lazy imports)
    for _ in range(steps):
        metrics = trainer.train_step()
        for phase in PHASES:
            times[phase].append(metrics[f"time/{phase}_s"])
    trainer.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="experiments/quickstart.yaml")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    cpus_per_agent = max(1, cores // 2)
    t0 = time.perf_counter()
    import ray

    t1 = time.perf_counter()
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False)
    t2 = time.perf_counter()
    results: dict[str, dict[str, list[float]]] = {executor: {} for executor in EXECUTORS}
    with tempfile.TemporaryDirectory() as root:
        for _ in range(args.reps):
            for executor in EXECUTORS:
                times = _time_steps(args.config, executor, args.steps, root, cpus_per_agent)
                for key, values in times.items():
                    results[executor].setdefault(key, []).extend(values)
    ray.shutdown()
    print(
        f"{args.config}, {cores} cores, 2 agents; threads and ray: {cpus_per_agent} torch thread(s) per agent"
    )
    print(f"import ray {t1 - t0:.1f} s, ray.init {t2 - t1:.1f} s")
    print(
        f"{'(medians, s)':<16}"
        + "".join(f"{e:>10}" for e in EXECUTORS)
        + f"{'threads/local':>15}{'ray/local':>11}"
    )
    for key in ("start", *PHASES):
        m = {e: statistics.median(results[e][key]) for e in EXECUTORS}
        label = "agents start" if key == "start" else key
        figures = "".join(f"{m[e]:>10.3f}" for e in EXECUTORS)
        print(f"{label:<16}{figures}{m['threads'] / m['local']:>15.2f}{m['ray'] / m['local']:>11.2f}")
    print(f"({args.reps} repetitions x {args.steps} steps each, alternating; start = Trainer construction)")


if __name__ == "__main__":
    main()
