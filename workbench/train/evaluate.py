"""Evaluation: generate, grade, and summarize as greedy accuracy, avg@k, pass@k and best@k.

The metrics are pure functions of rewards (`pass_at_k`, `avg_at_k`, `best_at_k`, `summarize`); `evaluate`
runs any agent, in any state, on a list of task items through ``workbench.agents.generate``.

| metric | meaning |
|---|---|
| ``greedy_acc`` | mean reward of one greedy (temperature 0) response per item |
| ``avg@k`` | mean reward over k sampled responses per item, averaged over items (the paper's avg@1) |
| ``pass@j`` | unbiased estimate of P(one of j samples is correct) from k samples (Chen et al. 2021), |
| | reported for j = 1, 2, 4, ... < k and j = k |
| ``best@k`` | share of items whose best of the k samples is correct (the paper's AIME best@30): the |
| | empirical max over the samples actually drawn, so it equals pass@k estimated from exactly k samples |

`EvalResult.item_rows` reduces the samples to one row per agent, benchmark and item: whether the greedy
response is correct (0/1) and how many of the k sampled responses are (reward > 0.5, as pass@k counts them);
the trainer keeps these rows in ``eval_items.csv`` of the run directory, for paired tests between methods
evaluated on the same items (`workbench.lab.paired.paired_bootstrap`).

During training, `workbench.train.data.held_out_sets` gives the sets the trainer evaluates every
``train.eval_every`` steps: the main one (``task.eval_source``; metrics ``eval/acc/<agent>``,
``eval/avg@k/<agent>``) and one per ``task.eval_sources`` entry (metrics ``eval/<source>/acc/<agent>``,
``eval/<source>/avg@k/<agent>``, with ``<source>`` from `workbench.train.data.source_key`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from workbench.agents.generation.rollout import generate
from workbench.core.types import TaskItem
from workbench.tasks.metrics import accuracy_by_difficulty, summarize
from workbench.tasks.prompts import PAPER_INSTRUCTION, build_prompt
from workbench.tasks.rewards import grade_batch

logger = logging.getLogger(__name__)

SAMPLE_COLUMNS = ("agent", "benchmark", "item", "sample", "greedy", "reward", "length", "reason", "response")


@dataclass
class EvalResult:
    """What `evaluate` returns.

    Attributes:
        samples: One row per response: ``agent, benchmark, item, sample, greedy, reward, length, reason,
            response``.
        summary: ``agent, benchmark, metric, value`` (see the module docstring for the metrics).
    """

    samples: pd.DataFrame
    summary: pd.DataFrame

    def rows(self) -> list[dict[str, Any]]:
        """Summary rows as dicts, ready for ``RunWriter.append_evals(step, rows)``."""
        return self.summary.to_dict("records")

    def item_rows(self) -> list[dict[str, Any]]:
        """Per agent, benchmark and item: ``greedy`` (1 when its greedy response is correct, 0 if not, None
        without greedy responses), ``sampled`` (correct responses of the k sampled, None when k = 0) and
        ``k``, as plain Python values (they cross process boundaries), ready for
        ``RunWriter.append_eval_items(step, rows)``."""
        samples = self.samples.assign(correct=(self.samples["reward"] > 0.5).astype(int))
        keys = ["agent", "benchmark", "item"]
        greedy = samples[samples["greedy"]].groupby(keys, sort=False)["correct"].max()
        sampled = samples[~samples["greedy"]].groupby(keys, sort=False)["correct"].agg(["sum", "size"])
        rows = []
        for key in dict.fromkeys([*greedy.index, *sampled.index]):
            k = int(sampled.at[key, "size"]) if key in sampled.index else 0
            rows.append(
                {
                    **dict(zip(keys, map(str, key))),
                    "greedy": int(greedy[key]) if key in greedy.index else None,
                    "sampled": int(sampled.at[key, "sum"]) if k else None,
                    "k": k,
                }
            )
        return rows


def _generate(agent: Any, prompts: list[str], n: int, **kwargs: Any) -> list[Any]:
    rollouts = generate(agent, prompts, n, **kwargs)
    if len(rollouts) != len(prompts) * n:
        raise RuntimeError(f"generate returned {len(rollouts)} rollouts for {len(prompts)} prompts x n={n}")
    return rollouts


def _frame(
    rollouts: Sequence[Any],
    items: list[TaskItem],
    n: int,
    greedy: bool,
    agent: str,
    benchmark: str | None,
    method: str,
) -> pd.DataFrame:
    answers = [item.answer for item in items for _ in range(n)]  # rollouts are prompt-major
    grades = grade_batch([r.text for r in rollouts], answers, method=method)
    return pd.DataFrame(
        {
            "agent": agent,
            "benchmark": [benchmark or item.source or "unknown" for item in items for _ in range(n)],
            "item": [item.id for item in items for _ in range(n)],
            "sample": [s for _ in items for s in range(n)],
            "greedy": greedy,
            "reward": [g.reward for g in grades],
            "length": [int(r.length) for r in rollouts],
            "reason": [g.reason for g in grades],
            "response": [r.text for r in rollouts],
        },
        columns=list(SAMPLE_COLUMNS),
    )


def evaluate(
    agent: Any,
    items: list[TaskItem],
    *,
    k: int = 1,
    temperature: float = 1.0,
    max_new_tokens: int | None = None,
    greedy: bool = True,
    benchmark: str | None = None,
    instruction: str | None = PAPER_INSTRUCTION,
    method: str = "math_verify",
    agent_name: str | None = None,
    batch_size: int | None = None,
    memory_budget: int | None = None,
    seed: int | None = 0,
) -> EvalResult:
    """Evaluates an agent (initial, trained, or restored from a checkpoint) on task items.

    Args:
        agent: Anything ``workbench.agents.generate`` accepts.
        items: The problems.
        k: Sampled responses per item (0: greedy only).
        temperature: Sampling temperature of the k samples.
        max_new_tokens: Response length cap (None: the agent's default).
        greedy: Also generate one greedy response per item (``greedy_acc``).
        benchmark: Name for the ``benchmark`` column (default: each item's ``source``).
        instruction: Appended to each question (`build_prompt`); None for the question alone.
        method: Grading method, a key of `workbench.tasks.rewards.REWARD_METHODS`.
        agent_name: Name for the ``agent`` column (default: ``agent.name``, else the class name).
        batch_size: Rows (responses) per generation batch; None = as many as ``memory_budget`` holds
            (`workbench.agents.plan.memory.generation_rows`, the same model the trainer plans with).
        memory_budget: Bytes a generation batch may use; None = the agent alone on its device.
        seed: Sampling seed of the k samples.

    Returns:
        An `EvalResult` with the tidy samples and the summary.
    """
    if not items:
        raise ValueError("evaluate: items is empty")
    if k < 0 or (k == 0 and not greedy):
        raise ValueError(f"evaluate: k={k} with greedy={greedy} generates nothing; use k >= 1 or greedy=True")
    if k > 0 and temperature <= 0:
        raise ValueError(
            f"evaluate: temperature={temperature} makes the k={k} samples greedy; use greedy=True"
        )
    name = agent_name or getattr(agent, "name", None) or type(agent).__name__
    prompts = [build_prompt(item.question, instruction) for item in items]
    common = {"max_new_tokens": max_new_tokens, "batch_size": batch_size, "memory_budget": memory_budget}
    where = f"{name} eval {benchmark or items[0].source or ''}".rstrip()
    frames = []
    if greedy:
        rollouts = _generate(agent, prompts, 1, temperature=0.0, desc=f"{where} greedy", **common)
        frames.append(_frame(rollouts, items, 1, True, name, benchmark, method))
    if k > 0:
        rollouts = _generate(
            agent, prompts, k, temperature=temperature, seed=seed, desc=f"{where} avg@{k}", **common
        )
        frames.append(_frame(rollouts, items, k, False, name, benchmark, method))
    samples = pd.concat(frames, ignore_index=True)
    return EvalResult(samples=samples, summary=summarize(samples))


def difficulty_metrics(
    agent: str, item_rows: list[dict[str, Any]], difficulty_of: dict[str, str]
) -> dict[str, float]:
    """``eval_difficulty/<value>/acc/<agent>`` (greedy) and ``.../avg@k/<agent>`` of one agent's per-item
    results (`EvalResult.item_rows`) on the main held-out set, per difficulty value of its items (the
    embedded task: the number of operations), with ``eval_difficulty/<value>/items/<agent>``."""
    metrics = {}
    for difficulty, values in accuracy_by_difficulty(item_rows, difficulty_of).items():
        for metric, value in values.items():
            key = "acc" if metric == "greedy_acc" else metric
            metrics[f"eval_difficulty/{difficulty}/{key}/{agent}"] = value
    return metrics
