"""Seeds and standard errors: every number the lab shows is a mean ± std over seeds, with its n.

A *stat table* is a DataFrame whose columns are a two-level MultiIndex ``(<column>, stat)`` with the stats
:data:`STATS` = ``mean, std, n, se`` for every column (a benchmark, a method, an α...). `workbench.lab.tables`
and `workbench.lab.accuracy` build them, `workbench.lab.latex` prints them as ``0.512 ± 0.013`` with n in the
caption or a column, and :func:`flat` spreads them into CSV columns ``<column>_mean``, ``_std``, ``_n``,
``_se``.

How the numbers are made (``docs/results.md`` says the same):

- ``mean`` and ``std``: over runs that differ only in ``seed`` (one value per run, e.g. its final held-out
  accuracy); ``std`` is the sample standard deviation (ddof = 1), NaN for one run (printed "—": one seed is a
  smoke test, never a result).
- ``se`` of one run's accuracy on m held-out items: the binomial ``sqrt(p (1 − p) / m)``
  (:func:`binomial_se`). For avg@k it is the same formula, an upper bound of the standard error of the mean
  of per-item averages (each item's average of k samples lies in [0, 1] with mean p, so its variance is at
  most p (1 − p)); tables report the bound, and comparisons of methods use the per-item results instead.
- ``se`` of the mean over n seeds (:func:`combine`): ``sqrt(std² / n + mean(se_run²))``. The first term is
  the seed-to-seed spread of the mean; the second is the held-out sampling error, which all seeds share when
  they are evaluated on the same items (``task.eval_seed`` fixed, the default), so it does not shrink with
  more seeds. Conservative when the items differ per seed. One run: its own ``se``. Quantities without a
  per-run error (ratio statistics, costs): ``std / sqrt(n)``.

Two methods evaluated on the same held-out items are compared item by item (:func:`paired_bootstrap`): a
hierarchical bootstrap over seeds, then items within them, of the per-item difference, giving Δ, its
standard error, a 95% interval and a two-sided p-value; the difference is *resolved* when the interval
excludes 0. Without per-item results, :func:`unpaired_difference` gives the interval Δ ± 2 SE from the two
means' standard errors. ``docs/statistics.md`` explains both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

__all__ = [
    "STATS",
    "aggregate",
    "binomial_se",
    "combine",
    "final_and_initial",
    "flat",
    "format_cell",
    "formatted",
    "is_stat_table",
    "markdown",
    "paired_bootstrap",
    "row_n",
    "seeds_note",
    "stat_table",
    "unpaired_difference",
]

STATS = ("mean", "std", "n", "se")
"""The statistics of every cell of a stat table, in column order."""
SMOKE_NOTE = "1 seed: a smoke test"
"""What a table of single runs says about itself."""


def binomial_se(p: float | pd.Series, m: float | pd.Series) -> float | pd.Series:
    """Standard error ``sqrt(p (1 − p) / m)`` of an accuracy ``p`` on ``m`` items (NaN when m is unknown)."""
    if isinstance(p, pd.Series) or isinstance(m, pd.Series):
        p_s, m_s = pd.to_numeric(p, errors="coerce"), pd.to_numeric(m, errors="coerce")
        return np.sqrt((p_s * (1 - p_s)).clip(lower=0) / m_s.where(m_s > 0))
    if m is None or not m > 0 or p is None or math.isnan(p):
        return math.nan
    return math.sqrt(max(p * (1 - p), 0.0) / m)


def combine(values: Sequence[float], ses: Sequence[float] | None = None) -> dict[str, float]:
    """``mean, std, n, se`` of per-run ``values`` (NaN values dropped), with per-run standard errors ``ses``.

    ``se = sqrt(std² / n + mean(ses²))`` (std taken as 0 for one run); without ``ses``: ``std / sqrt(n)``.
    """
    vals = np.asarray(values, dtype="float64")
    keep = ~np.isnan(vals)
    vals = vals[keep]
    n = int(vals.size)
    if n == 0:
        return {"mean": math.nan, "std": math.nan, "n": 0, "se": math.nan}
    mean = float(vals.mean())
    std = float(vals.std(ddof=1)) if n > 1 else math.nan
    spread = (std**2 / n) if n > 1 else 0.0
    if ses is None:
        se = math.sqrt(spread) if n > 1 else math.nan
    else:
        errs = np.asarray(ses, dtype="float64")[keep]
        shared = float(np.mean(errs**2)) if errs.size and not np.isnan(errs).all() else math.nan
        se = (
            math.sqrt(spread + shared)
            if not math.isnan(shared)
            else (math.sqrt(spread) if n > 1 else math.nan)
        )
    return {"mean": mean, "std": std, "n": n, "se": se}


def aggregate(
    per_run: pd.DataFrame, by: Sequence[str], value: str = "value", se: str | None = "se"
) -> pd.DataFrame:
    """Rows of ``per_run`` (one per run) grouped by ``by``, each group :func:`combine`-d.

    Returns:
        Columns ``*by, mean, std, n, se``, groups in order of appearance.
    """
    rows = []
    use_se = se is not None and se in per_run.columns
    for key, group in per_run.groupby(list(by), sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        stats = combine(group[value].tolist(), group[se].tolist() if use_se else None)
        rows.append({**dict(zip(by, key)), **stats})
    out = pd.DataFrame(rows, columns=[*by, *STATS])
    out["n"] = out["n"].astype("int64")
    return out


def stat_table(
    agg: pd.DataFrame,
    index: Sequence[str],
    column: str,
    *,
    index_order: Sequence[tuple] | None = None,
    column_order: Sequence | None = None,
    decimals: int | None = None,
) -> pd.DataFrame:
    """Pivot :func:`aggregate` output into a stat table: rows ``index``, columns ``(<column value>, stat)``.

    Args:
        agg: Columns ``*index, column, mean, std, n, se``.
        index: Row key columns (one or more levels).
        column: The column key (benchmark, method, α...).
        index_order: Row keys in order (default: order of appearance).
        column_order: Column values in order (default: order of appearance).
        decimals: Round mean, std and se (n stays an int).
    """
    idx = list(index)
    wide = agg.pivot_table(index=idx, columns=column, values=list(STATS), aggfunc="first", dropna=False)
    wide = wide.swaplevel(0, 1, axis=1)
    cols = list(column_order) if column_order is not None else list(dict.fromkeys(agg[column].tolist()))
    wide = wide.reindex(columns=pd.MultiIndex.from_product([cols, STATS], names=[column, "stat"]))
    rows = list(index_order) if index_order is not None else list(dict.fromkeys(map(tuple, agg[idx].values)))
    if len(idx) == 1:
        wide = wide.reindex([r[0] if isinstance(r, tuple) else r for r in rows])
    else:
        wide = wide.reindex(pd.MultiIndex.from_tuples(rows, names=idx))
    return _tidy(wide, decimals)


def _tidy(table: pd.DataFrame, decimals: int | None) -> pd.DataFrame:
    """``n`` as integers (0 where missing), the other stats as floats, rounded when asked."""
    table = table.copy()
    for col in table.columns:
        if col[-1] == "n":
            table[col] = pd.to_numeric(table[col], errors="coerce").fillna(0).astype("int64")
        else:
            table[col] = pd.to_numeric(table[col], errors="coerce").astype("float64")
            if decimals is not None:
                table[col] = table[col].round(decimals)
    return table


def is_stat_table(table: pd.DataFrame) -> bool:
    """True when ``table``'s columns are ``(<column>, stat)`` pairs covering :data:`STATS`."""
    cols = table.columns
    return (
        isinstance(cols, pd.MultiIndex) and cols.nlevels == 2 and set(cols.get_level_values(1)) == set(STATS)
    )


def _groups(table: pd.DataFrame) -> list:
    return list(dict.fromkeys(table.columns.get_level_values(0)))


def format_cell(
    mean: float,
    std: float,
    n: int,
    decimals: int = 3,
    *,
    pm: str = " ± ",
    dash: str = "—",
    missing: str = "—",
) -> str:
    """``"0.512 ± 0.013"``; ``"0.512 ± —"`` for one run (no spread); ``missing`` for no run."""
    if n == 0 or mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return missing
    spread = dash if n < 2 or std is None or math.isnan(std) else f"{std:.{decimals}f}"
    return f"{mean:.{decimals}f}{pm}{spread}"


def seeds_note(table: pd.DataFrame) -> str:
    """``"mean ± std over 3 seeds"``, ``"1 seed: a smoke test"``, or the range when n varies."""
    ns = sorted({int(v) for v in table.xs("n", axis=1, level=1).to_numpy().ravel() if v > 0})
    if not ns:
        return "no runs"
    if ns == [1]:
        return SMOKE_NOTE
    if len(ns) == 1:
        return f"mean ± std over {ns[0]} seeds"
    smoke = "; cells with n = 1 are a smoke test" if ns[0] == 1 else ""
    return f"mean ± std over {ns[0]}–{ns[-1]} seeds (n per cell in the CSV{smoke})"


def row_n(table: pd.DataFrame) -> pd.Series:
    """Per row: ``"3"``, or ``"2–3"`` when its cells differ in n (cells without runs ignored)."""
    ns = table.xs("n", axis=1, level=1)

    def label(row: pd.Series) -> str:
        vals = sorted({int(v) for v in row if v > 0})
        return "0" if not vals else (str(vals[0]) if len(vals) == 1 else f"{vals[0]}–{vals[-1]}")

    return ns.apply(label, axis=1)


def formatted(table: pd.DataFrame, decimals: int = 3, *, with_se: bool = False) -> pd.DataFrame:
    """A stat table as text for display: one ``"mean ± std"`` column per group (``with_se``: followed by
    ``" (SE 0.016)"``), then ``n`` per row; ``attrs["note"]`` is :func:`seeds_note`."""
    out = pd.DataFrame(index=table.index)
    for group in _groups(table):
        cells = table[group]
        texts = []
        for m, s, n, se in zip(cells["mean"], cells["std"], cells["n"], cells["se"]):
            text = format_cell(m, s, int(n), decimals)
            if with_se and int(n) > 0 and not math.isnan(se):
                text += f" (SE {se:.{decimals}f})"
            texts.append(text)
        out[group] = texts
    out["n"] = row_n(table)
    out.attrs["note"] = seeds_note(table)
    return out


def markdown(table: pd.DataFrame) -> str:
    """A (formatted) table as a Markdown pipe table, index levels first."""
    names = [str(n or "") for n in table.index.names]
    rows = [[*(k if isinstance(k, tuple) else (k,)), *vals] for k, vals in zip(table.index, table.to_numpy())]
    lines = ["| " + " | ".join([*names, *map(str, table.columns)]) + " |"]
    lines.append("|" + "---|" * (len(names) + len(table.columns)))
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def flat(table: pd.DataFrame) -> pd.DataFrame:
    """A stat table with one column per (group, stat): ``<group>_mean``, ``_std``, ``_n``, ``_se`` (CSV)."""
    out = table.copy()
    out.columns = [f"{group}_{stat}" for group, stat in table.columns]
    return out


def final_and_initial(
    evals: pd.DataFrame, by: Sequence[str] = ("method",), initial_by: Sequence[str] = ()
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per run, agent and metric of ``load_evals`` rows: the last evaluation (step > 0) and the step-0 one.

    Args:
        evals: ``load_evals`` rows (``run_dir, seed, agent, metric, step, value, items``) plus ``by`` columns.
        by: Columns that name a run's group (its method; the experiment too when several).
        initial_by: The part of ``by`` that changes the initial agent (e.g. the experiment, not the method):
            the step-0 evaluations are one measurement per seed within it.

    Returns:
        ``final`` with ``*by, run_dir, seed, agent, metric, value, se`` and ``initial`` with
        ``*initial_by, seed, agent, metric, value, se``; ``se`` is :func:`binomial_se` on ``items``.
    """
    items = evals["items"] if "items" in evals.columns else math.nan
    evals = evals.assign(se=binomial_se(evals["value"], pd.Series(items, index=evals.index)))
    seeds = evals["seed"].astype("object")
    evals = evals.assign(seed=seeds.where(seeds.notna(), "run " + evals["run_dir"].astype(str)))
    keys = [*by, "run_dir", "seed", "agent", "metric"]
    per_step = evals.groupby([*keys, "step"], dropna=False)[["value", "se"]].mean().reset_index()
    last = per_step.groupby(keys, dropna=False)["step"].transform("max")
    final = per_step[(per_step["step"] == last) & (last > 0)].drop(columns="step").reset_index(drop=True)
    initial = per_step[per_step["step"] == 0]
    init_keys = [*initial_by, "seed", "agent", "metric"]
    initial = initial.groupby(init_keys, dropna=False, sort=False)[["value", "se"]].mean().reset_index()
    return final, initial


# ---------------------------------------------------------------- comparing two methods


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
