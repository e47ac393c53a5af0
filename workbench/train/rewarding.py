"""Step 2 of Algorithm 1: every response of the step graded, and the reward the advantages are of.

Two quantities, kept apart (``docs/config.md``, ``task.reward`` and ``task.rewards``):

- **accuracy**, by ``task.reward`` (1 or 0 for the built-in graders): ``train/acc/<agent>``, the capability
  P̂ (Eq. 9) and so ω; the same grader scores every evaluation;
- **the trained reward**: the weighted sum of ``task.rewards`` (TRL's ``reward_funcs`` and
  ``reward_weights``, `workbench.tasks.reward_terms`), or the accuracy itself when that list is empty (the
  paper's setting). The advantages, hence what HACPO shares, are of it.

A function listed in ``task.rewards`` that is ``task.reward`` itself reuses its grades.

| key | meaning |
|---|---|
| ``reward/<agent>/<name>/mean``, ``/std`` | one function's value over the agent's responses it applies to |
| ``reward/<agent>/total/mean``, ``/std`` | the weighted sum the advantages are of |
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from workbench.config.sections import TaskConfig
from workbench.core.types import TaskItem
from workbench.tasks.reward_terms import columns, score_term
from workbench.tasks.rewards import grade_batch
from workbench.train.exchange import SharedRollout

__all__ = ["StepRewards", "grade_step"]


@dataclass
class StepRewards:
    """A step's grades: ``[p, a, g]`` = agent a's g-th response to prompt p."""

    accuracy_P_A_G: torch.Tensor
    """``task.reward`` of each response (P̂ and ``train/acc``)."""
    rewards_P_A_G: torch.Tensor
    """The reward the advantages are of: the weighted sum of ``task.rewards``, else the accuracy."""
    metrics: dict[str, float] = field(default_factory=dict)
    """``reward/<agent>/<name>/mean`` and ``/std`` (with ``task.rewards`` only)."""


def grade_step(
    task: TaskConfig,
    max_new_tokens: int,
    names: list[str],
    rollouts_A: list[list[SharedRollout]],
    items: list[TaskItem],
    P: int,
    G: int,
) -> StepRewards:
    """Grades every rollout; sets each one's ``reward`` (the trained reward), ``grade_reason`` (accuracy's)
    and, with ``task.rewards``, ``reward_terms`` (each function's value).

    Raises:
        RewardFunctionError: A function of ``task.rewards`` failed on an item (named); nothing is set.
    """
    flat = [r for rollouts in rollouts_A for r in rollouts]
    texts = [r.text for r in flat]
    grades = grade_batch(texts, [items[r.prompt_index].answer for r in flat], task.reward)
    accuracy_P_A_G = torch.zeros(P, len(rollouts_A), G)
    for rollout, grade in zip(flat, grades):
        accuracy_P_A_G[rollout.prompt_index, rollout.author, rollout.index] = grade.reward
    if not task.rewards:
        for rollout, grade in zip(flat, grades):
            rollout.reward, rollout.grade_reason = grade.reward, grade.reason
        return StepRewards(accuracy_P_A_G, accuracy_P_A_G)
    cols = [columns(items[r.prompt_index], r.prompt, r.length, r.finish_reason, max_new_tokens) for r in flat]
    where = [
        f"item {items[r.prompt_index].id!r} (prompt {r.prompt_index}), response {r.index} of agent "
        f"{names[r.author]!r}"
        for r in flat
    ]
    values = {
        spec.name: [g.reward for g in grades]
        if spec.fn == task.reward
        else score_term(spec.fn, spec.name, texts, cols, where)
        for spec in task.rewards
    }
    rewards_P_A_G = torch.zeros(P, len(rollouts_A), G)
    for i, (rollout, grade) in enumerate(zip(flat, grades)):
        terms = {spec.name: values[spec.name][i] for spec in task.rewards}
        total = sum(spec.weight * terms[spec.name] for spec in task.rewards if terms[spec.name] is not None)
        rollout.reward, rollout.grade_reason, rollout.reward_terms = float(total), grade.reason, terms
        rewards_P_A_G[rollout.prompt_index, rollout.author, rollout.index] = rollout.reward
    return StepRewards(accuracy_P_A_G, rewards_P_A_G, _metrics(names, flat, task))


def _metrics(names: list[str], flat: list[SharedRollout], task: TaskConfig) -> dict[str, float]:
    """Mean and std (Bessel; 0 for one value) of each function and of the sum, per agent, over the responses
    a function applies to (None: left out; a function applying to none of an agent's responses: no key)."""
    metrics = {}
    for a, name in enumerate(names):
        own = [r for r in flat if r.author == a]
        series = {spec.name: [r.reward_terms[spec.name] for r in own] for spec in task.rewards}
        series["total"] = [r.reward for r in own]
        for term, raw in series.items():
            values = torch.tensor([v for v in raw if v is not None], dtype=torch.float64)
            if values.numel():
                metrics[f"reward/{name}/{term}/mean"] = values.mean().item()
                metrics[f"reward/{name}/{term}/std"] = values.std().item() if values.numel() > 1 else 0.0
    return metrics
