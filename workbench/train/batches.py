"""A learner's training batch: its own rollouts first, then each other agent's, one row per sample.

`build_learner_batch` gathers, for learner k, every rollout it trains on (self samples first, then each source
in agent order, so the mini-batch index m of Eq. 14 is deterministic), looks up each sample's advantage by its
`RolloutId` in the learner's ``advantages_P_A_G`` and attaches the HACPO cross coefficient ω^(source, k)
(Eq. 10). Token views come from `workbench.agents.forward.sharing.build_training_batch` (self samples keep
their ids, cross samples are re-encoded from text). Each row's old policy is filled in by
`workbench.train.scoring`, the one module that says where old log-probs come from.

Every row carries what the update needs, so the update loop has one path: rows left out
(``train.skip_uniform_groups``) are marked in ``keep_B``, and `plan_micro_batches` spreads the kept rows over
as many mini-batches as the full batch has.

Under ``hacpo.ratio_normalization: bytes`` (beyond the paper) a cross sample's log-likelihoods are both
divided by the UTF-8 byte length of the shared response instead of each side's own token count (``length_B``),
so the learner's and the source's values are on one scale whatever their tokenizers; self samples are
unchanged.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from workbench.agents.forward.agent import Agent
from workbench.agents.forward.sharing import build_training_batch
from workbench.agents.forward.tokens import TokenBatch
from workbench.core.types import Rollout, RolloutId

__all__ = [
    "LearnerBatch",
    "MiniBatch",
    "UpdateSettings",
    "build_learner_batch",
    "plan_micro_batches",
    "update_plan",
]


@dataclass(frozen=True)
class UpdateSettings:
    """How a learner's update cuts, scores and steps through its batch (unpacked from the config by the
    trainer; the loss scalars are `workbench.core.losses.LossParams`)."""

    loss: str = "gspo"
    """Key of ``workbench.core.losses.POLICY_LOSSES``."""
    minibatch_size: int = 64
    """Sequences per optimizer step."""
    micro_batch_size: int = 64
    """Sequences per forward/backward at most."""
    micro_batch_tokens: int | None = None
    """Prompt + response tokens per forward/backward at most (None: sequences alone bound a micro-batch)."""
    temperature: float = 1.0
    """Log-probs are of softmax(logits / temperature), the sampling distribution."""
    kl_coef: float = 0.0
    """low_var_kl coefficient on self samples (0 = no reference pass)."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    skip_uniform_groups: bool = False
    """Leave out the samples of prompts whose advantages are all 0 in the learner's batch; the kept samples
    are spread over as many mini-batches as the full batch has (so the update count stays the same)."""
    cross_old_from_learner: bool = False
    """Take a cross sample's old policy from the learner's own no-grad pass at the start of its update instead
    of the source's shared log-likelihood (the symmetric Naive, ``hacpo.naive_symmetric``)."""
    mask_truncated: bool = False
    """Responses cut by the length cap carry no gradient (``train.mask_truncated``, `build_learner_batch`)."""


@dataclass
class LearnerBatch:
    """One learner's training batch (row b of every field is ``rollouts[b]``); per-row tensors on CPU.

    Attributes:
        learner: The learner's agent index k.
        rollouts: The samples, self first, then each other agent's in agent order.
        tokens: The learner's token view of them.
        advantages_B: Advantage of each sample for this learner (Eq. 6 or Eq. 5).
        is_self_B: True for the learner's own samples.
        cross_coef_B: ω^(source, learner) on cross samples (Eq. 10), 1 elsewhere.
        source_B: Author of each sample.
        old_logp_mean_B: The old log-likelihood per token, set by `workbench.train.scoring.set_old_policy`:
            the learner's own on the rows it scored (``scored_B``), the author's in its own tokenization on
            the others (Eq. 11); per byte of the text for cross rows under bytes normalization (then
            ``length_B`` > 0). NaN until set.
        length_B: The byte length dividing a cross sample's log-likelihoods under bytes normalization; 0
            where the token count does (every self sample, and everything under ``tokens``).
        keep_B: Rows the update trains on (False: left out by ``train.skip_uniform_groups``).
        scored_B: Whose old policy each row's ratio divides by: True where the learner's own no-grad pass
            scored the row (its own rows; the shared ones under the symmetric Naive), False where it is the
            source's shared log-likelihood (Eq. 11).
        old_logp_T: The learner's old token log-probs of each row it scored, None elsewhere.
        ref_logp_T: The KL reference's token log-probs of each row scored with it, None elsewhere.
        sharing_stats: Re-encoding counts (`build_training_batch`).
        order: The rows in the order the mini-batches take them (`plan`); None = row order (own rows
            first). ``hacpo.batch_order: by_prompt`` puts each prompt's own and shared rows together.
        masked_B: Rows that carry no gradient whatever their advantage (``train.mask_truncated``: responses
            cut by the length cap); never forwarded, their advantage is 0.
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
    keep_B: torch.Tensor
    scored_B: torch.Tensor
    old_logp_T: list[torch.Tensor | None]
    ref_logp_T: list[torch.Tensor | None]
    sharing_stats: dict[str, float] = field(default_factory=dict)
    order: list[int] | None = None
    masked_B: torch.Tensor | None = None

    @property
    def ids(self) -> list[RolloutId]:
        """The identity of each row."""
        return [r.id for r in self.rollouts]

    def __len__(self) -> int:
        return len(self.rollouts)

    @staticmethod
    def token_view(
        per_row: list[torch.Tensor | None], rows: list[int], view: TokenBatch
    ) -> torch.Tensor | None:
        """Per-row token log-probs of ``rows`` laid out like ``view``'s ``(B, T - 1)`` log-probs (zeros past
        each row's end); None unless every row has them."""
        parts_T = [per_row[r] for r in rows]
        if any(p is None for p in parts_T):
            return None
        out_B_T = parts_T[0].new_zeros((len(rows), view.input_ids_B_T.shape[1] - 1))
        for b, row_T in enumerate(parts_T):
            out_B_T[b, : len(row_T)] = row_T
        return out_B_T

    def plan(
        self,
        minibatch_size: int,
        micro_batch_size: int,
        micro_batch_tokens: int | None = None,
        *,
        kl_on_self: bool = False,
    ) -> list[MiniBatch]:
        """`plan_micro_batches` of the kept rows, over as many mini-batches as the full batch has.

        A kept row whose advantage is exactly 0 adds nothing to the policy loss (every loss multiplies its
        objective by the advantage) and is not forwarded, but still counts in its mini-batch's mean; with a
        KL term (``kl_on_self``) the learner's own rows are forwarded whatever their advantage.
        """
        order = self.order if self.order is not None else range(len(self))
        kept = [r for r in order if self.keep_B[r]]
        forward_B = (self.advantages_B != 0) | (self.is_self_B & kl_on_self)
        if self.masked_B is not None:
            forward_B &= ~self.masked_B  # no term at all: not even the KL one
        lengths_B = self.tokens.attention_mask_B_T.sum(dim=-1)
        return plan_micro_batches(
            kept,
            math.ceil(len(self) / minibatch_size),
            micro_batch_size,
            micro_batch_tokens=micro_batch_tokens,
            length_B=lengths_B.tolist(),
            forward_B=forward_B.tolist(),
        )


def update_plan(batch: LearnerBatch, settings: UpdateSettings) -> list[MiniBatch]:
    """The mini-batches and micro-batches of ``batch`` under the update's sizes (`LearnerBatch.plan`; own rows
    are forwarded whatever their advantage when a KL term needs them)."""
    return batch.plan(
        settings.minibatch_size,
        settings.micro_batch_size,
        settings.micro_batch_tokens,
        kl_on_self=settings.kl_coef > 0,
    )


@dataclass(frozen=True)
class MiniBatch:
    """One optimizer step of a learner's update.

    Attributes:
        micro_batches: The rows forwarded, one forward/backward per list.
        size: The rows the loss averages over: those forwarded and those left unforwarded because they add
            nothing to the loss (advantage 0).
    """

    micro_batches: list[list[int]]
    size: int


def plan_micro_batches(
    rows: Sequence[int],
    n_minibatches: int,
    micro_batch_size: int,
    *,
    micro_batch_tokens: int | None = None,
    length_B: Sequence[int] | None = None,
    forward_B: Sequence[bool] | None = None,
) -> list[MiniBatch]:
    """``rows`` spread evenly over ``n_minibatches`` mini-batches, each cut into micro-batches.

    Mini-batch m (one optimizer step; the stepwise bound of Eq. 14 counts them) holds the rows at positions
    ``[round(m·n/M), round((m+1)·n/M))`` of ``rows`` (n rows, M = min(n_minibatches, n) mini-batches, none
    empty); when the full batch is kept and M divides it, that is rows ``[m·size, (m+1)·size)``. Its rows
    with ``forward_B`` False are counted in its ``size`` but not forwarded. The others are cut, in order,
    into micro-batches of at most ``micro_batch_size`` rows and, with ``micro_batch_tokens``, at most that
    many tokens (``length_B``: each row's prompt + response tokens; a longer row goes alone). A learner's
    own rows and other agents' rows share micro-batches.

    >>> [mb.micro_batches for mb in plan_micro_batches(range(8), 2, 3)]
    [[[0, 1, 2], [3]], [[4, 5, 6], [7]]]
    >>> [mb.micro_batches for mb in plan_micro_batches(range(6), 1, 6, micro_batch_tokens=5,
    ...                                                length_B=[2, 2, 2, 6, 1, 1])]
    [[[0, 1], [2], [3], [4, 5]]]
    """
    rows = list(rows)
    if not rows:
        return []
    count = max(1, min(n_minibatches, len(rows)))
    bounds = [round(i * len(rows) / count) for i in range(count + 1)]
    plan = []
    for start, stop in itertools.pairwise(bounds):
        chunk = rows[start:stop]
        micro_batches: list[list[int]] = []
        tokens = 0
        for row in chunk:
            if forward_B is not None and not forward_B[row]:
                continue
            length = length_B[row] if length_B is not None else 0
            full = micro_batches and (
                len(micro_batches[-1]) >= micro_batch_size
                or (micro_batch_tokens is not None and tokens + length > micro_batch_tokens)
            )
            if not micro_batches or full:
                micro_batches.append([])
                tokens = 0
            micro_batches[-1].append(row)
            tokens += length
        plan.append(MiniBatch(micro_batches, len(chunk)))
    return plan


def _informative_B(rollouts: list[Rollout], advantages_B: torch.Tensor) -> torch.Tensor:
    """Rows of every prompt with a non-zero advantage somewhere in the batch (``skip_uniform_groups``).

    A prompt whose rewards are all equal (in the learner's own group, or the joint group when sharing) has
    advantage 0 on every sample: such samples carry no gradient but dilute the mini-batch mean.
    """
    informative = {r.prompt_index for r, a in zip(rollouts, advantages_B.tolist()) if a != 0.0}
    return torch.tensor([r.prompt_index in informative for r in rollouts], dtype=torch.bool)


def build_learner_batch(
    agent: Agent,
    learner: int,
    own: list[Rollout],
    cross: list[Rollout],
    advantages_P_A_G: torch.Tensor,
    coef_A: torch.Tensor,
    *,
    ratio_normalization: str = "tokens",
    batch_order: str = "own_first",
    skip_uniform_groups: bool = False,
    mask_truncated: bool = False,
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
        batch_order: ``own_first`` (the rows' order) or ``by_prompt`` (each prompt's own rows, then its
            shared rows by source, prompt after prompt; ``LearnerBatch.order``).
        skip_uniform_groups: Leave out the rows of prompts whose advantages are all 0 (``keep_B``).
        mask_truncated: Rows whose response was cut by its author's length cap (finish reason ``length``)
            get advantage 0 and are never forwarded (``masked_B``): their loss terms, policy and KL, are 0;
            they still count in their mini-batch's mean, as TRL's ``mask_truncated_completions``.

    Returns:
        The `LearnerBatch`, its old policy not yet set (`workbench.train.scoring.set_old_policy`).
    """
    if any(r.author != learner for r in own) or any(r.author == learner for r in cross):
        raise ValueError(
            f"learner {learner}: own rollouts must be its own and cross rollouts another agent's"
        )
    if ratio_normalization not in ("tokens", "bytes"):
        raise ValueError(f"ratio_normalization = {ratio_normalization!r} is not allowed: 'tokens' or 'bytes'")
    if batch_order not in ("own_first", "by_prompt"):
        raise ValueError(f"batch_order = {batch_order!r} is not allowed: 'own_first' or 'by_prompt'")
    rollouts = own + cross
    tokens, sharing_stats = build_training_batch(agent, rollouts, learner)
    # HACPO: (beyond the paper) bytes put a shared text's two log-likelihoods on one length scale.
    by_bytes = ratio_normalization == "bytes"
    length_B = torch.tensor(
        [
            float(max(1, len(r.text.encode("utf-8")))) if by_bytes and r.author != learner else 0.0
            for r in rollouts
        ]
    )
    source_B = torch.tensor([r.author for r in rollouts], dtype=torch.long)
    advantages_B = advantages_P_A_G[
        torch.tensor([r.prompt_index for r in rollouts], dtype=torch.long),
        source_B,
        torch.tensor([r.index for r in rollouts], dtype=torch.long),
    ]
    is_self_B = source_B == learner
    masked_B = None
    if mask_truncated:
        masked_B = torch.tensor([r.finish_reason == "length" for r in rollouts], dtype=torch.bool)
        advantages_B = torch.where(masked_B, 0.0, advantages_B)
    return LearnerBatch(
        learner=learner,
        rollouts=rollouts,
        tokens=tokens,
        advantages_B=advantages_B,
        is_self_B=is_self_B,
        # HACPO: a cross sample's loss is scaled by ω^(source, learner) (Eq. 10).
        cross_coef_B=torch.where(is_self_B, 1.0, coef_A.float().cpu()[source_B]),
        source_B=source_B,
        old_logp_mean_B=torch.full((len(rollouts),), math.nan),
        length_B=length_B,
        keep_B=_informative_B(rollouts, advantages_B)
        if skip_uniform_groups
        else torch.ones(len(rollouts), dtype=torch.bool),
        scored_B=torch.zeros(len(rollouts), dtype=torch.bool),
        old_logp_T=[None] * len(rollouts),
        ref_logp_T=[None] * len(rollouts),
        sharing_stats={key: float(v) for key, v in sharing_stats.items()},
        # HACPO: (the authors' main branch) by prompt, every mini-batch mixes own and shared rows.
        order=sorted(range(len(rollouts)), key=lambda b: rollouts[b].prompt_index)
        if batch_order == "by_prompt"
        else None,
        masked_B=masked_B,
    )
