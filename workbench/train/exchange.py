"""What crosses the boundary between the driver (Algorithm 1) and an agent's worker: text and scalars.

The paper's exchange is tokenizer-neutral (Sec. 2, Sec. 3.3): agents share response *text*, rewards and the
source's old sequence log-likelihood. A worker keeps its own rollouts' token ids (its learner trains on them
exactly as sampled); the driver and the other learners see a `SharedRollout`, which has no token ids. The same
records are used in-process and across Ray actors, so the in-process path exercises the same discipline.

One request and one report per worker call (`workbench.train.executors.Executor`):

| call | request | report |
|---|---|---|
| ``rollout`` | `RolloutRequest`: prompts, G, seed | `RolloutReport`: scored `SharedRollout` s, phase times |
| ``update`` | `UpdateRequest`: cross rollouts, advantages, ω | `UpdateReport`: metrics, per-sample ratios |
| ``evaluate`` | `EvalRequest`: held-out items, caps, grader | `EvalReport`: rows of the two evaluation CSVs |
| ``state_dict`` | | `WorkerState`: trainable weights, optimizer state |
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.core.types import Rollout, RolloutId, TaskItem

__all__ = [
    "EvalReport",
    "EvalRequest",
    "RolloutReport",
    "RolloutRequest",
    "SharedRollout",
    "UpdateReport",
    "UpdateRequest",
    "WorkerState",
    "as_cross_rollout",
    "share",
]


@dataclass
class SharedRollout:
    """A rollout as the driver and the other learners see it (`Rollout` without token ids).

    Attributes:
        prompt_index: Index of the prompt in the step's batch.
        author: Agent index of the author.
        index: Which of the author's responses to that prompt.
        prompt: The user content (question + instruction, unformatted).
        text: The decoded response (special tokens skipped, terminal EOS stripped).
        finish_reason: ``"eos"``, ``"stop"`` or ``"length"``.
        length: Response length in the author's tokens.
        old_logp_sum: The author's old-policy log-likelihood of the response, in its own tokenization.
        old_logp_count: The number of tokens in that sum.
        reward: The reward its advantages are of (set by the driver after grading): ``task.reward``'s, or the
            weighted sum of ``task.rewards``.
        grade_reason: Why ``task.reward``'s grader gave its accuracy.
        reward_terms: With ``task.rewards``, each function's value (None: not applicable).
    """

    prompt_index: int
    author: int
    index: int
    prompt: str
    text: str
    finish_reason: str
    length: int
    old_logp_sum: float
    old_logp_count: int
    reward: float = float("nan")
    grade_reason: str = ""
    reward_terms: dict[str, float | None] = field(default_factory=dict)

    @property
    def id(self) -> RolloutId:
        """``RolloutId(author, prompt_index, index)``."""
        return RolloutId(self.author, self.prompt_index, self.index)


def share(rollout: Rollout) -> SharedRollout:
    """The shareable part of a scored rollout (its author keeps the token ids)."""
    return SharedRollout(
        prompt_index=rollout.prompt_index,
        author=rollout.author,
        index=rollout.index,
        prompt=rollout.prompt,
        text=rollout.text,
        finish_reason=rollout.finish_reason,
        length=rollout.length,
        old_logp_sum=rollout.old_logp_sum,
        old_logp_count=rollout.old_logp_count,
    )


def as_cross_rollout(shared: SharedRollout) -> Rollout:
    """Another agent's rollout as a learner holds it: text and scalars, no token ids.

    A learner re-encodes a cross sample from its text (`workbench.agents.forward.sharing.reencode_response`),
    so the author's ids are never needed; empty id lists make any accidental use visible.
    """
    return Rollout(
        prompt_index=shared.prompt_index,
        author=shared.author,
        index=shared.index,
        prompt=shared.prompt,
        text=shared.text,
        prompt_ids=[],
        response_ids=[],
        finish_reason=shared.finish_reason,
        reward=shared.reward,
        old_logp_sum=shared.old_logp_sum,
        old_logp_count=shared.old_logp_count,
        grade_reason=shared.grade_reason,
    )


@dataclass
class RolloutRequest:
    """Phase 1 for one agent: answer every prompt G times with the current (= old) policy, then score."""

    prompts: list[str]
    """The step's prompts (user contents, unformatted)."""
    n: int
    """Responses per prompt (G, times the method's group multiplier)."""
    seed: int
    """Sampling seed of this agent and step."""


@dataclass
class RolloutReport:
    """What a worker's rollout phase returns: its scored rollouts and how long each part took."""

    rollouts: list[SharedRollout]
    generate_s: float
    score_s: float


@dataclass
class UpdateRequest:
    """Phase 5 for one learner: what it trains on besides its own rollouts, and how each sample counts."""

    cross: list[SharedRollout]
    """Other agents' rollouts to train on, grouped by author in agent order (empty: no sharing)."""
    advantages_P_A_G: torch.Tensor
    """This learner's advantage of every rollout of the step (``[p, a, g]``: agent a's g-th answer to p)."""
    coef_A: torch.Tensor
    """Loss coefficient of each author's samples: ω^(a, learner) (Eq. 10) or ones."""
    where: str = ""
    """Names the step and learner in a non-finite-loss error."""


@dataclass
class UpdateReport:
    """What a learner's update returns: its flat metrics and, per sample, what the samples log records.

    Attributes:
        metrics: ``learner_metrics`` of the learner (``is/…``, ``loss/…``, ``adv/…``, ``cost/…``).
        samples: For each trained sample: advantage, ratio, lower and upper clip bounds.
    """

    metrics: dict[str, float]
    samples: dict[RolloutId, dict[str, float]] = field(default_factory=dict)


@dataclass
class EvalRequest:
    """One held-out set for every agent (`workbench.train.evaluate.evaluate` arguments)."""

    items: list[TaskItem]
    """The held-out problems."""
    benchmark: str
    """The ``benchmark`` column of the rows."""
    max_new_tokens: int
    """Response cap."""
    instruction: str | None
    """Appended to each question; None = the bare question."""
    reward: str
    """Grader (``task.reward``)."""
    k: int = 0
    """Sampled responses per item (avg@k); 0 = greedy only."""
    temperature: float = 1.0
    """Sampling temperature of the k samples."""


@dataclass
class EvalReport:
    """One agent's results on one held-out set.

    Attributes:
        rows: Summary rows for ``evals.csv`` (``agent, benchmark, metric, value``).
        values: ``{"greedy_acc": ..., "avg@k": ...}``.
        item_rows: Per-item rows for ``eval_items.csv`` (`workbench.train.evaluate.EvalResult.item_rows`).
    """

    rows: list[dict[str, Any]]
    values: dict[str, float]
    item_rows: list[dict[str, Any]]


@dataclass
class WorkerState:
    """A worker's part of a checkpoint, on CPU: the agent's trainable weights, its optimizer state and its
    learning-rate schedule's state (plain values; empty in checkpoints written before schedules)."""

    agent: dict[str, Any]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any] = field(default_factory=dict)
