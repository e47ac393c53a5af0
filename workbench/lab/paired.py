"""Comparing two methods: the paired test on the same held-out items, and the unpaired rule without them.

Two methods evaluated on the same held-out items are compared item by item (:func:`paired_bootstrap`): a
hierarchical bootstrap over seeds, then items within them, of the per-item difference, giving Δ, its
standard error, a 95% interval and a two-sided p-value; the difference is *resolved* when the interval
excludes 0. Without per-item results, :func:`unpaired_difference` gives the interval Δ ± 2 SE from the two
means' standard errors (``workbench.lab.stats``). ``docs/statistics.md`` explains both;
``workbench.lab.verdicts`` applies them to HACPO and each baseline.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["paired_bootstrap", "unpaired_difference"]


def _no_pairs() -> dict[str, float]:
    stats = dict.fromkeys(("delta", "se", "ci_low", "ci_high", "p_value"), math.nan)
    return stats | {"resolved": False, "seeds": 0, "items": 0}


_CHUNK = 2000
"""Bootstrap replicates drawn at a time (bounds the memory of the multinomial draws)."""


def _resampled_means(x_I_C: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Column means of ``n_boot`` resamples (with replacement) of the rows of ``x_I_C``: shape (n_boot, C).

    Drawn as multinomial counts over the distinct rows, which is the same distribution as drawing row
    indices and costs as little for 1,000 items as for 10 (scores take few distinct values).
    """
    patterns_P_C, counts_P = np.unique(x_I_C, axis=0, return_counts=True)
    n = x_I_C.shape[0]
    means_B_C = np.empty((n_boot, x_I_C.shape[1]))
    for start in range(0, n_boot, _CHUNK):
        stop = min(n_boot, start + _CHUNK)
        means_B_C[start:stop] = rng.multinomial(n, counts_P / n, size=stop - start) @ patterns_P_C / n
    return means_B_C


def _replicates(d_I_S: pd.DataFrame, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap replicates of Δ from per-item differences (items × seeds, NaN where a seed lacks an item)."""
    n_seeds = d_I_S.shape[1]
    pick_B_J = rng.integers(0, n_seeds, size=(n_boot, n_seeds))  # the seeds drawn by each replicate
    if not d_I_S.isna().to_numpy().any():
        # Every seed answered the same items (a fixed task.eval_seed): one item resample per replicate,
        # shared by its seeds, so an item's effect common to all seeds is not averaged away as noise.
        means_B_S = _resampled_means(d_I_S.to_numpy(dtype="float64"), n_boot, rng)
        return np.take_along_axis(means_B_S, pick_B_J, axis=1).mean(axis=1)
    # Each seed drew its own items: resample them within every drawn seed, independently.
    columns = [col.dropna().to_numpy(dtype="float64")[:, None] for _, col in d_I_S.items()]
    means_S_BJ = np.stack([_resampled_means(x, n_boot * n_seeds, rng)[:, 0] for x in columns])
    return means_S_BJ.reshape(n_seeds, n_boot, n_seeds)[
        pick_B_J, np.arange(n_boot)[:, None], np.arange(n_seeds)
    ].mean(axis=1)


def paired_bootstrap(
    values: pd.DataFrame,
    treatment: str,
    baseline: str,
    *,
    n_boot: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """Δ = treatment − baseline on the same items, with a hierarchical bootstrap over seeds, then items.

    Pairs are the (seed, item) both methods were evaluated on; d = treatment's value − baseline's. Δ is the
    mean over the paired seeds of each seed's mean d. Each bootstrap replicate draws the seeds with
    replacement and the items with replacement, and averages like Δ: when every seed answered the same
    items (the default, a fixed ``task.eval_seed``) one item draw serves all seeds of the replicate (items
    and seeds are crossed); otherwise each drawn seed's items are drawn on their own (items nested in
    seeds). The interval is the replicates' ``level`` percentile interval; the p-value is two-sided,
    ``2 · min(P*(Δ* ≤ 0), P*(Δ* ≥ 0))`` with the usual +1 in numerator and denominator, at most 1. With one
    seed only items are resampled. A pure, seeded function: the same rows in any order give the same result.

    Args:
        values: Tidy rows ``method, seed, item, value``, one per method, seed and item; ``value`` an item's
            score (greedy correctness 0/1, or correct samples / k for avg@k).
        treatment: The ``method`` whose advantage is measured.
        baseline: The ``method`` it is compared with.
        n_boot: Bootstrap replicates.
        level: Coverage of the interval.
        seed: Seeds the bootstrap's random numbers.

    Returns:
        ``delta, se`` (the replicates' standard deviation), ``ci_low, ci_high, p_value``, ``resolved`` (the
        interval excludes 0), ``seeds`` and ``items`` paired (NaN statistics when nothing pairs).

    Raises:
        ValueError: Missing columns, or two rows for one method, seed and item.
    """
    missing = [c for c in ("method", "seed", "item", "value") if c not in values.columns]
    if missing:
        raise ValueError(f"paired_bootstrap: values lack columns {missing}; has {list(values.columns)}")
    rows = values[values["method"].isin([treatment, baseline])]
    twice = rows[rows.duplicated(["method", "seed", "item"], keep=False)]
    if len(twice):
        first = twice.iloc[0]
        raise ValueError(
            f"paired_bootstrap: {len(twice)} rows repeat a (method, seed, item), e.g. method "
            f"{first['method']}, seed {first['seed']}, item {first['item']}: one run per method and seed"
        )
    wide = rows.pivot(index=["seed", "item"], columns="method", values="value")
    if treatment not in wide or baseline not in wide:
        return _no_pairs()
    d = (wide[treatment] - wide[baseline]).dropna()
    if d.empty:
        return _no_pairs()
    d_I_S = d.unstack("seed").sort_index().sort_index(axis=1)
    boot_B = _replicates(d_I_S, n_boot, np.random.default_rng(seed))
    low, high = np.quantile(boot_B, [(1 - level) / 2, (1 + level) / 2])
    below, above = (1 + np.sum(boot_B <= 0)) / (1 + n_boot), (1 + np.sum(boot_B >= 0)) / (1 + n_boot)
    return {
        "delta": float(d_I_S.mean(axis=0).mean()),
        "se": float(boot_B.std(ddof=1)),
        "ci_low": float(low),
        "ci_high": float(high),
        "p_value": float(min(1.0, 2 * min(below, above))),
        "resolved": bool(low > 0 or high < 0),
        "seeds": int(d_I_S.shape[1]),
        "items": int(d.size),
    }


def unpaired_difference(delta: float, se: float) -> dict[str, float]:
    """The rule for a difference of two means without per-item results: interval Δ ± 2 SE, *resolved* when
    it excludes 0 (|Δ| > 2 SE), p-value from the normal approximation ``erfc(|Δ| / (SE √2))``.

    Returns:
        ``delta, se, ci_low, ci_high, p_value, resolved`` (NaN and False when SE is unknown).
    """
    if se is None or math.isnan(se) or math.isnan(delta):
        return {k: v for k, v in _no_pairs().items() if k not in ("seeds", "items")} | {"delta": delta}
    p = math.erfc(abs(delta) / (se * math.sqrt(2))) if se > 0 else float(delta == 0)
    return {"delta": delta, "se": se, "ci_low": delta - 2 * se, "ci_high": delta + 2 * se, "p_value": p,
            "resolved": bool(abs(delta) > 2 * se)}  # fmt: skip
