"""Where every old log-probability comes from: the denominator of each row's importance ratio (Eqs. 11, 25).

| rows | old policy | obtained by |
|---|---|---|
| a learner's own | its policy before the step's first update | `score_own`: one no-grad pass over its |
| | | rollouts right after sampling, in the update's micro-batches |
| another agent's (shared) | the source's, in the source's own tokens | the sum the author shared |
| | (Eq. 11) | (``SharedRollout.old_logp_sum``) over its token count or the text's bytes |
| shared, symmetric Naive | the learner's own at the start of its update | `score_cross`: its no-grad pass |

`set_old_policy` fills a `workbench.train.batches.LearnerBatch` with them (``scored_B`` says whose each row
has), and `policy_batch` hands them to the loss per micro-batch, with one rule for mini-batch 0: before the
learner's first optimizer step, a row it scored itself takes its *current* log-probs as the old ones, so an
on-policy row has s = 1 exactly there, whatever micro-batch it was scored in.

The same no-grad pass (`score_self`) gives the author's shared log-likelihoods, the learner's token log-probs
(token-level losses) and, with a KL term, the reference's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.agents.forward.agent import Agent, threads_for_pass
from workbench.agents.forward.passes import reference_token_logprobs, token_logprobs
from workbench.agents.forward.tokens import TokenBatch, self_token_batch
from workbench.core.losses import PolicyBatch, length_normalized_logp
from workbench.core.progress import ticking
from workbench.core.types import Rollout
from workbench.train.batches import LearnerBatch, UpdateSettings, plan_micro_batches, update_plan

__all__ = [
    "OldScores",
    "policy_batch",
    "sampler_log_ratios",
    "score_cross",
    "score_own",
    "score_self",
    "set_old_policy",
]


@dataclass
class OldScores:
    """The learner's no-grad pass over some rows, before any update of the step (one entry per scored row).

    Attributes:
        rows: The rows scored, in the order scored.
        logp_T: Each row's old token log-probs, aligned like `workbench.agents.forward.passes.token_logprobs`
            over the row's real tokens (its length is the row's token count − 1), on the learner's device.
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


@torch.no_grad()
def score_self(
    agent: Agent,
    tokens: TokenBatch,
    micro_batches: list[list[int]],
    *,
    temperature: float,
    reference: bool = False,
    length_B: torch.Tensor | None = None,
) -> OldScores:
    """The learner's log-probs of some rows under its current policy, before any update: its old policy.

    Runs micro-batch by micro-batch, in the update's micro-batches (so an on-policy self sample has s = 1
    exactly in the first mini-batch), eval mode, no gradient.

    Args:
        agent: The learner, before any update of the step.
        tokens: The token view the rows index (its own rollouts:
            `workbench.agents.forward.tokens.self_token_batch`).
        micro_batches: Rows of ``tokens`` per micro-batch, in update order.
        temperature: The sampling temperature (log-probs of softmax(logits / temperature)).
        reference: Also the KL reference's log-probs (``train.kl_coef`` > 0).
        length_B: Per row of ``tokens``, a byte length dividing the summed log-probs instead of the token
            count where > 0 (bytes normalization); None = token counts.

    Returns:
        The `OldScores` of the rows, in the order of ``micro_batches``.
    """
    scores = OldScores([], [], [] if reference else None, torch.zeros(0), [], [])
    means = []
    agent.model.eval()
    for rows in ticking(micro_batches, f"{agent.name} score", "seq", weight=len):
        view = tokens.select(rows)
        with threads_for_pass(agent, view):
            old_logp_B_T, mask_B_T = token_logprobs(agent, view, temperature=temperature)
            ref_logp_B_T = reference_token_logprobs(agent, view, temperature)[0] if reference else None
        lengths = length_B[rows].to(old_logp_B_T.device) if length_B is not None else None
        means.append(length_normalized_logp(old_logp_B_T, mask_B_T, lengths))
        widths = view.attention_mask_B_T.sum(dim=-1).tolist()
        for b, (logp_T, m_T) in enumerate(zip(old_logp_B_T.cpu(), mask_B_T.cpu())):
            scores.rows.append(rows[b])
            scores.logp_T.append(old_logp_B_T[b, : widths[b] - 1])
            if ref_logp_B_T is not None:
                scores.ref_logp_T.append(ref_logp_B_T[b, : widths[b] - 1])
            values_T = logp_T[m_T.bool()]
            scores.sums.append(float(values_T.double().sum()))
            scores.counts.append(int(values_T.numel()))
    scores.mean_B = torch.cat(means) if means else torch.zeros(0, device=agent.device)
    return scores


def score_own(agent: Agent, rollouts: list[Rollout], settings: UpdateSettings) -> OldScores:
    """`score_self` of an author's own rollouts, in micro-batches of the update's sizes, with each rollout's
    ``old_logp_sum`` and ``old_logp_count`` filled in: what it shares (Eq. 11)."""
    tokens = self_token_batch(rollouts, agent.pad_token_id)
    plan = plan_micro_batches(
        range(len(rollouts)),
        1,
        settings.micro_batch_size,
        micro_batch_tokens=settings.micro_batch_tokens,
        length_B=tokens.attention_mask_B_T.sum(dim=-1).tolist(),
    )
    scores = score_self(
        agent,
        tokens,
        [rows for minibatch in plan for rows in minibatch.micro_batches],
        temperature=settings.temperature,
        reference=settings.kl_coef > 0,
    )
    for rollout, total, count in zip(rollouts, scores.sums, scores.counts):
        rollout.old_logp_sum, rollout.old_logp_count = total, count
    return scores


def sampler_log_ratios(rollouts: list[Rollout], scores: OldScores) -> list[torch.Tensor] | None:
    """Per scored row (in ``scores.rows`` order), trainer − sampler log-prob of each response token, float64
    on CPU: how far the engine that sampled the rows (``Rollout.sampler_logp_T``) is from the trainer's own
    scoring pass. None when the engine reported no log-probs (the built-in loop samples with the trained
    model).

    Raises:
        ValueError: A row's sampler log-probs do not cover its response tokens one to one.
    """
    if not rollouts or any(r.sampler_logp_T is None for r in rollouts):
        return None
    gaps = []
    for i, row in enumerate(scores.rows):
        rollout, n = rollouts[row], len(rollouts[row].response_ids)
        sampler_T = torch.tensor(rollout.sampler_logp_T, dtype=torch.float64)
        if sampler_T.numel() != n:
            raise ValueError(
                f"rollout {rollout.id}: {sampler_T.numel()} sampler log-probs for {n} response tokens"
            )
        trainer_T = scores.logp_T[i][scores.logp_T[i].numel() - n :].detach().double().cpu()
        gaps.append(trainer_T - sampler_T)
    return gaps


def score_cross(agent: Agent, batch: LearnerBatch, settings: UpdateSettings) -> OldScores:
    """The symmetric Naive (``hacpo.naive_symmetric``): the learner's own no-grad pass over the shared rows of
    ``batch`` it trains, before its update, in the update's micro-batches."""
    cross = [
        [r for r in rows if not batch.is_self_B[r]]
        for minibatch in update_plan(batch, settings)
        for rows in minibatch.micro_batches
    ]
    cross = [rows for rows in cross if rows]
    return score_self(agent, batch.tokens, cross, temperature=settings.temperature, length_B=batch.length_B)


def set_old_policy(
    agent: Agent, batch: LearnerBatch, own_scores: OldScores, settings: UpdateSettings
) -> None:
    """Every row's old policy, before the learner's first update of the step (the module's table).

    Args:
        agent: The learner (it scores the shared rows itself under the symmetric Naive).
        batch: Its batch, own rows first (`workbench.train.batches.build_learner_batch`).
        own_scores: `score_own` of its own rollouts, taken right after it sampled them.
        settings: The update's sizes; ``cross_old_from_learner`` picks the symmetric Naive.

    Raises:
        ValueError: ``own_scores`` does not cover the batch's own rows, in order.
    """
    own_rows = batch.is_self_B.nonzero().flatten().tolist()
    if own_scores.rows != own_rows:
        raise ValueError(
            f"own scores cover rows {own_scores.rows}, not the batch's own rows {own_rows} in order"
        )
    # HACPO: a cross sample's old policy is its source's: the shared log-likelihood (Eq. 11).
    batch.old_logp_mean_B = torch.tensor(
        [
            r.old_logp_sum / n if n > 0 else r.old_logp_mean
            for r, n in zip(batch.rollouts, batch.length_B.tolist())
        ],
        dtype=torch.float32,
    )
    _take(batch, own_scores)
    if settings.cross_old_from_learner:  # the symmetric Naive: shared rows against the learner's own policy
        _take(batch, score_cross(agent, batch, settings))


def _take(batch: LearnerBatch, scores: OldScores) -> None:
    """The learner's own old log-probs (and reference) of the rows ``scores`` covers."""
    for i, row in enumerate(scores.rows):
        batch.old_logp_T[row] = scores.logp_T[i]
        batch.ref_logp_T[row] = scores.ref_logp_T[i] if scores.ref_logp_T is not None else None
    batch.old_logp_mean_B[scores.rows] = scores.mean_B.cpu()
    batch.scored_B[scores.rows] = True


def policy_batch(
    batch: LearnerBatch,
    rows: list[int],
    view: TokenBatch,
    logp_B_T: torch.Tensor,
    mask_B_T: torch.Tensor,
    m: int,
) -> PolicyBatch:
    """The loss input of micro-batch ``rows`` (token view ``view``) in mini-batch ``m``, on the learner's
    device: its current log-probs ``logp_B_T`` and each row's advantage, coefficient and old log-probs.

    In mini-batch 0 no optimizer step has been taken yet: the old policy of the rows the learner scored
    itself (``scored_B``) is its current one, so their old log-probs are the current ones, detached (s = 1
    exactly, whatever micro-batch they were scored in).
    """
    device, index_B = logp_B_T.device, torch.tensor(rows, dtype=torch.long)
    length_B = batch.length_B[index_B].to(device)
    old_mean_B = batch.old_logp_mean_B[index_B].to(device)
    old_B_T = batch.token_view(batch.old_logp_T, rows, view)
    if m == 0:
        scored_B = batch.scored_B[index_B].to(device)
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
        advantages_B=batch.advantages_B[index_B].to(device),
        is_self_B=batch.is_self_B[index_B].to(device),
        cross_coef_B=batch.cross_coef_B[index_B].to(device),
        minibatch_index=m,
        old_logp_B_T=old_B_T,
        length_B=length_B,
    )
