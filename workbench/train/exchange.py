"""What crosses the boundary between the driver (Algorithm 1) and an agent's worker: text and scalars.

The paper's exchange is tokenizer-neutral (Sec. 2, Sec. 3.3): agents share response *text*, rewards and the
source's old sequence log-likelihood. A worker keeps its own rollouts' token ids (its learner trains on them
exactly as sampled); the driver and the other learners see a `SharedRollout`, which has no token ids. The same
records are used in-process and across Ray actors, so the in-process path exercises the same discipline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.core.types import Rollout, RolloutId

__all__ = ["RolloutReport", "SharedRollout", "UpdateReport", "as_cross_rollout", "share"]


@dataclass
class SharedRollout:
    """A rollout as the driver and the other learners see it (`Rollout` without token ids).

    Attributes:
        prompt_index: Index of the prompt in the step's batch.
        author: Agent index of the author.
        index: Which of the author's responses to that prompt.
        prompt: The user content (question + instruction, unformatted).
        text: The decoded response (special tokens skipped, terminal EOS stripped).
        finish_reason: ``"eos"`` or ``"length"``.
        length: Response length in the author's tokens.
        old_logp_sum: The author's old-policy log-likelihood of the response, in its own tokenization.
        old_logp_count: The number of tokens in that sum.
        reward: Verified reward (set by the driver after grading).
        grade_reason: Why the grader gave that reward.
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

    A learner re-encodes a cross sample from its text (`workbench.agents.sharing.reencode_response`), so the
    author's ids are never needed; empty id lists make any accidental use visible.
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
class RolloutReport:
    """What a worker's rollout phase returns: its scored rollouts and how long each part took."""

    rollouts: list[SharedRollout]
    generate_s: float
    score_s: float


@dataclass
class UpdateReport:
    """What a learner's update returns: its flat metrics and, per sample, what the samples log records.

    Attributes:
        metrics: ``learner_metrics`` of the learner (``is/…``, ``loss/…``, ``adv/…``, ``cost/…``).
        samples: For each trained sample: advantage, ratio, lower and upper clip bounds.
    """

    metrics: dict[str, float]
    samples: dict[RolloutId, dict[str, float]] = field(default_factory=dict)
