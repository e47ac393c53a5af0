"""Tiny fake run directories for the lab's tests: the files the trainer writes, by hand (no training)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from workbench.core.machine import code_version
from workbench.train.rundir import RunWriter, create_run_dir

PROMPTS, GROUP = 4, 8


def write_run(
    root: Path,
    *,
    experiment: str = "model",
    algorithm: str = "hacpo",
    label: str = "",
    seed: int = 0,
    agents: Sequence[str] = ("a", "b"),
    initial: Sequence[float] = (0.4, 0.6),
    final: Sequence[float] = (0.5, 0.7),
    avg: Sequence[float] | None = None,
    steps: int = 4,
    eval_size: int = 100,
    version: str | None = "current",
    done: bool = True,
    in_range: float | None = None,
    ratio_normalization: str = "tokens",
    step_s: float = 2.0,
    train_acc: bool = True,
    per_item: bool = True,
    weights: dict[str, str] | None = None,
) -> Path:
    """A finished (``done``) run: evals at step 0 and ``steps`` (greedy and, with ``avg``, avg@4), cost,
    time and (with ``in_range``) cross in-range fractions in ``metrics.jsonl``; ``version="current"`` is this
    code's version, None leaves ``code_version`` out of ``environment.json``; ``train_acc=False`` logs no
    ``train/acc`` (own-rollout accuracy).

    With ``per_item`` each evaluation also writes ``eval_items.csv`` (`fake_items`), agreeing with its
    accuracies; ``weights`` (agent → digest) are recorded as the agents' starting weights."""
    run_dir = create_run_dir(root, experiment)
    writer = RunWriter(run_dir)
    writer.write_config(
        {
            "experiment": experiment,
            "algorithm": algorithm,
            "label": label,
            "seed": seed,
            "seeds": None,
            "agents": [{"name": a, "model": f"tiny:{a}"} for a in agents],
            "task": {"eval_size": eval_size},
            "train": {"steps": steps, "prompts_per_step": PROMPTS, "group_size": GROUP},
            "hacpo": {"ratio_normalization": ratio_normalization},
            "output": {"root": str(root)},
        }
    )
    env = {} if version is None else {"code_version": code_version() if version == "current" else version}
    if weights is not None:
        env["start_weights"] = weights
    (run_dir / "environment.json").write_text(json.dumps({"python": "3.11", **env}))
    multiplier = 2 if algorithm == "gspo_x2" else 1
    shares = algorithm in ("hacpo", "naive")
    for step in range(steps + 1):
        metrics: dict[str, float] = {}
        if step:
            metrics["time/step_s"] = step_s
            if train_acc:
                metrics |= {
                    f"train/acc/{a}": 0.1 * step + 0.01 * seed + 0.1 * i for i, a in enumerate(agents)
                }
            for i, a in enumerate(agents):
                generated = step * PROMPTS * GROUP * multiplier
                metrics[f"cost/{a}/generated_responses"] = generated
                metrics[f"cost/{a}/trained_responses"] = generated * (len(agents) if shares else 1)
                for source in agents:
                    if in_range is not None and source != a:
                        metrics[f"is/{a}/{source}/in_range_frac"] = in_range + 0.01 * (step - 2) + 0.1 * i
                        for m in (0, 1):  # per mini-batch index: m = 1 has 0.1 less in band
                            metrics[f"is_mb/{a}/{source}/{m}/ratio_mean"] = 0.9 - 0.05 * m + 0.01 * seed
                            metrics[f"is_mb/{a}/{source}/{m}/in_range_frac"] = in_range - 0.1 * m
                    elif in_range is not None:
                        metrics[f"is_mb/{a}/{a}/0/ratio_mean"] = 1.0
                        metrics[f"is_mb/{a}/{a}/0/clip_frac"] = 0.25
        if step in (0, steps):
            accs = initial if step == 0 else final
            metrics |= {f"eval/acc/{a}": v for a, v in zip(agents, accs)}
            rows = [
                {"agent": a, "benchmark": "arith", "metric": "greedy_acc", "value": v}
                for a, v in zip(agents, accs)
            ]
            if avg is not None:
                sampled = [v - 0.05 for v in initial] if step == 0 else avg
                metrics |= {f"eval/avg@4/{a}": v for a, v in zip(agents, sampled)}
                rows += [
                    {"agent": a, "benchmark": "arith", "metric": "avg@4", "value": v}
                    for a, v in zip(agents, sampled)
                ]
            writer.append_evals(step, rows)
            if per_item:
                writer.append_eval_items(
                    step, fake_items(agents, accs, sampled if avg is not None else None, eval_size)
                )
        writer.log_metrics(step, metrics)
    if done:
        writer.mark_done({"steps": steps, "agents": list(agents)})
    return run_dir


def fake_items(
    agents: Sequence[str], greedy: Sequence[float], sampled: Sequence[float] | None, n: int, k: int = 4
) -> list[dict]:
    """Per-item rows of ``n`` items ``q000``... with the given greedy accuracy (the first round(acc·n) items
    are right) and avg@k (round(avg·n·k) correct samples spread as evenly as the items allow)."""
    rows = []
    for i, agent in enumerate(agents):
        right = round(greedy[i] * n)
        total = round(sampled[i] * n * k) if sampled is not None else 0
        for j in range(n):
            count = total // n + (j < total % n) if sampled is not None else None
            rows.append(
                {"agent": agent, "benchmark": "arith", "item": f"q{j:03d}", "greedy": int(j < right),
                 "sampled": count, "k": k if sampled is not None else 0}
            )  # fmt: skip
    return rows
