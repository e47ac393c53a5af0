"""Evaluation metrics over sampled rewards: unbiased pass@k, avg@k, best@k, and their tidy summary.

Pure numpy/pandas; `workbench.train.evaluate` produces the samples these summarize.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

logger = logging.getLogger(__name__)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021, Eq. 1).

    pass@k = 1 - C(n-c, k) / C(n, k), computed as a running product to stay exact-ish for large n.

    Args:
        n: Samples drawn for the item.
        c: Correct samples among them.
        k: Samples the metric imagines drawing, ``1 <= k <= n``.

    Returns:
        The estimate in [0, 1].
    """
    if not (0 <= c <= n):
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not (1 <= k <= n):
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def avg_at_k(rewards_I_K: np.ndarray) -> float:
    """Mean reward over items and their k samples; ``rewards_I_K[i, s]`` is item i's s-th sample."""
    return float(np.mean(np.asarray(rewards_I_K, dtype=float)))


def best_at_k(rewards_I_K: np.ndarray) -> float:
    """Mean over items of the best reward among their k samples (the paper's best@k)."""
    return float(np.mean(np.max(np.asarray(rewards_I_K, dtype=float), axis=1)))


def pass_ks(k: int) -> list[int]:
    """The j of the pass@j reported for k samples: powers of two below k, then k."""
    return [2**e for e in range(int(math.log2(k)) + 1) if 2**e < k] + [k] if k >= 1 else []


def _group_summary(group: pd.DataFrame) -> list[tuple[str, float]]:
    rows: list[tuple[str, float]] = []
    greedy = group[group["greedy"]]
    if len(greedy):
        rows.append(("greedy_acc", float(greedy["reward"].mean())))
    sampled = group[~group["greedy"]]
    if len(sampled):
        per_item = sampled.groupby("item", sort=False)["reward"]
        k = int(per_item.size().min())
        if per_item.size().max() != k:
            logger.warning(
                "items have between %d and %d samples; metrics use the first %d", k, per_item.size().max(), k
            )
        rewards_I_K = np.stack([r.to_numpy(dtype=float)[:k] for _, r in per_item])
        correct_I = (rewards_I_K > 0.5).sum(axis=1)
        rows.append((f"avg@{k}", avg_at_k(rewards_I_K)))
        for j in pass_ks(k):
            rows.append((f"pass@{j}", float(np.mean([pass_at_k(k, int(c), j) for c in correct_I]))))
        rows.append((f"best@{k}", best_at_k(rewards_I_K)))
    return rows


def summarize(samples: pd.DataFrame) -> pd.DataFrame:
    """Summarizes a tidy samples frame per agent and benchmark.

    Args:
        samples: Columns ``agent, benchmark, item, sample, greedy, reward`` (as `evaluate` returns).

    Returns:
        Long frame ``agent, benchmark, metric, value`` with ``greedy_acc`` (when greedy rows exist) and, from
        the sampled rows, ``avg@k``, ``pass@j`` (j in `pass_ks`) and ``best@k``.
    """
    missing = [c for c in ("agent", "benchmark", "item", "greedy", "reward") if c not in samples.columns]
    if missing:
        raise ValueError(f"summarize: samples lack columns {missing}; has {list(samples.columns)}")
    ordered = samples.sort_values(["agent", "benchmark", "item", "sample"], kind="stable")
    rows = [
        (agent, benchmark, metric, value)
        for (agent, benchmark), group in ordered.groupby(["agent", "benchmark"], sort=False)
        for metric, value in _group_summary(group)
    ]
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


SUMMARY_COLUMNS = ("agent", "benchmark", "metric", "value")


def accuracy_by_difficulty(
    item_rows: Iterable[Mapping[str, Any]], difficulty_of: Mapping[str, str]
) -> dict[str, dict[str, float]]:
    """Held-out accuracy per difficulty value, from per-item results (``eval_items.csv`` rows).

    Args:
        item_rows: Rows with ``item``, ``greedy`` (1/0, or None without a greedy response), ``sampled``
            (correct responses of the ``k`` sampled, or None) and ``k``.
        difficulty_of: Each item id's difficulty key (`workbench.core.types.TaskItem.difficulty`); items
            without one (missing or empty) are left out.

    Returns:
        ``{difficulty: {"items": n, "greedy_acc": mean greedy, "avg@k": mean share of correct samples}}``,
        keys sorted (numerically where every key is an integer); ``greedy_acc`` / ``avg@k`` only where the
        rows have them.
    """
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in item_rows:
        difficulty = difficulty_of.get(str(row["item"]), "")
        if difficulty:
            groups.setdefault(difficulty, []).append(row)
    numeric = all(key.lstrip("-").isdigit() for key in groups)
    out: dict[str, dict[str, float]] = {}
    for key in sorted(groups, key=lambda d: (int(d), d) if numeric else (0, d)):
        rows = groups[key]
        values: dict[str, float] = {"items": float(len(rows))}
        greedy = [float(r["greedy"]) for r in rows if _present(r.get("greedy"))]
        if greedy:
            values["greedy_acc"] = float(np.mean(greedy))
        sampled = [(float(r["sampled"]), int(r["k"])) for r in rows if _present(r.get("sampled")) and r["k"]]
        if sampled:
            k = sampled[0][1]
            values[f"avg@{k}"] = float(np.mean([c / n for c, n in sampled]))
        out[key] = values
    return out


def _present(value: Any) -> bool:
    """A per-item value that was recorded (not None, not NaN, not an empty CSV cell)."""
    if value is None or value == "":
        return False
    return not (isinstance(value, float) and math.isnan(value))
