"""A learner's training batch: its own rollouts first, then each other agent's, one row per sample.

`build_learner_batch` gathers, for learner k, every rollout it trains on (self samples first, then each source
in agent order, so the mini-batch index m of Eq. 14 is deterministic), looks up each sample's advantage by its
`RolloutId` in the learner's ``advantages_P_A_G``, attaches the HACPO cross coefficient ω^(source, k)
(Eq. 10) and each row's old log-probs: the learner's own on self rows (its no-grad pass,
`workbench.train.update.score_self`), the source's shared sequence log-likelihood on cross rows. Token views
come from `workbench.agents.sharing.build_training_batch` (self samples keep their ids, cross samples are
re-encoded from text).

Every row carries what the update needs, so the update loop has one path: rows left out
(``train.skip_uniform_groups``) are marked in ``keep_B``, and `plan_micro_batches` spreads the kept rows over
as many mini-batches as the full batch has.

Under ``hacpo.ratio_normalization: bytes`` (beyond the paper) a cross sample's log-likelihoods are both
divided by the UTF-8 byte length of the shared response instead of each side's own token count, so the
learner's and the source's values are on one scale whatever their tokenizers; self samples are unchanged.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from workbench.agents.agent import Agent
from workbench.agents.sharing import build_training_batch
from workbench.agents.tokens import TokenBatch
from workbench.core.losses import PolicyBatch, length_normalized_logp
from workbench.core.types import Rollout, RolloutId

__all__ = ["LearnerBatch", "MiniBatch", "OldScores", "build_learner_batch", "plan_micro_batches"]


@dataclass
class OldScores:
    """The learner's no-grad pass over some rows, before any update of the step (one entry per scored row).

    Attributes:
        rows: The rows scored, in the order scored.
        logp_T: Each row's old token log-probs, aligned like `workbench.agents.rollout.token_logprobs` over
            the row's real tokens (its length is the row's token count − 1), on the learner's device.
        ref_logp_T: The KL reference's, likewise; None when no reference pass ran.
        mean_B: Each row's old log-likelihood per token (per byte where ``length_B`` said so), float32.
        sums: Each row's summed old log-probs (float64, as Python floats): what an author shares.
        counts: Each row's number of response tokens.
    """

    rows: list[int]
    logp_T: list[torch.Tensor]
    ref_logp_T: list[torch.Tensor] | None
    mean_B: torch.Tensor
    sums: list[float]
    counts: list[int]


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
        old_logp_mean_B: The old log-likelihood per token: the learner's own on self rows (its no-grad
            pass), the author's in its own tokenization on cross rows (Eq. 11); per byte of the text for
            cross rows under bytes normalization (then ``length_B`` > 0).
        length_B: The byte length dividing a cross sample's log-likelihoods under bytes normalization; 0
            where the token count does (every self sample, and everything under ``tokens``).
        keep_B: Rows the update trains on (False: left out by ``train.skip_uniform_groups``).
        old_logp_T: The learner's old token log-probs of each row it scored (`OldScores.logp_T`), None
            elsewhere (cross rows: their old policy is the source's, Eq. 11).
        ref_logp_T: The KL reference's token log-probs of each row scored with it, None elsewhere.
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
    keep_B: torch.Tensor
    old_logp_T: list[torch.Tensor | None]
    ref_logp_T: list[torch.Tensor | None]
    sharing_stats: dict[str, float] = field(default_factory=dict)

    @property
    def ids(self) -> list[RolloutId]:
        """The identity of each row."""
        return [r.id for r in self.rollouts]

    def __len__(self) -> int:
        return len(self.rollouts)

    def set_old_scores(self, scores: OldScores) -> None:
        """Take the learner's own old log-probs (and reference) of the rows ``scores`` covers."""
        for i, row in enumerate(scores.rows):
            self.old_logp_T[row] = scores.logp_T[i]
            self.ref_logp_T[row] = scores.ref_logp_T[i] if scores.ref_logp_T is not None else None
        self.old_logp_mean_B[scores.rows] = scores.mean_B.cpu()

    def policy_batch(
        self, rows: list[int], view: TokenBatch, logp_B_T: torch.Tensor, mask_B_T: torch.Tensor, m: int
    ) -> PolicyBatch:
        """The loss input of micro-batch ``rows`` (token view ``view``) in mini-batch ``m``, on the learner's
        device: its current log-probs ``logp_B_T`` and each row's advantage, coefficient and old log-probs.

        In mini-batch 0 no optimizer step has been taken yet: the old policy of the rows the learner scored
        itself (its own rows; shared rows under the symmetric Naive) is its current one, so their old
        log-probs are the current ones, detached (s = 1 exactly, whatever micro-batch they were scored in).
        """
        device, index_B = logp_B_T.device, torch.tensor(rows, dtype=torch.long)
        length_B = self.length_B[index_B].to(device)
        old_mean_B = self.old_logp_mean_B[index_B].to(device)
        old_B_T = self.token_view(self.old_logp_T, rows, view)
        if m == 0:
            scored_B = torch.tensor([self.old_logp_T[r] is not None for r in rows], device=device)
            current_B_T = logp_B_T.detach()
            old_mean_B = torch.where(
                scored_B, length_normalized_logp(current_B_T, mask_B_T, length_B), old_mean_B
            )
            if old_B_T is not None:
                old_B_T = current_B_T
        return PolicyBatch(
            logp_B_T=logp_B_T,
            mask_B_T=mask_B_T,
            old_logp_mean_B=old_mean_B,
            advantages_B=self.advantages_B[index_B].to(device),
            is_self_B=self.is_self_B[index_B].to(device),
            cross_coef_B=self.cross_coef_B[index_B].to(device),
            minibatch_index=m,
            old_logp_B_T=old_B_T,
            length_B=length_B,
        )

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
        kept = self.keep_B.nonzero().flatten().tolist()
        forward_B = (self.advantages_B != 0) | (self.is_self_B & kl_on_self)
        lengths_B = self.tokens.attention_mask_B_T.sum(dim=-1)
        return plan_micro_batches(
            kept,
            math.ceil(len(self) / minibatch_size),
            micro_batch_size,
            micro_batch_tokens=micro_batch_tokens,
            length_B=lengths_B.tolist(),
            forward_B=forward_B.tolist(),
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
    own_scores: OldScores,
    *,
    ratio_normalization: str = "tokens",
    skip_uniform_groups: bool = False,
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
        own_scores: `workbench.train.update.score_self` of ``own``, before any update of the step.
        ratio_normalization: ``tokens`` (Eq. 25, each side's own token count) or ``bytes``.
        skip_uniform_groups: Leave out the rows of prompts whose advantages are all 0 (``keep_B``).

    Returns:
        The `LearnerBatch`.
    """
    if any(r.author != learner for r in own) or any(r.author == learner for r in cross):
        raise ValueError(
            f"learner {learner}: own rollouts must be its own and cross rollouts another agent's"
        )
    if ratio_normalization not in ("tokens", "bytes"):
        raise ValueError(f"ratio_normalization = {ratio_normalization!r} is not allowed: 'tokens' or 'bytes'")
    if own_scores.rows != list(range(len(own))):
        raise ValueError(f"own_scores cover rows {own_scores.rows}, not the {len(own)} own rollouts in order")
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
    # HACPO: a cross sample's old policy is its source's: the shared log-likelihood (Eq. 11).
    old_mean_B = torch.tensor(
        [r.old_logp_sum / n if n > 0 else r.old_logp_mean for r, n in zip(rollouts, length_B.tolist())],
        dtype=torch.float32,
    )
    source_B = torch.tensor([r.author for r in rollouts], dtype=torch.long)
    advantages_B = advantages_P_A_G[
        torch.tensor([r.prompt_index for r in rollouts], dtype=torch.long),
        source_B,
        torch.tensor([r.index for r in rollouts], dtype=torch.long),
    ]
    is_self_B = source_B == learner
    batch = LearnerBatch(
        learner=learner,
        rollouts=rollouts,
        tokens=tokens,
        advantages_B=advantages_B,
        is_self_B=is_self_B,
        # HACPO: a cross sample's loss is scaled by ω^(source, learner) (Eq. 10).
        cross_coef_B=torch.where(is_self_B, 1.0, coef_A.float().cpu()[source_B]),
        source_B=source_B,
        old_logp_mean_B=old_mean_B,
        length_B=length_B,
        keep_B=_informative_B(rollouts, advantages_B)
        if skip_uniform_groups
        else torch.ones(len(rollouts), dtype=torch.bool),
        old_logp_T=[None] * len(rollouts),
        ref_logp_T=[None] * len(rollouts),
        sharing_stats={key: float(v) for key, v in sharing_stats.items()},
    )
    batch.set_old_scores(own_scores)
    return batch
