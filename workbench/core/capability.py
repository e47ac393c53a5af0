"""Agent capability: the windowed accuracy P̂ (Eq. 9) and the capability ratios ω (Eq. 8).

Pure torch; no model, tokenizer, config or I/O. See ``docs/hacpo.md`` ("Capability").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch

from workbench.core.knobs import knob_problem

__all__ = ["CapabilityTracker", "capability_ratios"]


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
