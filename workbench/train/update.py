"""One learner's mini-batch updates (Algorithm 1, lines 16-17) and the per-step metrics they produce.

`score_self` is the learner's only no-grad pass of a step: over its own rollouts, before any update, in the
update's micro-batches (`plan_micro_batches`). It gives the old log-likelihoods the author shares and the
learner's own old (and KL reference) log-probs; cross samples need no pass of the learner, since their old
log-prob is the source's (Eq. 11). Nothing is computed twice, nothing is thrown away.

`update_learner` splits a `LearnerBatch` into mini-batches (one optimizer step each; mini-batch m gets the
stepwise bound of m, Eq. 14) and micro-batches (gradient accumulation, a memory knob only). Every registered
policy loss is called the same way, ``loss(PolicyBatch, LossParams)``, so the loop never branches on the
method; the per-sample `SampleStats` it returns are aggregated once, by `learner_metrics`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import torch

from workbench.agents.agent import Agent
from workbench.agents.rollout import reference_token_logprobs, token_logprobs
from workbench.agents.tokens import TokenBatch
from workbench.core import losses
from workbench.core.losses import LossParams, PolicyBatch, low_var_kl, masked_mean_logp
from workbench.train.batches import LearnerBatch

__all__ = [
    "LearnerUpdate",
    "SelfScores",
    "TrainingError",
    "UpdateSettings",
    "learner_metrics",
    "plan_micro_batches",
    "score_self",
    "update_learner",
]


class TrainingError(RuntimeError):
    """A step cannot continue (non-finite loss, ...); the last good checkpoint is kept."""


@dataclass(frozen=True)
class UpdateSettings:
    """What the update loop needs besides the loss scalars (unpacked from the config by the trainer)."""

    loss: str
    """Key of ``workbench.core.losses.POLICY_LOSSES``."""
    minibatch_size: int
    """Sequences per optimizer step."""
    micro_batch_size: int
    """Sequences per forward/backward."""
    temperature: float
    """Log-probs are of softmax(logits / temperature), the sampling distribution."""
    kl_coef: float
    """low_var_kl coefficient on self samples (0 = no reference pass)."""
    grad_clip: float
    """Gradient-norm clip."""
    skip_uniform_groups: bool = False
    """Leave out the samples of prompts whose advantages are all 0 in the learner's batch; the kept samples
    are spread over as many mini-batches as the full batch has (so the update count stays the same)."""


@dataclass
class _Micro:
    """One micro-batch of the learner's own rows, with the no-grad passes made before any update.

    Attributes:
        rows: Its rows in the learner's batch (self samples come first, so they are rows 0..n_self-1).
        view: Its token view (trailing padding dropped).
        old_logp_B_T: The learner's old token log-probs, on its device.
        ref_logp_B_T: The KL reference's token log-probs (None without KL).
    """

    rows: range
    view: TokenBatch
    old_logp_B_T: torch.Tensor
    ref_logp_B_T: torch.Tensor | None


@dataclass
class SelfScores:
    """The learner's one no-grad pass over its own rollouts, made before any update of the step.

    It serves twice: its per-row sums are the old log-likelihoods the author shares with the other learners
    (Eq. 11), and its token log-probs are the learner's own old policy in the update, computed in the
    update's exact micro-batches, so an on-policy self sample has s = 1 exactly in the first mini-batch.

    Attributes:
        micros: The self micro-batches in update order.
        old_logp_mean_B: Per-row mean old log-prob (float32, on the learner's device).
        old_logp_sum: Per-row sum of the old token log-probs (float64 on CPU, as Python floats).
        old_logp_count: Per-row number of response tokens.
    """

    micros: list[_Micro]
    old_logp_mean_B: torch.Tensor
    old_logp_sum: list[float]
    old_logp_count: list[int]


@dataclass
class LearnerUpdate:
    """What one learner's updates of a step produced (per-sample stats are indexed like the batch)."""

    ratio_B: torch.Tensor
    lower_B: torch.Tensor
    upper_B: torch.Tensor
    clipped_B: torch.Tensor
    losses: list[float] = field(default_factory=list)
    kls: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    n_updates: int = 0
    kept: int = 0
    """Samples trained on (fewer than the batch under ``skip_uniform_groups``)."""
    skipping: bool = False
    """``skip_uniform_groups`` was on (the kept fraction is logged)."""


def plan_micro_batches(
    n_self: int, n: int, minibatch_size: int, micro_batch_size: int, *, n_minibatches: int | None = None
) -> list[list[range]]:
    """Row ranges of each mini-batch's micro-batches; none mixes self rows (< n_self) and cross rows.

    Mini-batch m holds rows ``[m·minibatch_size, (m+1)·minibatch_size)`` (the stepwise bound of Eq. 14 counts
    them); within it, micro-batches of ``micro_batch_size`` rows start afresh at the self/cross boundary, so
    the learner's own rows are scored and trained in identical micro-batches whatever follows them. With
    ``n_minibatches`` the n rows are spread evenly over that many mini-batches instead
    (``skip_uniform_groups``).

    >>> plan_micro_batches(3, 8, 4, 2)
    [[range(0, 2), range(2, 3), range(3, 4)], [range(4, 6), range(6, 8)]]
    """
    if n == 0:
        return []
    if n_minibatches is None:
        bounds = [*range(0, n, minibatch_size), n]
    else:
        count = max(1, min(n_minibatches, n))
        bounds = [round(i * n / count) for i in range(count + 1)]
    plan = []
    for start, stop in itertools.pairwise(bounds):
        cuts = [start] + ([n_self] if start < n_self < stop else []) + [stop]
        plan.append(
            [
                range(first, min(first + micro_batch_size, end))
                for begin, end in itertools.pairwise(cuts)
                for first in range(begin, end, micro_batch_size)
            ]
        )
    return plan


def score_self(agent: Agent, tokens: TokenBatch, settings: UpdateSettings) -> SelfScores:
    """The learner's old (and reference) log-probs of its own rollouts, in the update's micro-batches.

    Args:
        agent: The learner, before any update of the step.
        tokens: Its own rollouts' token view (`workbench.agents.tokens.self_token_batch`), in batch order.
        settings: Mini-batch and micro-batch sizes, temperature, KL coefficient.

    Returns:
        The `SelfScores`.
    """
    n = len(tokens)
    micros, means, sums, counts = [], [], [], []
    agent.model.eval()
    with torch.no_grad():
        plan = plan_micro_batches(n, n, settings.minibatch_size, settings.micro_batch_size)
        for rows in (rows for micro_rows in plan for rows in micro_rows):
            view = tokens.select(rows)
            old_logp_B_T, mask_B_T = token_logprobs(agent, view, temperature=settings.temperature)
            ref = None
            if settings.kl_coef > 0:
                ref, _ = reference_token_logprobs(agent, view, temperature=settings.temperature)
            micros.append(_Micro(rows, view, old_logp_B_T, ref))
            means.append(masked_mean_logp(old_logp_B_T, mask_B_T))
            for logp_T, m_T in zip(old_logp_B_T.cpu(), mask_B_T.cpu()):
                values_T = logp_T[m_T.bool()]
                sums.append(float(values_T.double().sum()))
                counts.append(int(values_T.numel()))
    old_mean_B = torch.cat(means) if means else torch.zeros(0, device=agent.device)
    return SelfScores(micros, old_mean_B, sums, counts)


def _regroup(rows_T: list[torch.Tensor], view: TokenBatch) -> torch.Tensor:
    """Per-row token log-probs (each its row's valid prefix) stacked into ``view``'s ``(B, T - 1)`` layout."""
    out_B_T = rows_T[0].new_zeros((len(rows_T), view.input_ids_B_T.shape[1] - 1))
    for b, row_T in enumerate(rows_T):
        out_B_T[b, : len(row_T)] = row_T
    return out_B_T


def _restrict(
    batch: LearnerBatch, scores: SelfScores, keep: list[int], settings: UpdateSettings
) -> tuple[LearnerBatch, SelfScores, list[list[range]]]:
    """The batch and self scores restricted to ``keep``, and the plan spreading them over the full batch's
    mini-batch count (``skip_uniform_groups``).

    The kept self rows' old and reference log-probs are cut out of the scored micro-batches and regrouped
    into the new ones (no second pass): a self ratio is then 1 up to float noise of the regrouping, not bit
    for bit.
    """
    n_self = len(scores.old_logp_mean_B)
    n_minibatches = len(
        plan_micro_batches(n_self, len(batch), settings.minibatch_size, settings.micro_batch_size)
    )
    per_row: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
    for micro in scores.micros:
        widths = micro.view.attention_mask_B_T.sum(dim=-1).tolist()
        for b, row in enumerate(micro.rows):
            ref = micro.ref_logp_B_T[b, : widths[b] - 1] if micro.ref_logp_B_T is not None else None
            per_row[row] = (micro.old_logp_B_T[b, : widths[b] - 1], ref)
    sub = batch.select(keep)
    kept_self = [row for row in keep if row < n_self]
    plan = plan_micro_batches(
        len(kept_self),
        len(keep),
        settings.minibatch_size,
        settings.micro_batch_size,
        n_minibatches=n_minibatches,
    )
    micros = []
    for rows in (rows for micro_rows in plan for rows in micro_rows if rows.start < len(kept_self)):
        view = sub.tokens.select(rows)
        old = _regroup([per_row[kept_self[r]][0] for r in rows], view)
        refs = [per_row[kept_self[r]][1] for r in rows]
        micros.append(_Micro(rows, view, old, None if refs[0] is None else _regroup(refs, view)))
    index = torch.tensor(kept_self, dtype=torch.long)
    restricted = SelfScores(
        micros,
        scores.old_logp_mean_B[index.to(scores.old_logp_mean_B.device)],
        [scores.old_logp_sum[r] for r in kept_self],
        [scores.old_logp_count[r] for r in kept_self],
    )
    return sub, restricted, plan


def _on_device(batch: LearnerBatch, scores: SelfScores, device: torch.device) -> dict[str, torch.Tensor]:
    """The batch's per-sample tensors on the learner's device, self rows' old means from ``scores``."""
    n_self = len(scores.old_logp_mean_B)
    old_mean_B = batch.old_logp_mean_B.to(device, copy=True)  # cross rows: the source's own old means
    old_mean_B[:n_self] = scores.old_logp_mean_B.to(device)
    return {
        "old_logp_mean_B": old_mean_B,
        "advantages_B": batch.advantages_B.to(device),
        "is_self_B": batch.is_self_B.to(device),
        "cross_coef_B": batch.cross_coef_B.to(device),
        "length_B": batch.length_B.to(device),
    }


def update_learner(
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    batch: LearnerBatch,
    scores: SelfScores,
    params: LossParams,
    settings: UpdateSettings,
    *,
    where: str = "",
) -> LearnerUpdate:
    """Mini-batch updates of one learner; mini-batch m uses the stepwise bound of m (Eq. 14).

    Args:
        agent: The learner.
        optimizer: Its optimizer.
        batch: Its batch (self samples first, on CPU).
        scores: `score_self` of its own rollouts with the same settings, before any update of the step.
        params: The loss scalars.
        settings: Mini-batch sizes, temperature, KL and gradient clip.
        where: Named in the error of a non-finite loss (``"step 3, learner 'gpt2-char'"``).

    Returns:
        Per-sample ratios, bounds and clip shares, and the losses, KLs and gradient norms.

    Raises:
        TrainingError: A non-finite loss (nothing of this mini-batch is applied).
        ValueError: A token-level loss on a batch with cross samples (it needs the learner's old token
            log-probs, which cross samples do not have).
    """
    loss_fn = losses.get_policy_loss(settings.loss)
    n, n_self = len(batch), len(scores.old_logp_mean_B)
    if int(batch.is_self_B.sum()) != n_self or not bool(batch.is_self_B[:n_self].all()):
        raise ValueError(f"the batch's first {n_self} rows must be the scored own samples (self first)")
    if settings.loss in losses.TOKEN_LEVEL_LOSSES and n_self < n:
        raise ValueError(f"the token-level loss {settings.loss!r} cannot train on other agents' samples")
    full_n, kept_B = n, torch.arange(n)
    if settings.skip_uniform_groups:
        keep = batch.informative_rows()
        batch, scores, plan = _restrict(batch, scores, keep, settings)
        n, n_self, kept_B = len(batch), len(scores.old_logp_mean_B), torch.tensor(keep, dtype=torch.long)
    else:
        plan = plan_micro_batches(n_self, n, settings.minibatch_size, settings.micro_batch_size)
    own = {(m.rows.start, m.rows.stop): m for m in scores.micros}
    sample_B = _on_device(batch, scores, agent.device)
    by_bytes = bool((batch.length_B > 0).any())
    # Rows left out of the update (skip_uniform_groups) keep NaN statistics: they are not counted.
    out = LearnerUpdate(
        *(torch.full((full_n,), math.nan) for _ in range(4)),
        n_updates=len(plan),
        kept=n,
        skipping=settings.skip_uniform_groups,
    )
    for m, micro_rows in enumerate(plan):
        optimizer.zero_grad(set_to_none=True)
        mb_len = sum(len(rows) for rows in micro_rows)
        for rows in micro_rows:
            cached = own.get((rows.start, rows.stop))
            if rows.start < n_self and cached is None:
                raise RuntimeError(
                    f"self rows {rows} were not scored in this micro-batch (score_self settings)"
                )
            # HACPO: cross rows skip the learner's no-grad pass: their old log-prob is the source's (Eq. 11).
            view = cached.view if cached is not None else batch.tokens.select(rows)
            logp_B_T, mask_B_T = token_logprobs(agent, view, temperature=settings.temperature)
            part = slice(rows.start, rows.stop)
            policy_batch = PolicyBatch(
                logp_B_T=logp_B_T,
                mask_B_T=mask_B_T,
                old_logp_mean_B=sample_B["old_logp_mean_B"][part],
                advantages_B=sample_B["advantages_B"][part],
                is_self_B=sample_B["is_self_B"][part],
                cross_coef_B=sample_B["cross_coef_B"][part],
                minibatch_index=m,
                old_logp_B_T=cached.old_logp_B_T if cached is not None else None,
                length_B=sample_B["length_B"][part] if by_bytes else None,
            )
            loss, stats = loss_fn(policy_batch, params)
            total = loss
            if cached is not None and cached.ref_logp_B_T is not None:
                # KL to the reference on self samples only (the authors' code; the paper has none).
                kl_B = low_var_kl(logp_B_T, cached.ref_logp_B_T, mask_B_T)
                kl = (kl_B * policy_batch.is_self_B).sum() / len(rows)
                total = total + settings.kl_coef * kl
                out.kls.append(kl.item())
            if not torch.isfinite(total):
                raise TrainingError(f"non-finite loss {total.item()} at {where}, mini-batch {m}")
            (total * len(rows) / mb_len).backward()
            out.losses.append(loss.item())
            for name in ("ratio_B", "lower_B", "upper_B", "clipped_B"):
                getattr(out, name)[kept_B[part]] = getattr(stats, name).float().cpu()
        params_ = agent.trainable_parameters()
        out.grad_norms.append(torch.nn.utils.clip_grad_norm_(params_, settings.grad_clip).item())
        optimizer.step()
    return out


def learner_metrics(
    name: str, names: list[str], batch: LearnerBatch, update: LearnerUpdate
) -> dict[str, float]:
    """``is/<learner>/<source>/*``, loss, KL, grad norm, advantage and cost metrics of one learner.

    ``clip_frac`` is the share of a source's samples whose gradient clipping removed (the loss's own
    definition: the clipped branch of GSPO's min, or a cross ratio outside [lb_m, 1]); for cross sources
    ``in_range_frac`` is the share that gave gradient. Under ``skip_uniform_groups`` only the kept samples
    count (``adv/<learner>/kept_frac`` is their share).
    """
    kept_B = ~update.ratio_B.isnan()
    metrics = {
        f"loss/{name}": sum(update.losses) / max(len(update.losses), 1),
        f"grad_norm/{name}": sum(update.grad_norms) / max(len(update.grad_norms), 1),
        f"adv/{name}/mean": batch.advantages_B.mean().item(),
        f"adv/{name}/abs_mean": batch.advantages_B.abs().mean().item(),
        f"cost/{name}/trained_responses": float(kept_B.sum().item()),
        f"cost/{name}/trained_tokens": float(batch.tokens.response_mask_B_T[kept_B].sum().item()),
        f"cost/{name}/updates": float(update.n_updates),
    }
    if update.skipping:
        metrics[f"adv/{name}/kept_frac"] = update.kept / max(len(batch), 1)
    if update.kls:
        metrics[f"kl/{name}"] = sum(update.kls) / len(update.kls)
    for key, value in batch.sharing_stats.items():
        metrics[f"share/{name}/{key}"] = value
    for a, source in enumerate(names):
        sel = (batch.source_B == a) & kept_B
        if not sel.any():
            continue
        prefix = f"is/{name}/{source}"
        s_B, clipped = update.ratio_B[sel], update.clipped_B[sel].mean().item()
        metrics[f"{prefix}/ratio_mean"] = s_B.mean().item()
        metrics[f"{prefix}/ratio_min"] = s_B.min().item()
        metrics[f"{prefix}/ratio_max"] = s_B.max().item()
        metrics[f"{prefix}/clip_frac"] = clipped
        if a != batch.learner:
            metrics[f"{prefix}/in_range_frac"] = 1.0 - clipped
    return metrics
