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

Two methods are compared (the paired bootstrap on the same held-out items, the unpaired rule without them)
in ``workbench.lab.paired``.
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
    "row_n",
    "seeds_note",
    "stat_table",
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
