"""Capability-aware advantages (the paper's Sec. 3.1): capability P̂ (Eq. 9), the ratios ω (Eq. 8), and the
group advantages of GRPO/GSPO (Eq. 5) and of HACPO (Eqs. 6-7).

Pure torch; no model, tokenizer, config or I/O. See ``docs/hacpo.md`` ("Capability", "Capability-aware
advantage", "Guards").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch

from workbench.core.knobs import knob_problem

__all__ = ["CapabilityTracker", "capability_aware_advantages", "capability_ratios", "group_advantages"]


class CapabilityTracker:
    """Moving-average capability of every agent over the last ``window`` steps (Eq. 9).

    ``P̂^(k)_t = (1/K) Σ_{τ=t−K+1..t} P^(k)_τ`` where ``P^(k)_τ`` is agent k's batch accuracy at step τ.
    The current step is appended *before* advantages are computed (Assumption D.1, as the authors' code), so
    ``p_hat()`` includes the newest update. Before any update every capability is 1.0 (so ω = 1), and
    every value is floored at ``floor`` so an agent with accuracy 0 still gives finite ratios.

    Args:
        n_agents: Number of agents A.
        window: K, the number of most recent steps averaged (the paper uses 5).
        floor: Lower bound applied to P̂ (the authors' code uses 1e-8).
    """

    def __init__(self, n_agents: int, window: int = 5, floor: float = 1e-8) -> None:
        if n_agents < 1:
            raise ValueError(f"n_agents must be >= 1, got {n_agents}")
        if problem := knob_problem("window", window):
            raise ValueError(problem)
        if not floor > 0:
            raise ValueError(f"floor must be > 0, got {floor}")
        self.n_agents = n_agents
        self.window = window
        self.floor = floor
        self._history: deque[list[float]] = deque(maxlen=window)

    @property
    def n_updates_in_window(self) -> int:
        """How many step accuracies the window currently holds (≤ window)."""
        return len(self._history)

    def update(self, acc_A: torch.Tensor | Sequence[float]) -> None:
        """Append one step's per-agent batch accuracy ``P^(k)_τ``.

        Args:
            acc_A: Accuracy of each agent's own rollouts this step, shape ``[A]``, values in [0, 1].
        """
        values = [float(x) for x in torch.as_tensor(acc_A, dtype=torch.float64).reshape(-1)]
        if len(values) != self.n_agents:
            raise ValueError(f"acc_A has {len(values)} entries, expected one per agent ({self.n_agents})")
        if any(v != v for v in values):
            raise ValueError(f"acc_A contains NaN: {values}")
        self._history.append(values)

    def p_hat(self) -> torch.Tensor:
        """Windowed capability ``P̂_A`` (float32, floored); all ones before the first update."""
        if not self._history:
            return torch.ones(self.n_agents)
        history_K_A = torch.tensor(list(self._history), dtype=torch.float64)
        return history_K_A.mean(dim=0).clamp_min(self.floor).to(torch.float32)

    def state_dict(self) -> dict:
        """Everything needed to resume: settings and the window's contents."""
        return {
            "n_agents": self.n_agents,
            "window": self.window,
            "floor": self.floor,
            "history": [list(row) for row in self._history],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict`; the agent count must match."""
        if state["n_agents"] != self.n_agents:
            raise ValueError(
                f"checkpoint tracks {state['n_agents']} agents, this tracker {self.n_agents}: "
                "resume with the same agents"
            )
        self.window = int(state["window"])
        self.floor = float(state["floor"])
        self._history = deque((list(row) for row in state["history"]), maxlen=self.window)


def capability_ratios(p_hat_A: torch.Tensor, min_ratio: float = 0.1, max_ratio: float = 10.0) -> torch.Tensor:
    """Capability ratios ``omega_A_A[k, j] = clamp(P̂_k / P̂_j, min_ratio, max_ratio)`` (Eq. 8).

    Two roles (Remark 3.1):
    - the baseline of learner k weights source j's rewards by ``omega[k, j]`` (learner / source, Eq. 7);
    - a cross sample from source j in learner k's loss is scaled by ``omega[j, k]``
      (source / learner, Eq. 10).
    The clamp to [0.1, 10] is the authors' code, not the paper. The diagonal is exactly 1.

    Args:
        p_hat_A: Capabilities ``[A]``, positive (see :class:`CapabilityTracker`).
        min_ratio: Lower clamp of the ratio.
        max_ratio: Upper clamp of the ratio.

    Returns:
        ``omega_A_A`` with ``omega_A_A[k, j] = P̂_k / P̂_j`` clamped.
    """
    if problem := knob_problem("min_ratio", min_ratio) or knob_problem("max_ratio", max_ratio):
        raise ValueError(problem)
    p_hat_A = torch.as_tensor(p_hat_A, dtype=torch.float32)
    if (p_hat_A <= 0).any() or not torch.isfinite(p_hat_A).all():
        raise ValueError(f"capabilities must be positive and finite, got {p_hat_A.tolist()}")
    omega_A_A = p_hat_A[:, None] / p_hat_A[None, :]  # (A, A): row = learner k, column = source j
    return omega_A_A.clamp(min_ratio, max_ratio)


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
    max_reward: float | torch.Tensor | None = 1.0,
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
        max_reward: Threshold of guard 2 (a number, or one per prompt ``[P]``), or ``None``.

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
