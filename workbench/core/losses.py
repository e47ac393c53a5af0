"""Policy losses: GRPO (token ratio), GSPO (sequence ratio) and HACPO (GSPO + exponential IS + stepwise clip).

Pure torch; no model, tokenizer, config or I/O. Every registered loss has one signature,
``loss(batch: PolicyBatch, params: LossParams) -> (loss, SampleStats)``: ``loss`` is the negative objective
averaged over the sequences passed (the authors' "seq-mean-token-mean"), so a caller that micro-batches a
mini-batch scales each micro-batch's loss by its share of the mini-batch; `SampleStats` holds each sample's
ratio, clip bounds and whether clipping took its gradient away.
See ``docs/hacpo.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = [
    "POLICY_LOSSES",
    "LossParams",
    "PolicyBatch",
    "PolicyLoss",
    "SampleStats",
    "cross_sample_weight",
    "get_policy_loss",
    "grpo_policy_loss",
    "gspo_policy_loss",
    "hacpo_policy_loss",
    "length_normalized_logp",
    "low_var_kl",
    "masked_mean_logp",
    "sequence_ratio",
    "stepwise_lower_bound",
    "truncated_sampler_weights",
]


def masked_mean_logp(logp_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> torch.Tensor:
    """Per-sequence mean log-prob over unmasked tokens, ``(1/|y|) Σ_t log π(y_t|·)`` (Eq. 25).

    A sequence with no unmasked token gets 0.0 (never NaN), so an empty response has ratio exactly 1.

    Args:
        logp_B_T: Token log-probs.
        mask_B_T: 1 for response tokens, 0 for prompt/padding.

    Returns:
        ``mean_logp_B``.
    """
    mask_B_T = mask_B_T.to(logp_B_T.dtype)
    count_B = mask_B_T.sum(dim=-1)
    # where() on the masked product: masked positions may hold -inf/NaN and must not leak into the sum.
    total_B = torch.where(mask_B_T > 0, logp_B_T, torch.zeros_like(logp_B_T)).sum(dim=-1)
    return total_B / count_B.clamp_min(1.0)


def sequence_ratio(
    new_logp_mean_B: torch.Tensor, old_logp_mean_B: torch.Tensor, max_abs_log_ratio: float = 10.0
) -> torch.Tensor:
    """Length-normalized sequence importance ratio ``s = exp(mean log π_new − mean log π_old)`` (Eqs. 11, 25).

    For a cross sample each mean is over its own tokenization (learner tokens vs source tokens, Sec. 3.3).
    The log-ratio is clamped to ±``max_abs_log_ratio`` for numerical safety (verl-v1's ``max_abs_log_ratio``).
    """
    log_ratio_B = (new_logp_mean_B - old_logp_mean_B).clamp(-max_abs_log_ratio, max_abs_log_ratio)
    return torch.exp(log_ratio_B)


def stepwise_lower_bound(minibatch_index: int, delta: float = 0.2, delta_step: float = 0.025) -> float:
    """Lower clip bound of cross samples in mini-batch m of a step: ``min(1, 1 − δ + m·δ_step)`` (Eq. 14).

    ``minibatch_index`` counts the learner's optimizer updates already done in this step, from 0. The cap
    at 1.0 is verl-v1's. E.g. δ = 0.2, δ_step = 0.025 gives 0.800, 0.825, 0.850, 0.875 for m = 0..3.
    """
    if minibatch_index < 0:
        raise ValueError(f"minibatch_index must be >= 0, got {minibatch_index}")
    return min(1.0, 1.0 - delta + minibatch_index * delta_step)


def cross_sample_weight(
    ratio_B: torch.Tensor,
    *,
    minibatch_index: int,
    alpha: float = 1.0,
    delta: float = 0.2,
    delta_step: float = 0.025,
    coef_B: torch.Tensor | float = 1.0,
    clip_cross: bool = True,
) -> torch.Tensor:
    """The weight HACPO puts on a cross sample's advantage: ``clip(s)·sg[clip(s)]^α·ω`` (Eqs. 12-14, 50).

    ``clip(s) = clamp(s, lb_m, 1.0)`` with the stepwise bound ``lb_m`` (no pessimistic min: outside
    [lb_m, 1] the sample is constant and its gradient exactly 0, Sec. 3.4). The α power applies to the
    detached clipped ratio (Eq. 12 as the code does it); since the weight is ≤ 1 before ω, a cross sample
    is never up-weighted by its ratio. With ``clip_cross=False`` (the "no Clip" ablation) it is
    ``s·sg[s]^α`` unclipped. The gradient w.r.t. the learner is ``ω·s^{α+1}·∇log s`` inside the bounds
    (Prop. D.6).

    Args:
        ratio_B: Sequence ratios s (with gradient).
        minibatch_index: m, the learner's optimizer updates already done this step.
        alpha: Exponent α ≥ 0 of the exponential importance sampling (α = 0: plain clipped ratio).
        delta: δ, initial distance of the lower bound from 1.
        delta_step: δ_step, per-update tightening of the lower bound.
        coef_B: ω^(source, learner) per sample (Eq. 10), or a scalar.
        clip_cross: Clip to [lb_m, 1] (default) or not.

    Returns:
        ``weight_B`` (with gradient through the first factor only).
    """
    if clip_cross:
        lower = stepwise_lower_bound(minibatch_index, delta, delta_step)
        clipped_B = ratio_B.clamp(lower, 1.0)
    else:
        clipped_B = ratio_B
    # HACPO: exponential importance sampling, the α power has no gradient (Eq. 12).
    return clipped_B * clipped_B.detach().pow(alpha) * coef_B


@dataclass
class PolicyBatch:
    """One learner's micro-batch, every tensor on the learner's device: the input of every policy loss.

    Attributes:
        logp_B_T: The learner's current token log-probs (with gradient), in its own tokenization.
        mask_B_T: 1 on response tokens.
        old_logp_mean_B: Old per-sequence mean log-prob: the learner's own for self samples, the source's
            (in the source's tokenization) for cross samples (Eqs. 11, 25).
        advantages_B: Advantages (Eq. 6 with the learner's baseline, or Eq. 5).
        is_self_B: True where the learner generated the sample.
        cross_coef_B: ω^(source, learner) per sample (Eq. 10; 1 for self samples and when switched off).
        minibatch_index: m, the learner's optimizer updates already done this step (Eq. 14).
        old_logp_B_T: The learner's old token log-probs, aligned with ``logp_B_T`` (token-level losses).
        length_B: What each row's summed log-prob is divided by to give its per-length mean, where it is
            not the row's own token count: > 0 replaces the count (the UTF-8 byte length of a shared
            response under ``ratio_normalization: bytes``), 0 keeps it; None = token counts everywhere
            (Eq. 25). ``old_logp_mean_B`` must then be normalised the same way.
    """

    logp_B_T: torch.Tensor
    mask_B_T: torch.Tensor
    old_logp_mean_B: torch.Tensor
    advantages_B: torch.Tensor
    is_self_B: torch.Tensor
    cross_coef_B: torch.Tensor
    minibatch_index: int = 0
    old_logp_B_T: torch.Tensor | None = None
    length_B: torch.Tensor | None = None


@dataclass(frozen=True)
class LossParams:
    """The scalars a policy loss reads (the trainer unpacks them from the config; no config object here)."""

    eps_low: float = 3e-4
    """Self-sample clip ε_l (GSPO 3e-4; the GRPO baseline 0.2)."""
    eps_high: float = 4e-4
    """Self-sample clip ε_h (GSPO 4e-4; the GRPO baseline 0.28)."""
    alpha: float = 1.0
    """α of the exponential importance sampling (Eq. 12)."""
    delta: float = 0.2
    """δ of the stepwise clip (Eqs. 13-14)."""
    delta_step: float = 0.025
    """δ_step of the stepwise clip."""
    max_abs_log_ratio: float = 10.0
    """Clamp of the sequence log-ratio."""
    clip_cross: bool = True
    """Clip cross ratios to [lb_m, 1] ("no Clip" ablation when False)."""


@dataclass
class SampleStats:
    """Per-sample diagnostics of one loss call, detached: what the trainer aggregates once per step.

    Attributes:
        ratio_B: The sequence ratio s = exp(mean log π_new − mean log π_old) (Eqs. 11, 25).
        lower_B: The lower clip bound applied to the sample (0 when none).
        upper_B: The upper clip bound (inf when none).
        clipped_B: Share of the sample that gave no gradient because of clipping: 0 or 1 for sequence
            ratios (the clipped branch won the pessimistic min, or a cross ratio fell outside its bounds),
            the share of clipped tokens for token-level ratios.
        term_B: The sample's term of the loss, −objective (the loss is their mean): a constant where
            ``clipped_B`` is 1, so a caller can log the loss that carries gradient apart from it.
    """

    ratio_B: torch.Tensor
    lower_B: torch.Tensor
    upper_B: torch.Tensor
    clipped_B: torch.Tensor
    term_B: torch.Tensor


def _gspo_self_objective(
    ratio_B: torch.Tensor, advantages_B: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO's pessimistic objective ``min(s·A, clip(s, 1−ε_l, 1+ε_h)·A)`` and its clip mask (Eq. 47)."""
    unclipped_B = ratio_B * advantages_B
    clipped_B = ratio_B.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages_B
    objective_B = torch.minimum(unclipped_B, clipped_B)
    was_clipped_B = clipped_B < unclipped_B
    return objective_B, was_clipped_B


def length_normalized_logp(
    logp_B_T: torch.Tensor, mask_B_T: torch.Tensor, length_B: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-sequence log-prob divided by a length: its own token count (Eq. 25), or ``length_B`` where > 0.

    Beyond the paper: a shared response's two log-probs (learner's, source's) are sums over different
    tokenizations; dividing both by the same UTF-8 byte length puts them on one scale (the learner's per-token
    mean over a character vocabulary and the source's over a BPE vocabulary are not comparable).
    """
    if length_B is None:
        return masked_mean_logp(logp_B_T, mask_B_T)
    mask_B_T = mask_B_T.to(logp_B_T.dtype)
    total_B = torch.where(mask_B_T > 0, logp_B_T, torch.zeros_like(logp_B_T)).sum(dim=-1)
    count_B = torch.where(length_B > 0, length_B.to(total_B.dtype), mask_B_T.sum(dim=-1))
    return total_B / count_B.clamp_min(1.0)


def truncated_sampler_weights(
    log_ratio_mean_B: torch.Tensor, cap: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance sampling for a sampler that is not the trained model (vLLM): each own row's loss
    weight ``w_i = min(exp(mean_t log π_train(y_t) / π_sampler(y_t)), cap)``.

    The ratio is the sequence's geometric mean over its tokens, GSPO's length-normalized form (TRL's
    ``vllm_importance_sampling_correction`` uses the token or the summed sequence ratio): ours, beyond the
    paper.

    Args:
        log_ratio_mean_B: Per row, the mean over its response tokens of trainer − sampler log-probs.
        cap: The truncation C ≥ 1.

    Returns:
        ``(w_B, metrics)``; metrics: ``is_weight_mean`` and ``truncated_frac`` (rows at the cap).
    """
    ratio_B = log_ratio_mean_B.double().exp()
    weight_B = ratio_B.clamp(max=cap).float()
    metrics = {
        "is_weight_mean": float(weight_B.mean()) if weight_B.numel() else 1.0,
        "truncated_frac": float((ratio_B > cap).double().mean()) if ratio_B.numel() else 0.0,
    }
    return weight_B, metrics


def _ratio(batch: PolicyBatch, params: LossParams) -> torch.Tensor:
    new_logp_mean_B = length_normalized_logp(batch.logp_B_T, batch.mask_B_T, batch.length_B)
    return sequence_ratio(new_logp_mean_B, batch.old_logp_mean_B, params.max_abs_log_ratio)


def _filled(like_B: torch.Tensor, value: float) -> torch.Tensor:
    return torch.full(like_B.shape, value, dtype=torch.float32, device=like_B.device)


def gspo_policy_loss(batch: PolicyBatch, params: LossParams) -> tuple[torch.Tensor, SampleStats]:
    """GSPO loss: sequence ratio with the min/clip of Eqs. 47-49 on every sample.

    Applied to a batch that contains other agents' samples, this is the "naive" sharing baseline: cross
    samples get the plain sequence ratio against their source's old log-probs and the same clip.

    Returns:
        ``(loss, stats)`` with ``loss = −mean_B objective``.
    """
    ratio_B = _ratio(batch, params)
    objective_B, was_clipped_B = _gspo_self_objective(
        ratio_B, batch.advantages_B, params.eps_low, params.eps_high
    )
    stats = SampleStats(
        ratio_B=ratio_B.detach(),
        lower_B=_filled(ratio_B, 1.0 - params.eps_low),
        upper_B=_filled(ratio_B, 1.0 + params.eps_high),
        clipped_B=was_clipped_B.float(),
        term_B=-objective_B.detach(),
    )
    return -objective_B.mean(), stats


def hacpo_policy_loss(batch: PolicyBatch, params: LossParams) -> tuple[torch.Tensor, SampleStats]:
    """HACPO loss for one learner's mini-batch of self and cross samples (Eqs. 47-53, App. E).

        self:  min(s·A, clip(s, 1−ε_l, 1+ε_h)·A)                      (GSPO, Eq. 47 with the typo fixed)
        cross: clip(s, lb_m, 1)·sg[clip(s, lb_m, 1)]^α·ω^(j,k)·A      (Eqs. 10, 12, 14, 50)
        loss = −mean over sequences of the objective                  (the code's seq-mean-token-mean)

    With every sample a self sample this is exactly :func:`gspo_policy_loss`.

    Returns:
        ``(loss, stats)``; a cross sample counts as clipped when its ratio lies outside [lb_m, 1].
    """
    is_self_B = batch.is_self_B.to(torch.bool)
    ratio_B = _ratio(batch, params)
    advantages_B = batch.advantages_B

    self_objective_B, self_clipped_B = _gspo_self_objective(
        ratio_B, advantages_B, params.eps_low, params.eps_high
    )
    # HACPO: cross samples get clip(s)·sg[clip(s)]^α·ω and no pessimistic min (Eqs. 12-14).
    cross_objective_B = (
        cross_sample_weight(
            ratio_B,
            minibatch_index=batch.minibatch_index,
            alpha=params.alpha,
            delta=params.delta,
            delta_step=params.delta_step,
            coef_B=batch.cross_coef_B,
            clip_cross=params.clip_cross,
        )
        * advantages_B
    )
    objective_B = torch.where(is_self_B, self_objective_B, cross_objective_B)

    ratio_B = ratio_B.detach()
    if params.clip_cross:
        lower = stepwise_lower_bound(batch.minibatch_index, params.delta, params.delta_step)
        cross_lower_B, cross_upper_B = _filled(ratio_B, lower), _filled(ratio_B, 1.0)
        cross_out_B = (ratio_B < lower) | (ratio_B > 1.0)
    else:
        cross_lower_B, cross_upper_B = _filled(ratio_B, 0.0), _filled(ratio_B, math.inf)
        cross_out_B = torch.zeros_like(is_self_B)
    stats = SampleStats(
        ratio_B=ratio_B,
        lower_B=torch.where(is_self_B, _filled(ratio_B, 1.0 - params.eps_low), cross_lower_B),
        upper_B=torch.where(is_self_B, _filled(ratio_B, 1.0 + params.eps_high), cross_upper_B),
        clipped_B=torch.where(is_self_B, self_clipped_B, cross_out_B).float(),
        term_B=-objective_B.detach(),
    )
    return -objective_B.mean(), stats


def grpo_policy_loss(batch: PolicyBatch, params: LossParams) -> tuple[torch.Tensor, SampleStats]:
    """GRPO loss with token-level ratios and DAPO clip-higher (the paper's GRPO baseline, Sec. 5).

    Per token ``min(r_t·A, clip(r_t, 1−ε_l, 1+ε_h)·A)``, averaged over each sequence's tokens, then over
    sequences (seq-mean-token-mean). Needs the learner's old token log-probs (``batch.old_logp_B_T``), so
    it applies to self samples only (single-agent training).

    Returns:
        ``(loss, stats)``; ``stats.ratio_B`` is the sequence ratio, ``clipped_B`` the share of clipped tokens.
    """
    if batch.old_logp_B_T is None:
        raise ValueError(
            "grpo_policy_loss needs batch.old_logp_B_T, the learner's old token log-probs: a token-level "
            "loss trains on the learner's own samples only, never on other agents' (they have none)"
        )
    logp_B_T, mask_B_T, advantages_B = batch.logp_B_T, batch.mask_B_T, batch.advantages_B
    log_ratio_B_T = (logp_B_T - batch.old_logp_B_T).clamp(-params.max_abs_log_ratio, params.max_abs_log_ratio)
    ratio_B_T = torch.exp(log_ratio_B_T)
    unclipped_B_T = ratio_B_T * advantages_B[:, None]
    clipped_B_T = ratio_B_T.clamp(1.0 - params.eps_low, 1.0 + params.eps_high) * advantages_B[:, None]
    objective_B = masked_mean_logp(torch.minimum(unclipped_B_T, clipped_B_T), mask_B_T)
    ratio_B = _ratio(batch, params).detach()
    stats = SampleStats(
        ratio_B=ratio_B,
        lower_B=_filled(ratio_B, 1.0 - params.eps_low),
        upper_B=_filled(ratio_B, 1.0 + params.eps_high),
        clipped_B=masked_mean_logp((clipped_B_T < unclipped_B_T).float(), mask_B_T).detach(),
        term_B=-objective_B.detach(),
    )
    return -objective_B.mean(), stats


def low_var_kl(
    logp_B_T: torch.Tensor, ref_logp_B_T: torch.Tensor, mask_B_T: torch.Tensor, clamp: float = 10.0
) -> torch.Tensor:
    """Per-sequence mean of the k3 ("low_var_kl") estimator of KL(π‖π_ref), as verl computes it.

    ``kl_t = exp(ref − logp) − (ref − logp) − 1``, clamped to [−clamp, clamp], then averaged over each
    sequence's unmasked tokens. The authors' code adds 0.001·KL on self samples only (the paper has none).

    Returns:
        ``kl_B`` (with gradient through ``logp_B_T``).
    """
    diff_B_T = ref_logp_B_T - logp_B_T
    kl_B_T = (torch.exp(diff_B_T) - diff_B_T - 1.0).clamp(-clamp, clamp)
    return masked_mean_logp(kl_B_T, mask_B_T)


PolicyLoss = Callable[[PolicyBatch, LossParams], tuple[torch.Tensor, SampleStats]]
"""One signature for every policy loss: a micro-batch and its scalars in, loss and per-sample stats out."""

POLICY_LOSSES: dict[str, PolicyLoss] = {
    "grpo": grpo_policy_loss,
    "gspo": gspo_policy_loss,
    "hacpo": hacpo_policy_loss,
}
"""The policy-loss variants by name."""


def get_policy_loss(name: str) -> PolicyLoss:
    """Look up a policy loss by name; an unknown name lists the valid ones."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown policy loss {name!r}; valid names: {sorted(POLICY_LOSSES)}") from None
