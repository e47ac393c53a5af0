"""Pure data functions behind the tuning widgets: what HACPO's knobs do, as tidy DataFrames, without training.

- :func:`cross_weight_table`: a cross sample's weight ``clip(s)·sg[clip(s)]^α·ω`` against its sequence ratio
  s, for each mini-batch of a step (Eqs. 12-14, 50).
- :func:`capability_table`: P̂ per agent, the ω pairs and the learner baselines of a few example reward
  groups for given accuracies (Eqs. 6-9).
- :func:`metrics_frame`: the per-step metric dicts a trainer streams, as the wide frame ``load_runs`` gives.

Every number comes from ``workbench.hacpo`` (the same code the loss uses); nothing here re-implements the
math. Imports torch and pandas only (no altair, no ipywidgets). Invalid inputs raise ``ValueError`` naming
the parameter, its value and the allowed range, so a widget can show the message as is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from workbench.core.advantages import CapabilityTracker, capability_aware_advantages, capability_ratios
from workbench.core.knobs import knob_problem
from workbench.core.losses import cross_sample_weight, stepwise_lower_bound

__all__ = [
    "CapabilitySummary",
    "capability_table",
    "cross_weight_table",
    "default_s_grid",
    "metrics_frame",
    "validate_tuning",
]


def _check(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{name} = {value!r} is not allowed: {allowed}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def validate_tuning(
    *,
    alpha: float | None = None,
    delta: float | None = None,
    delta_step: float | None = None,
    window: int | None = None,
    min_ratio: float | None = None,
    max_ratio: float | None = None,
    n_minibatches: int | None = None,
) -> None:
    """Check HACPO tuning values; raise ``ValueError`` naming the first bad one and the allowed range.

    Arguments left at None are not checked. The knobs' ranges are the config's (`workbench.core.knobs`:
    α ≥ 0; δ in [0, 1); δ_step ≥ 0; window K an integer ≥ 1; 0 < min_ratio ≤ 1 ≤ max_ratio); the panel's
    n_minibatches is an integer in [1, 64].
    """
    knobs = {"alpha": alpha, "delta": delta, "delta_step": delta_step, "window": window}
    for name, value in (knobs | {"min_ratio": min_ratio, "max_ratio": max_ratio}).items():
        if value is not None and (problem := knob_problem(name, value)):
            raise ValueError(problem)
    if n_minibatches is not None:
        ok = isinstance(n_minibatches, int) and 1 <= n_minibatches <= 64
        _check(ok, "n_minibatches", n_minibatches, "an integer in [1, 64]")


def default_s_grid(delta: float, n: int = 121) -> torch.Tensor:
    """Ratios s from a little below the loosest lower bound ``1 − δ`` to 1.2, ``n`` points."""
    low = max(0.01, min(0.5, 1.0 - delta - 0.1))
    return torch.linspace(low, 1.2, n, dtype=torch.float64)


def cross_weight_table(
    alpha: float,
    delta: float,
    delta_step: float,
    omega: float | Mapping[str, float] = 1.0,
    n_minibatches: int = 4,
    s_grid: Sequence[float] | torch.Tensor | None = None,
    *,
    clip_cross: bool = True,
) -> pd.DataFrame:
    """Weight of a cross sample's advantage against its ratio s, for each mini-batch m of a step.

    The weight is ``clip(s, lb_m, 1)·sg[clip(s, lb_m, 1)]^α·ω`` with ``lb_m = min(1, 1 − δ + m·δ_step)``,
    computed by ``workbench.hacpo.cross_sample_weight``. Outside [lb_m, 1] the weight is constant in s
    and the sample gives no gradient; the ``in_range`` column marks where it does.

    Args:
        alpha: α ≥ 0 of the exponential importance sampling.
        delta: δ in [0, 1): the first mini-batch's lower bound is 1 − δ.
        delta_step: δ_step ≥ 0: tightening of the lower bound per mini-batch.
        omega: The loss coefficient ω^(source, learner); or ``{"<learner> ← <source>": ω, ...}`` for
            several pairs at once.
        n_minibatches: Mini-batches (optimizer updates) per learner per step.
        s_grid: Ratios to evaluate (positive); default :func:`default_s_grid`.
        clip_cross: False gives the "no Clip" ablation (unclipped ``s·sg[s]^α·ω``).

    Returns:
        Tidy DataFrame with columns pair, minibatch, lower_bound, s, weight, in_range.
    """
    validate_tuning(alpha=alpha, delta=delta, delta_step=delta_step, n_minibatches=n_minibatches)
    pairs = {f"ω = {omega:.3g}": omega} if not isinstance(omega, Mapping) else dict(omega)
    if not pairs:
        raise ValueError("omega is an empty mapping: give at least one '<learner> ← <source>': ω entry")
    for name, value in pairs.items():
        _check(_is_number(value) and value > 0, f"omega[{name!r}]", value, "a finite number > 0")
    s_B = (
        default_s_grid(delta) if s_grid is None else torch.as_tensor(s_grid, dtype=torch.float64).reshape(-1)
    )
    if s_B.numel() == 0 or not bool(torch.isfinite(s_B).all() and (s_B > 0).all()):
        raise ValueError(f"s_grid must hold finite ratios > 0, got {s_B.tolist()[:8]}...")
    frames = []
    for pair, coef in pairs.items():
        for m in range(n_minibatches):
            kwargs = {"minibatch_index": m, "alpha": alpha, "delta": delta, "delta_step": delta_step}
            weight_B = cross_sample_weight(s_B, coef_B=float(coef), clip_cross=clip_cross, **kwargs)
            lower = stepwise_lower_bound(m, delta, delta_step) if clip_cross else -math.inf
            in_range_B = (
                (s_B >= lower) & (s_B <= 1.0) if clip_cross else torch.ones_like(s_B, dtype=torch.bool)
            )
            frames.append(
                pd.DataFrame(
                    {
                        "pair": pair,
                        "minibatch": m,
                        "lower_bound": lower,
                        "s": s_B.numpy(),
                        "weight": weight_B.numpy(),
                        "in_range": in_range_B.numpy(),
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)


@dataclass(frozen=True)
class CapabilitySummary:
    """What the capability machinery makes of given accuracies (see :func:`capability_table`).

    Attributes:
        p_hat: One row per agent: agent, last accuracy, steps in the window, P̂ (Eq. 9).
        omega: One row per ordered pair (learner, source), learner ≠ source: ``omega_baseline`` =
            ω[learner, source] weighting the source's rewards in the learner's baseline (Eq. 7) and
            ``cross_coef`` = ω[source, learner] multiplying the source's samples in the learner's loss
            (Eq. 10), both clamped.
        baselines: One row per (example group, learner): the rewards, the baseline μ̂, the guard that
            fired (if any), and the advantage of a correct and of a wrong response (Eq. 6).
    """

    p_hat: pd.DataFrame
    omega: pd.DataFrame
    baselines: pd.DataFrame


def _accuracy_history(accuracies: Any) -> torch.Tensor:
    """Accuracies as ``[A, steps]`` float64: a flat ``[A]`` sequence is one step."""
    try:
        acc = torch.as_tensor(accuracies, dtype=torch.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"accuracies must be numbers per agent (or per agent and step): {err}") from err
    if acc.dim() == 1:
        acc = acc[:, None]  # (A, 1): one step
    if acc.dim() != 2 or acc.shape[0] < 1 or acc.shape[1] < 1:
        raise ValueError(f"accuracies must have shape [A] or [A, steps], got {list(acc.shape)}")
    bad = ~torch.isfinite(acc) | (acc < 0) | (acc > 1)
    if bad.any():
        agent, step = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"accuracies[{agent}][{step}] = {acc[agent, step].item()} is not allowed: in [0, 1]")
    return acc


def _example_groups(acc_A: torch.Tensor, agents: list[str], group_size: int) -> dict[str, torch.Tensor]:
    """A few reward groups ``[A, G]``: one matching the accuracies, the two guard cases, one-agent-right."""
    A = len(agents)
    expected_A_G = (torch.arange(group_size)[None, :] < torch.round(acc_A * group_size)[:, None]).float()
    groups = {"as accuracies": expected_A_G, "one right each": torch.zeros(A, group_size)}
    groups["one right each"][:, 0] = 1.0
    for a, name in enumerate(agents):
        only_A_G = torch.zeros(A, group_size)
        only_A_G[a] = 1.0
        groups[f"only {name} right"] = only_A_G
    groups["all wrong"] = torch.zeros(A, group_size)
    return groups


def _baseline_rows(
    groups: dict[str, torch.Tensor], omega_A_A: torch.Tensor, agents: list[str], max_reward: float | None
) -> list[dict[str, Any]]:
    rows = []
    for name, rewards_A_G in groups.items():
        rewards_P_A_G = rewards_A_G[None]  # (1, A, G): one prompt
        # Unnormalized advantages give the baseline exactly: Adv = R − μ̂ (Eq. 6 without σ).
        raw_L_P_A_G, metrics = capability_aware_advantages(
            rewards_P_A_G, omega_A_A, normalize_by_std=False, max_reward=max_reward
        )
        adv_L_P_A_G, _ = capability_aware_advantages(rewards_P_A_G, omega_A_A, max_reward=max_reward)
        uniform = metrics["uniform_group_frac"] > 0
        for learner, agent in enumerate(agents):
            baseline = (rewards_P_A_G[0, 0, 0] - raw_L_P_A_G[learner, 0, 0, 0]).item()
            fallback = metrics[f"baseline_fallback_frac/{learner}"] > 0
            correct = adv_L_P_A_G[learner, 0][rewards_A_G == 1.0]
            wrong = adv_L_P_A_G[learner, 0][rewards_A_G == 0.0]
            rows.append(
                {
                    "group": name,
                    "learner": agent,
                    "rewards": " | ".join("".join(str(int(r)) for r in row) for row in rewards_A_G.tolist()),
                    "baseline": baseline,
                    "guard": "uniform group" if uniform else ("baseline > max reward" if fallback else ""),
                    "adv_correct": correct[0].item() if correct.numel() else math.nan,
                    "adv_wrong": wrong[0].item() if wrong.numel() else math.nan,
                }
            )
    return rows


def capability_table(
    accuracies: Sequence[float] | Sequence[Sequence[float]] | torch.Tensor,
    window: int = 5,
    min_ratio: float = 0.1,
    max_ratio: float = 10.0,
    *,
    agents: Sequence[str] | None = None,
    group_size: int = 4,
    max_reward: float | None = 1.0,
) -> CapabilitySummary:
    """P̂, ω and example baselines for given accuracies, through ``CapabilityTracker`` and friends.

    Args:
        accuracies: Per-agent batch accuracy ``[A]`` (one step), or a history ``[A][steps]`` fed to the
            tracker step by step (only the last ``window`` steps count).
        window: Capability window K ≥ 1 (Eq. 9).
        min_ratio: Lower clamp of ω, in (0, 1].
        max_ratio: Upper clamp of ω, ≥ 1.
        agents: Agent names (default ``agent-0``, ``agent-1``, ...).
        group_size: G of the example reward groups (each agent's responses per prompt).
        max_reward: The baseline guard threshold (``capability_aware_advantages``' ``max_reward``).

    Returns:
        A :class:`CapabilitySummary`; the example groups (rows of ``baselines``, rewards shown one digit
        per response, agents separated by ``|``) are: correct counts matching the accuracies, one
        correct response per agent, only one agent right (each in turn), all wrong.
    """
    validate_tuning(window=window, min_ratio=min_ratio, max_ratio=max_ratio)
    acc_A_S = _accuracy_history(accuracies)
    n_agents = acc_A_S.shape[0]
    names = list(agents) if agents is not None else [f"agent-{a}" for a in range(n_agents)]
    if len(names) != n_agents:
        raise ValueError(f"agents has {len(names)} names for {n_agents} agents in accuracies")
    _check(
        isinstance(group_size, int) and 1 <= group_size <= 64,
        "group_size",
        group_size,
        "an integer in [1, 64]",
    )
    tracker = CapabilityTracker(n_agents, window=window)
    for step in range(acc_A_S.shape[1]):
        tracker.update(acc_A_S[:, step])
    p_hat_A = tracker.p_hat()
    omega_A_A = capability_ratios(p_hat_A, min_ratio=min_ratio, max_ratio=max_ratio)
    p_hat = pd.DataFrame(
        {
            "agent": names,
            "accuracy": acc_A_S[:, -1].numpy(),
            "steps_in_window": tracker.n_updates_in_window,
            "p_hat": p_hat_A.double().numpy(),
        }
    )
    pairs = [(k, j) for k in range(n_agents) for j in range(n_agents) if k != j]
    omega = pd.DataFrame(
        {
            "learner": [names[k] for k, _ in pairs],
            "source": [names[j] for _, j in pairs],
            "omega_baseline": [omega_A_A[k, j].item() for k, j in pairs],
            "cross_coef": [omega_A_A[j, k].item() for k, j in pairs],
        }
    )
    groups = _example_groups(acc_A_S[:, -1].float(), names, group_size)
    baselines = pd.DataFrame(_baseline_rows(groups, omega_A_A, names, max_reward))
    return CapabilitySummary(p_hat=p_hat, omega=omega, baselines=baselines)


def metrics_frame(
    records: Iterable[Mapping[str, Any]],
    *,
    run: str = "live",
    experiment: str = "",
    algorithm: str = "",
) -> pd.DataFrame:
    """The wide frame of ``load_runs`` (one row per step) from in-memory metric dicts.

    Records of the same step are merged (a later value wins), as ``load_runs`` does for ``metrics.jsonl``.

    Args:
        records: Dicts ``{"step": int, "<namespaced key>": float, ...}`` (what the trainer's
            ``on_step`` receives).
        run: Value of the ``run`` column.
        experiment: Value of the ``experiment`` column.
        algorithm: Value of the ``algorithm`` column.

    Returns:
        Columns run, experiment, algorithm, seed, run_dir, step, then the metric keys sorted; float values.
    """
    by_step: dict[int, dict[str, Any]] = {}
    for i, record in enumerate(records):
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step != int(step):
            raise ValueError(f"metrics record {i} has step = {step!r}: need an integer 'step'")
        by_step.setdefault(int(step), {}).update({k: v for k, v in record.items() if k != "step"})
    keys = sorted({k for row in by_step.values() for k in row})
    steps = sorted(by_step)
    frame = pd.DataFrame([by_step[s] for s in steps], columns=keys, dtype="float64")
    ids = {"run": run, "experiment": experiment, "algorithm": algorithm, "seed": pd.NA, "run_dir": ""}
    for position, (column, value) in enumerate(ids.items()):
        frame.insert(position, column, value)
    frame.insert(len(ids), "step", pd.Series(steps, dtype="int64"))
    frame["seed"] = frame["seed"].astype("Int64")
    return frame
