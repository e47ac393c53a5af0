"""A learner's training batch: its own rollouts first, then each other agent's, indexed by rollout identity.

`build_learner_batch` gathers, for learner k, every rollout it trains on (self samples first, then
each source in agent order, so the mini-batch index m of Eq. 14 is deterministic), looks up each sample's
advantage by its `RolloutId` in the learner's ``advantages_P_A_G``, and attaches the HACPO cross
coefficient ω^(source, k) (Eq. 10). Token views come from `workbench.agents.sharing.build_training_batch`
(self samples keep their ids, cross samples are re-encoded from text).

Under ``hacpo.ratio_normalization: bytes`` (beyond the paper) a cross sample's log-likelihoods are both
divided by the UTF-8 byte length of the shared response instead of each side's own token count, so the
learner's and the source's values are on one scale whatever their tokenizers; self samples are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from workbench.agents.agent import Agent
from workbench.agents.sharing import build_training_batch
from workbench.agents.tokens import TokenBatch
from workbench.core.types import Rollout, RolloutId

__all__ = ["LearnerBatch", "build_learner_batch"]


@dataclass
class LearnerBatch:
    """One learner's training batch (row b of every tensor is ``rollouts[b]``), on CPU.

    Attributes:
        learner: The learner's agent index k.
        rollouts: The samples, self first, then each other agent's in agent order.
        tokens: The learner's token view of them.
        advantages_B: Advantage of each sample for this learner (Eq. 6 or Eq. 5).
        is_self_B: True for the learner's own samples.
        cross_coef_B: ω^(source, learner) on cross samples (Eq. 10), 1 elsewhere.
        source_B: Author of each sample.
        old_logp_mean_B: The author's old log-likelihood per token of its own tokenization, or per byte
            of the text for cross samples under bytes normalization (then ``length_B`` > 0).
        length_B: The byte length dividing a cross sample's log-likelihoods under bytes normalization; 0
            where the token count does (every self sample, and everything under ``tokens``).
        sharing_stats: Re-encoding counts (`build_training_batch`).
    """

    learner: int
    rollouts: list[Rollout]
    tokens: TokenBatch
    advantages_B: torch.Tensor
    is_self_B: torch.Tensor
    cross_coef_B: torch.Tensor
    source_B: torch.Tensor
    old_logp_mean_B: torch.Tensor
    length_B: torch.Tensor
    sharing_stats: dict[str, float] = field(default_factory=dict)

    @property
    def ids(self) -> list[RolloutId]:
        """The identity of each row."""
        return [r.id for r in self.rollouts]

    def __len__(self) -> int:
        return len(self.rollouts)

    def select(self, rows: list[int]) -> LearnerBatch:
        """The batch restricted to ``rows`` (in that order; self rows must stay first)."""
        index_B = torch.tensor(rows, dtype=torch.long)
        return LearnerBatch(
            learner=self.learner,
            rollouts=[self.rollouts[b] for b in rows],
            tokens=self.tokens.select(index_B),
            advantages_B=self.advantages_B[index_B],
            is_self_B=self.is_self_B[index_B],
            cross_coef_B=self.cross_coef_B[index_B],
            source_B=self.source_B[index_B],
            old_logp_mean_B=self.old_logp_mean_B[index_B],
            length_B=self.length_B[index_B],
            sharing_stats=self.sharing_stats,
        )

    def informative_rows(self) -> list[int]:
        """Rows of every prompt with a non-zero advantage somewhere in this batch (``skip_uniform_groups``).

        A prompt whose rewards are all equal (in the learner's own group, or the joint group when sharing)
        has advantage 0 on every sample: such samples carry no gradient but dilute the mini-batch mean.
        """
        informative = {r.prompt_index for r, a in zip(self.rollouts, self.advantages_B.tolist()) if a != 0.0}
        return [b for b, r in enumerate(self.rollouts) if r.prompt_index in informative]


def build_learner_batch(
    agent: Agent,
    learner: int,
    own: list[Rollout],
    cross: list[Rollout],
    advantages_P_A_G: torch.Tensor,
    coef_A: torch.Tensor,
    *,
    ratio_normalization: str = "tokens",
) -> LearnerBatch:
    """Learner ``learner``'s batch over its own rollouts, then the other agents' (``cross``).

    Args:
        agent: The learner (its tokenizer re-encodes cross samples).
        learner: Its agent index k.
        own: Its own rollouts of this step, with their token ids.
        cross: The other agents' rollouts it trains on (text and scalars; empty when nothing is shared),
            grouped by author in agent order (the driver sends them so).
        advantages_P_A_G: ``[p, a, g]`` = this learner's advantage of rollout ``RolloutId(a, p, g)``.
        coef_A: The loss coefficient of samples authored by each agent (ω^(a, k) for HACPO, else ones);
            the learner's own entry is ignored (self samples get 1).
        ratio_normalization: ``tokens`` (Eq. 25, each side's own token count) or ``bytes``.

    Returns:
        The `LearnerBatch`.
    """
    if any(r.author != learner for r in own) or any(r.author == learner for r in cross):
        raise ValueError(
            f"learner {learner}: own rollouts must be its own and cross rollouts another agent's"
        )
    if ratio_normalization not in ("tokens", "bytes"):
        raise ValueError(f"ratio_normalization = {ratio_normalization!r} is not allowed: 'tokens' or 'bytes'")
    rollouts = own + cross
    tokens, sharing_stats = build_training_batch(agent, rollouts, learner)
    # HACPO (beyond the paper): bytes put a shared text's two log-likelihoods on one length scale.
    by_bytes = ratio_normalization == "bytes"
    length_B = torch.tensor(
        [
            float(max(1, len(r.text.encode("utf-8")))) if by_bytes and r.author != learner else 0.0
            for r in rollouts
        ]
    )
    old_mean_B = torch.tensor(
        [r.old_logp_sum / n if n > 0 else r.old_logp_mean for r, n in zip(rollouts, length_B.tolist())],
        dtype=torch.float32,
    )
    return LearnerBatch(
        learner=learner,
        rollouts=rollouts,
        tokens=tokens,
        advantages_B=torch.stack([advantages_P_A_G[r.prompt_index, r.author, r.index] for r in rollouts]),
        is_self_B=torch.tensor([r.author == learner for r in rollouts]),
        cross_coef_B=torch.tensor(
            [1.0 if r.author == learner else coef_A[r.author].item() for r in rollouts]
        ),
        source_B=torch.tensor([r.author for r in rollouts]),
        old_logp_mean_B=old_mean_B,
        length_B=length_B,
        sharing_stats={key: float(v) for key, v in sharing_stats.items()},
    )
