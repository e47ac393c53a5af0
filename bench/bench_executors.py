"""Benchmark: the quickstart step in-process vs with the Ray executor (one actor per agent), side by side.

Both start from the same tiny agents and seed, so they run the same steps. In-process, the two agents run one
after another with torch's default threads (all cores); under Ray each agent's actor gets
``cpus_per_agent`` = cores / agents CPUs (= its torch threads) and the agents roll out, score and update in
parallel. Prints Ray's import/init and actor start-up times, then medians over steps of the whole step and
its phases, and the Ray / in-process ratios. Repetitions alternate the two executors.

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
from workbench.train.trainer import Trainer

PHASES = ("step", "rollout", "update")


def _time_steps(
    config: str, executor: str, steps: int, root: str, cpus_per_agent: float
) -> dict[str, list[float]]:
    cfg = load_experiment(config, {"output.root": root, "task.eval_size": 0})
    object.__setattr__(cfg, "ray", {"cpus_per_agent": cpus_per_agent})  # until the config has the field
    run_dir = create_run_dir(root, cfg.experiment)
    RunWriter(run_dir).write_config(cfg.to_dict())
    t0 = time.perf_counter()
    trainer = Trainer(cfg, run_dir, executor=executor)
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
    results: dict[str, dict[str, list[float]]] = {"local": {}, "ray": {}}
    with tempfile.TemporaryDirectory() as root:
        for _ in range(args.reps):
            for executor in ("local", "ray"):
                times = _time_steps(args.config, executor, args.steps, root, cpus_per_agent)
                for key, values in times.items():
                    results[executor].setdefault(key, []).extend(values)
    ray.shutdown()
    print(
        f"{args.config}, {cores} cores, 2 agents; ray: {cpus_per_agent} CPU(s) and torch thread(s) per agent"
    )
    print(f"import ray {t1 - t0:.1f} s, ray.init {t2 - t1:.1f} s")
    print(f"{'(medians, s)':<16}{'in-process':>12}{'ray':>10}{'ray/local':>11}")
    for key in ("start", *PHASES):
        local, remote = statistics.median(results["local"][key]), statistics.median(results["ray"][key])
        label = "agents start" if key == "start" else key
        print(f"{label:<16}{local:>12.3f}{remote:>10.3f}{remote / local:>11.2f}")
    print(f"({args.reps} repetitions x {args.steps} steps each, alternating; start = Trainer construction)")


if __name__ == "__main__":
    main()
