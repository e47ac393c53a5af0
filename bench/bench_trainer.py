"""Benchmark: a HACPO step against a GSPO step on the same agents and prompts (not a test).

Both trainers start from the same tiny agents and seed, so step t samples the same prompts and, before the
first update diverges the weights, the same rollouts. Prints medians over steps of the whole step, the
rollout phase (generate + grade + score) and the update phase, and the HACPO/GSPO ratios. A second table
times the pure math (advantages + loss forward/backward) on identical tensors.

    .venv/bin/python bench/bench_trainer.py [--steps 6] [--config experiments/quickstart.yaml]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from workbench.config.loading import load_experiment
from workbench.hacpo import (
    LossParams,
    PolicyBatch,
    capability_aware_advantages,
    capability_ratios,
    group_advantages,
    gspo_policy_loss,
    hacpo_policy_loss,
)
from workbench.train.rundir import RunWriter, create_run_dir
from workbench.train.trainer import Trainer


def _time_steps(config: str, algorithm: str, steps: int, root: str) -> dict[str, list[float]]:
    cfg = load_experiment(config, {"algorithm": algorithm, "output.root": root, "task.eval_size": 0})
    run_dir = create_run_dir(root, cfg.experiment)
    RunWriter(run_dir).write_config(cfg.to_dict())
    trainer = Trainer(cfg, run_dir)
    times: dict[str, list[float]] = {"step": [], "rollout": [], "update": []}
    for _ in range(steps):
        metrics = trainer.train_step()
        times["step"].append(metrics["time/step_s"])
        times["rollout"].append(metrics["time/rollout_s"])
        times["update"].append(metrics["time/update_s"])
    return times


def _time_math(repeats: int = 50) -> dict[str, float]:
    P, A, G = 128, 2, 8
    gen = torch.Generator().manual_seed(0)
    rewards_P_A_G = (torch.rand(P, A, G, generator=gen) > 0.5).float()
    omega = capability_ratios(torch.tensor([0.3, 0.6]))
    new_B = torch.randn(P * A * G, generator=gen, requires_grad=True)
    old_B = new_B.detach() + torch.randn(P * A * G, generator=gen) * 0.1
    is_self_B = torch.arange(P * A * G) < P * G
    coef_B = torch.where(is_self_B, 1.0, 2.0)
    ones_B = torch.ones(P * A * G, 1)

    def batch(n: int, adv_B: torch.Tensor) -> PolicyBatch:  # one-token rows whose mean log-prob is new_B
        return PolicyBatch(new_B[:n, None], ones_B[:n], old_B[:n], adv_B, is_self_B[:n], coef_B[:n], 1)

    def hacpo() -> None:
        adv, _ = capability_aware_advantages(rewards_P_A_G, omega)
        loss, _ = hacpo_policy_loss(batch(P * A * G, adv[0].reshape(-1)), LossParams())
        loss.backward()

    def gspo() -> None:
        adv, _ = group_advantages(rewards_P_A_G[:, 0])
        loss, _ = gspo_policy_loss(batch(P * G, adv.reshape(-1)), LossParams())
        loss.backward()

    out = {}
    for name, fn in (("hacpo", hacpo), ("gspo", gspo)):
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        out[name] = statistics.median(samples)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="experiments/quickstart.yaml")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        hacpo = _time_steps(args.config, "hacpo", args.steps, root)
        gspo = _time_steps(args.config, "gspo", args.steps, root)
    print(f"trainer steps on {args.config} ({args.steps} steps each; medians, seconds)")
    print(f"{'phase':<10}{'hacpo':>10}{'gspo':>10}{'hacpo/gspo':>12}")
    for phase in ("step", "rollout", "update"):
        h, g = statistics.median(hacpo[phase]), statistics.median(gspo[phase])
        print(f"{phase:<10}{h:>10.3f}{g:>10.3f}{h / g:>12.2f}")
    math = _time_math()
    print("\npure math, 128 prompts x 2 agents x G=8 (advantages + loss forward/backward; medians, ms)")
    h, g = math["hacpo"], math["gspo"]
    print(f"hacpo {h * 1e3:.2f}  gspo {g * 1e3:.2f}  ratio {h / g:.2f}")
    print("(HACPO trains each learner on both agents' rollouts: 2x the sequences of GSPO, same rollout cost)")


if __name__ == "__main__":
    main()
