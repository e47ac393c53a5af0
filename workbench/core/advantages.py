"""Group advantages: GRPO/GSPO's single-agent form (Eq. 5) and HACPO's capability-aware form (Eqs. 6-7).

Pure torch; no model, tokenizer, config or I/O. See ``docs/hacpo.md``, "Capability-aware advantage" and
"Guards".
"""

from __future__ import annotations

import torch

__all__ = ["capability_aware_advantages", "group_advantages"]


def _bessel_std(x_P_N: torch.Tensor) -> torch.Tensor:
    """Std over the last dim with Bessel's correction; 0 for a single element (never NaN)."""
    if x_P_N.shape[-1] < 2:
        return torch.zeros(x_P_N.shape[:-1], dtype=x_P_N.dtype)
    return x_P_N.std(dim=-1, correction=1)


def group_advantages(
    rewards_P_G: torch.Tensor, eps: float = 1e-6, normalize_by_std: bool = True
) -> tuple[torch.Tensor, dict[str, float]]:
    """Single-agent group-relative advantage (Eq. 5): ``(R_i − mean_G R) / (std_G R + eps)``.

    Args:
        rewards_P_G: Rewards of G responses for each of P prompts.
        eps: Added to the std (the authors' code uses 1e-6).
        normalize_by_std: Divide by the group std (the code's ``normalize_by_std``, default on).

    Returns:
        ``(advantages_P_G, metrics)``; a group whose rewards are all equal gets advantage 0.
    """
    rewards_P_G = rewards_P_G.to(torch.float32)
    baseline_P = rewards_P_G.mean(dim=-1)
    advantages_P_G = rewards_P_G - baseline_P[:, None]
    if normalize_by_std:
        advantages_P_G = advantages_P_G / (_bessel_std(rewards_P_G)[:, None] + eps)
    uniform_P = (rewards_P_G == rewards_P_G[:, :1]).all(dim=-1)
    metrics = {"uniform_group_frac": uniform_P.float().mean().item()}
    return advantages_P_G, metrics


def capability_aware_advantages(
    rewards_P_A_G: torch.Tensor,
    omega_A_A: torch.Tensor,
    *,
    eps: float = 1e-6,
    normalize_by_std: bool = True,
    uniform_group_guard: bool = True,
    max_reward: float | None = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Capability-aware advantages of every response in each prompt's joint group, for every learner.

    For learner L and a response of agent a to prompt p (Eqs. 6-7):

        μ̂_L,p = (1/(A·G)) Σ_a Σ_g ω[L, a] · R[p, a, g]           (Eq. 7, ω[L, L] = 1)
        Adv[L, p, a, g] = (R[p, a, g] − μ̂_L,p) / (σ_p + eps)       (Eq. 6)

    where σ_p is the unweighted Bessel std of all A·G rewards of prompt p. Every sample in learner L's
    batch, self or cross, uses L's baseline (App. E and the authors' code; Eq. 10 writes A^(j)).

    Guards (the authors' code, not in the paper):
      1. ``uniform_group_guard``: a prompt whose A·G rewards are all equal uses the plain mean, so every
         advantage is 0 (capability weights must not create a signal).
      2. ``max_reward``: a weighted baseline above the maximum reward (every advantage negative) falls back
         to the mean of the learner's own G rewards for that prompt. ``None`` disables it.

    Args:
        rewards_P_A_G: Rewards ``[P, A, G]``.
        omega_A_A: Capability ratios ``[A, A]`` from :func:`capability_ratios` (row = learner).
        eps: Added to σ.
        normalize_by_std: Divide by σ (else the unnormalized advantage of Eq. 15).
        uniform_group_guard: Enable guard 1.
        max_reward: Threshold of guard 2, or ``None``.

    Returns:
        ``(advantages_L_P_A_G, metrics)`` with L = A learners. Metrics: fraction of prompts whose joint group
        is uniform (whether or not guard 1 is on) and, per learner, the fraction where guard 2 fired.
    """
    rewards_P_A_G = rewards_P_A_G.to(torch.float32)
    P, A, G = rewards_P_A_G.shape
    if omega_A_A.shape != (A, A):
        raise ValueError(f"omega_A_A has shape {tuple(omega_A_A.shape)}, expected ({A}, {A}) for {A} agents")
    rewards_P_N = rewards_P_A_G.reshape(P, A * G)  # (P, A·G): the joint group of each prompt

    # HACPO: each source's rewards are scaled by ω[learner, source] before averaging (Eq. 7).
    weighted_L_P_A_G = omega_A_A.to(torch.float32)[:, None, :, None] * rewards_P_A_G[None]
    baseline_L_P = weighted_L_P_A_G.mean(dim=(-2, -1))

    uniform_P = (rewards_P_N == rewards_P_N[:, :1]).all(dim=-1)
    if uniform_group_guard:
        baseline_L_P = torch.where(uniform_P[None, :], rewards_P_N.mean(dim=-1)[None, :], baseline_L_P)

    fallback_L_P = torch.zeros(A, P, dtype=torch.bool)
    if max_reward is not None:
        own_mean_L_P = rewards_P_A_G.mean(dim=-1).T  # (A, P): learner L's own group mean per prompt
        fallback_L_P = baseline_L_P > max_reward
        baseline_L_P = torch.where(fallback_L_P, own_mean_L_P, baseline_L_P)

    advantages_L_P_A_G = rewards_P_A_G[None] - baseline_L_P[:, :, None, None]
    if normalize_by_std:
        sigma_P = _bessel_std(rewards_P_N)  # joint, unweighted (Eq. 6)
        advantages_L_P_A_G = advantages_L_P_A_G / (sigma_P[None, :, None, None] + eps)

    metrics = {"uniform_group_frac": uniform_P.float().mean().item()}
    for learner in range(A):
        metrics[f"baseline_fallback_frac/{learner}"] = fallback_L_P[learner].float().mean().item()
    return advantages_L_P_A_G, metrics
