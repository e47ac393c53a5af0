"""Policy losses: GRPO (token ratio), GSPO (sequence ratio) and HACPO (GSPO + exponential IS + stepwise clip).

Pure torch; no model, tokenizer, config or I/O. Each loss returns ``(loss, metrics)`` where ``loss`` is the
negative objective averaged over the sequences passed (the authors' "seq-mean-token-mean"), so a caller that
micro-batches a mini-batch scales each micro-batch's loss by its share of the mini-batch.
See ``../shared/spec/hacpo.md`` §2, §3(c)-(d), §4, §9.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = [
    "POLICY_LOSSES",
    "TOKEN_LEVEL_LOSSES",
    "cross_sample_weight",
    "get_policy_loss",
    "grpo_policy_loss",
    "gspo_policy_loss",
    "hacpo_policy_loss",
    "low_var_kl",
    "masked_mean_logp",
    "sequence_ratio",
    "stepwise_lower_bound",
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

    For a cross sample each mean is over its own tokenization (learner tokens vs source tokens, spec §3(c)).
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
    [lb_m, 1] the sample is constant and its gradient exactly 0, spec §3(d)). The α power applies to the
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


def _gspo_self_objective(
    ratio_B: torch.Tensor, advantages_B: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO's pessimistic objective ``min(s·A, clip(s, 1−ε_l, 1+ε_h)·A)`` and its clip mask (Eq. 47)."""
    unclipped_B = ratio_B * advantages_B
    clipped_B = ratio_B.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages_B
    objective_B = torch.minimum(unclipped_B, clipped_B)
    was_clipped_B = clipped_B < unclipped_B
    return objective_B, was_clipped_B


def _stats(prefix: str, values_B: torch.Tensor) -> dict[str, float]:
    if values_B.numel() == 0:
        return {}
    values_B = values_B.detach().float()
    return {
        f"{prefix}_mean": values_B.mean().item(),
        f"{prefix}_min": values_B.min().item(),
        f"{prefix}_max": values_B.max().item(),
    }


def gspo_policy_loss(
    new_logp_mean_B: torch.Tensor,
    old_logp_mean_B: torch.Tensor,
    advantages_B: torch.Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    max_abs_log_ratio: float = 10.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO loss: sequence ratio with the symmetric-style min/clip on every sample (Eqs. 47-49).

    Applied to a batch that contains other agents' samples, this is the "naive" sharing baseline: cross
    samples get the plain sequence ratio against their source's old log-probs and the same clip.

    Args:
        new_logp_mean_B: Learner's per-sequence mean log-probs (with gradient).
        old_logp_mean_B: Per-sequence mean log-probs under the sampling (old) policy.
        advantages_B: Advantages.
        eps_low: ε_l (GSPO: 3e-4).
        eps_high: ε_h (GSPO: 4e-4).
        max_abs_log_ratio: Clamp of the log-ratio.

    Returns:
        ``(loss, metrics)`` with ``loss = −mean_B objective``.
    """
    ratio_B = sequence_ratio(new_logp_mean_B, old_logp_mean_B, max_abs_log_ratio)
    objective_B, was_clipped_B = _gspo_self_objective(ratio_B, advantages_B, eps_low, eps_high)
    metrics = {"clip_frac": was_clipped_B.float().mean().item(), **_stats("ratio", ratio_B)}
    return -objective_B.mean(), metrics


def hacpo_policy_loss(
    new_logp_mean_B: torch.Tensor,
    old_logp_mean_B: torch.Tensor,
    advantages_B: torch.Tensor,
    is_self_B: torch.Tensor,
    cross_coef_B: torch.Tensor,
    *,
    minibatch_index: int,
    alpha: float = 1.0,
    delta: float = 0.2,
    delta_step: float = 0.025,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    max_abs_log_ratio: float = 10.0,
    clip_cross: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """HACPO loss for one learner's mini-batch of self and cross samples (Eqs. 47-53, spec §4).

        self:  min(s·A, clip(s, 1−ε_l, 1+ε_h)·A)                      (GSPO, Eq. 47 with the typo fixed)
        cross: clip(s, lb_m, 1)·sg[clip(s, lb_m, 1)]^α·ω^(j,k)·A      (Eqs. 10, 12, 14, 50)
        loss = −mean over sequences of the objective                  (the code's seq-mean-token-mean)

    With every sample a self sample this is exactly :func:`gspo_policy_loss`.

    Args:
        new_logp_mean_B: Learner's per-sequence mean log-probs in its own tokenization (with gradient).
        old_logp_mean_B: Source's old per-sequence mean log-probs in the source's tokenization.
        advantages_B: Capability-aware advantages with the learner's baseline (Eq. 6).
        is_self_B: True where the learner generated the sample.
        cross_coef_B: ω^(source, learner) per sample (Eq. 10; ignored for self samples).
        minibatch_index: m, the learner's optimizer updates already done this step (Eq. 14).
        alpha: Exponent of the exponential importance sampling (Eq. 12).
        delta: δ of the stepwise clip.
        delta_step: δ_step of the stepwise clip.
        eps_low: Self-sample ε_l.
        eps_high: Self-sample ε_h.
        max_abs_log_ratio: Clamp of the log-ratio.
        clip_cross: Clip cross ratios to [lb_m, 1] ("no Clip" ablation when False).

    Returns:
        ``(loss, metrics)``; metrics hold self/cross ratio mean/min/max, clip fractions and the bound.
    """
    is_self_B = is_self_B.to(torch.bool)
    ratio_B = sequence_ratio(new_logp_mean_B, old_logp_mean_B, max_abs_log_ratio)

    self_objective_B, self_clipped_B = _gspo_self_objective(ratio_B, advantages_B, eps_low, eps_high)
    # HACPO: cross samples get clip(s)·sg[clip(s)]^α·ω and no pessimistic min (Eqs. 12-14).
    cross_objective_B = (
        cross_sample_weight(
            ratio_B,
            minibatch_index=minibatch_index,
            alpha=alpha,
            delta=delta,
            delta_step=delta_step,
            coef_B=cross_coef_B,
            clip_cross=clip_cross,
        )
        * advantages_B
    )
    objective_B = torch.where(is_self_B, self_objective_B, cross_objective_B)

    lower = stepwise_lower_bound(minibatch_index, delta, delta_step) if clip_cross else float("-inf")
    cross_ratio_B = ratio_B[~is_self_B].detach()
    cross_out_B = (cross_ratio_B < lower) | (cross_ratio_B > 1.0) if clip_cross else cross_ratio_B < lower
    metrics: dict[str, float] = {"cross_lower_bound": lower, "self_frac": is_self_B.float().mean().item()}
    metrics |= _stats("self_ratio", ratio_B[is_self_B])
    metrics |= _stats("cross_ratio", cross_ratio_B)
    if is_self_B.any():
        metrics["self_clip_frac"] = self_clipped_B[is_self_B].float().mean().item()
    if cross_ratio_B.numel():
        metrics["cross_clip_frac"] = cross_out_B.float().mean().item()
    return -objective_B.mean(), metrics


def grpo_policy_loss(
    logp_B_T: torch.Tensor,
    old_logp_B_T: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_B_T: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    max_abs_log_ratio: float = 10.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO loss with token-level ratios and DAPO clip-higher (the paper's GRPO baseline, spec §2).

    Per token ``min(r_t·A, clip(r_t, 1−ε_l, 1+ε_h)·A)``, averaged over each sequence's tokens, then over
    sequences (seq-mean-token-mean). Needs the old policy's token log-probs, so it only applies to self
    samples (single-agent training).

    Returns:
        ``(loss, metrics)``.
    """
    log_ratio_B_T = (logp_B_T - old_logp_B_T).clamp(-max_abs_log_ratio, max_abs_log_ratio)
    ratio_B_T = torch.exp(log_ratio_B_T)
    unclipped_B_T = ratio_B_T * advantages_B[:, None]
    clipped_B_T = ratio_B_T.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages_B[:, None]
    objective_B = masked_mean_logp(torch.minimum(unclipped_B_T, clipped_B_T), mask_B_T)
    mask = mask_B_T.bool()
    metrics = {"clip_frac": (clipped_B_T < unclipped_B_T)[mask].float().mean().item() if mask.any() else 0.0}
    metrics |= _stats("ratio", ratio_B_T[mask])
    return -objective_B.mean(), metrics


def low_var_kl(
    logp_B_T: torch.Tensor, ref_logp_B_T: torch.Tensor, mask_B_T: torch.Tensor, clamp: float = 10.0
) -> torch.Tensor:
    """Per-sequence mean of the k3 ("low_var_kl") estimator of KL(π‖π_ref), as verl computes it.

    ``kl_t = exp(ref − logp) − (ref − logp) − 1``, clamped to [−clamp, clamp], then averaged over each
    sequence's unmasked tokens. The authors' code adds 0.001·KL on self samples only (spec §6, §9.9).

    Returns:
        ``kl_B`` (with gradient through ``logp_B_T``).
    """
    diff_B_T = ref_logp_B_T - logp_B_T
    kl_B_T = (torch.exp(diff_B_T) - diff_B_T - 1.0).clamp(-clamp, clamp)
    return masked_mean_logp(kl_B_T, mask_B_T)


POLICY_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, dict[str, float]]]] = {
    "grpo": grpo_policy_loss,
    "gspo": gspo_policy_loss,
    "hacpo": hacpo_policy_loss,
}
"""The policy-loss variants by name. ``grpo`` takes token-level inputs, the others sequence means."""

TOKEN_LEVEL_LOSSES = frozenset({"grpo"})


def get_policy_loss(name: str) -> Callable[..., tuple[torch.Tensor, dict[str, float]]]:
    """Look up a policy loss by name; an unknown name lists the valid ones."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown policy loss {name!r}; valid names: {sorted(POLICY_LOSSES)}") from None
