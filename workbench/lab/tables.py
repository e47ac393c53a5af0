"""Paper-layout accuracy tables from run results, every cell a mean ± std over seeds with n, and their export.

- :func:`paper_table`: Table 1 (rows ``"<agent> (<method>)"`` grouped per agent, the untrained ``"<agent>"``
  row first, columns = benchmarks + AVG); also Tables 2-3 when given a method subset.
- :func:`alpha_table`: Table 4 (one score per agent and α).
- ``workbench.lab.latex.to_latex``: booktabs LaTeX (``0.512 ± 0.013``, n in the caption or a column) with the
  best mean per column (within each agent block) in bold, and the same table as CSV; both written atomically.

The importance-ratio tables (Table 6, also per mini-batch) are in ``workbench.lab.ratios``.

Every table is a *stat table* (``workbench.lab.stats``): columns ``(<benchmark | α>, stat)`` with ``mean, std,
n, se``. Each run gives one value per cell (its last evaluation), and the cell aggregates the runs (seeds) of
that agent and method; standard errors follow ``workbench.lab.stats`` (binomial per run on the held-out
items, combined over seeds).

Pure pandas (no altair, no torch). Methods are named, labelled and ordered by the one table of methods,
``workbench.config.methods`` (``method_label``, ``method_sort_key``), so figures and tables agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import yaml

from workbench.config.methods import method_label, method_sort_key
from workbench.lab.stats import aggregate, binomial_se, stat_table

__all__ = ["alpha_table", "as_long", "paper_table"]

EVAL_COLUMNS = ("run", "algorithm", "step", "agent", "benchmark", "metric", "value")


def _require_columns(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what} lacks columns {missing}; it has {list(df.columns)}")


def as_long(df: pd.DataFrame, prefix: str) -> pd.DataFrame:
    """Long form of the metrics under ``prefix``: ``df`` itself if already long, else ``melt_metric``.

    A frame with a ``value`` column is taken as the output of ``workbench.lab.frames.melt_metric``; a wide
    frame from ``load_runs`` is melted with it.
    """
    if "value" in df.columns:
        return df
    from workbench.lab.frames import melt_metric  # results imports more than tables needs at import time

    return melt_metric(df, prefix)


def _last_trained_step(evals: pd.DataFrame) -> pd.DataFrame:
    """Rows at each run's last evaluation step, for runs evaluated after step 0."""
    last = evals.groupby("run")["step"].transform("max")
    return evals[(evals["step"] == last) & (last > 0)]


def _ordered(values: Sequence[str] | None, present: pd.Series, what: str) -> list[str]:
    """``values`` checked against what is present, or the present values in order of appearance."""
    seen = list(dict.fromkeys(present.tolist()))
    if values is None:
        return seen
    unknown = [v for v in values if v not in seen]
    if unknown:
        raise ValueError(f"{what} {unknown} not in the data; available: {seen}")
    return list(values)


def _with_se(rows: pd.DataFrame, keys: list[str], benches: list[str]) -> pd.DataFrame:
    """One value per (keys, benchmark) with its binomial se, plus an ``AVG`` benchmark per key.

    ``AVG`` is the unweighted mean over ``benches`` (NaN if one is missing); its se is ``sqrt(Σ se²) / B``.
    """
    items = rows["items"] if "items" in rows.columns else math.nan
    rows = rows.assign(items=items)
    per = (
        rows.groupby([*keys, "benchmark"], sort=False, dropna=False)[["value", "items"]].mean().reset_index()
    )
    per["se"] = binomial_se(per["value"], per["items"])
    wide = per.pivot_table(index=keys, columns="benchmark", values=["value", "se"], dropna=False)
    value = wide["value"].reindex(columns=benches)
    se = wide["se"].reindex(columns=benches)
    avg = pd.DataFrame(
        {
            "value": value.mean(axis=1, skipna=False),
            "se": (se**2).sum(axis=1, min_count=1) ** 0.5 / len(benches),
        }
    ).reset_index()
    avg.loc[se.isna().any(axis=1).to_numpy(), "se"] = math.nan
    return pd.concat([per.drop(columns="items"), avg.assign(benchmark="AVG")], ignore_index=True)


def _seed_unit(rows: pd.DataFrame) -> pd.Series:
    """The seed of each row when known (step-0 evaluations of one seed are one measurement), else its run."""
    if "seed" not in rows.columns:
        return rows["run"].astype(str)
    return rows["seed"].astype("object").where(rows["seed"].notna(), "run " + rows["run"].astype(str))


def _refuse_mixed_experiments(rows: pd.DataFrame) -> None:
    if "experiment" not in rows.columns:
        return
    spans = rows.groupby(["agent", "algorithm"])["experiment"].unique()
    mixed = {k: sorted(map(str, v)) for k, v in spans.items() if len(v) > 1}
    if mixed:
        (agent, algo), exps = next(iter(mixed.items()))
        raise ValueError(
            f"{agent} ({algo}) has runs of several experiments {exps}: they are not seeds of one another; "
            "pass one experiment per method (filter evals_df, or workbench.lab.selection.select_runs)"
        )


def paper_table(
    evals_df: pd.DataFrame,
    metric: str = "greedy_acc",
    *,
    methods: Sequence[str] | None = None,
    agents: Sequence[str] | None = None,
    benchmarks: Sequence[str] | None = None,
    include_untrained: bool = True,
    decimals: int = 3,
) -> pd.DataFrame:
    """Table 1 layout: one row per agent × method, one column group per benchmark, plus AVG.

    A trained row holds each run's last evaluation (step > 0), aggregated over the runs (seeds) of that agent
    and method: mean, std, n and se. The untrained row (label ``"<agent>"``) holds the step-0 evaluations,
    one value per seed (the runs of one seed evaluate the same initial agent). AVG is each run's unweighted
    mean over the benchmarks (NaN if one is missing), then aggregated like a benchmark.

    Args:
        evals_df: Output of ``workbench.lab.frames.load_evals`` (columns run, algorithm, step, agent,
            benchmark, metric, value; ``items`` and ``seed`` when present give standard errors and seeds).
        metric: Which ``metric`` to tabulate (``"greedy_acc"``, ``"avg@4"``, ...).
        methods: Algorithms to include, in this order (default: all, paper order). Tables 2-3 are
            ``methods=["hacpo-adv", "hacpo"], include_untrained=False``.
        agents: Agents to include, in this order (default: order of appearance).
        benchmarks: Benchmark columns, in this order (default: order of appearance).
        include_untrained: Add the step-0 row of each agent when present.
        decimals: Rounding of mean, std and se.

    Returns:
        A stat table indexed by (agent, model) where model is ``"<agent> (<method label>)"`` or ``"<agent>"``;
        columns ``(<benchmark> | "AVG", stat)`` with stat in mean, std, n, se.

    Raises:
        ValueError: Missing columns, an unknown metric, method, agent or benchmark, or one agent and method
            with runs of several experiments.
    """
    _require_columns(evals_df, EVAL_COLUMNS, "evals_df")
    sel = evals_df[evals_df["metric"] == metric]
    if sel.empty:
        raise ValueError(
            f"metric {metric!r} not in evals_df; available: {sorted(evals_df['metric'].unique())}"
        )
    agent_order = _ordered(agents, sel["agent"], "agents")
    bench_order = _ordered(benchmarks, sel["benchmark"], "benchmarks")
    trained = _last_trained_step(sel)
    _refuse_mixed_experiments(trained)
    method_order = sorted(set(trained["algorithm"]), key=method_sort_key)
    if methods is not None:
        method_order = _ordered(methods, trained["algorithm"], "methods")

    trained = trained[trained["benchmark"].isin(bench_order)]
    parts = []
    if not trained.empty:  # an evaluation of untrained models has step-0 rows only
        runs = _with_se(trained, ["agent", "algorithm", "run"], bench_order)
        parts.append(aggregate(runs, ["agent", "algorithm", "benchmark"]).assign(kind="trained"))
    untrained = sel[(sel["step"] == 0) & sel["benchmark"].isin(bench_order)]
    if include_untrained and not untrained.empty:
        untrained = untrained.assign(unit=_seed_unit(untrained))
        base = _with_se(untrained, ["agent", "unit"], bench_order)
        parts.append(aggregate(base, ["agent", "benchmark"]).assign(algorithm="", kind="untrained"))
    agg = pd.concat(parts, ignore_index=True)
    agg = agg[
        agg["agent"].isin(agent_order) & (agg["algorithm"].isin(method_order) | (agg["kind"] == "untrained"))
    ]
    agg["model"] = [
        a if k == "untrained" else f"{a} ({method_label(m)})"
        for a, m, k in zip(agg["agent"], agg["algorithm"], agg["kind"])
    ]
    present = set(zip(agg["agent"], agg["algorithm"]))
    rows = []
    for agent in agent_order:
        if (agent, "") in present:
            rows.append((agent, agent))
        rows += [(agent, f"{agent} ({method_label(m)})") for m in method_order if (agent, m) in present]
    return stat_table(
        agg,
        ["agent", "model"],
        "benchmark",
        index_order=rows,
        column_order=[*bench_order, "AVG"],
        decimals=decimals,
    )


def _read_alpha(run_dir: str) -> float:
    """``hacpo.alpha`` from a run's ``config.yaml``."""
    path = Path(run_dir) / "config.yaml"
    try:
        return float(yaml.safe_load(path.read_text(encoding="utf-8"))["hacpo"]["alpha"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError) as err:
        raise ValueError(f"cannot read hacpo.alpha from {path}: {err!r}") from err


def alpha_table(
    evals_df: pd.DataFrame,
    metric: str = "greedy_acc",
    *,
    benchmark: str | None = None,
    agents: Sequence[str] | None = None,
    decimals: int = 3,
) -> pd.DataFrame:
    """Table 4 layout: one row per agent, one column group per α, each cell the final score over seeds.

    α of a run comes from an ``alpha`` column of ``evals_df`` if present, else from ``hacpo.alpha`` in the
    run's ``config.yaml`` (``run_dir`` column). A run's score is its last evaluation (step > 0) on
    ``benchmark``, or its unweighted mean over benchmarks when ``benchmark`` is None; runs with the same α
    are aggregated (mean, std, n, se).

    Args:
        evals_df: Output of ``load_evals`` for the α-sweep runs (HACPO runs differing in α).
        metric: Which metric.
        benchmark: One benchmark, or None for the mean over all benchmarks.
        agents: Agents (rows) to include, in order (default: order of appearance).
        decimals: Rounding of mean, std and se.

    Returns:
        A stat table indexed by agent, columns ``(α, stat)`` with α ascending (first level named ``"α"``).
    """
    _require_columns(evals_df, EVAL_COLUMNS, "evals_df")
    sel = _last_trained_step(evals_df[evals_df["metric"] == metric])
    if sel.empty:
        raise ValueError(f"no evaluation after step 0 with metric {metric!r} in evals_df")
    if benchmark is not None:
        _ordered([benchmark], sel["benchmark"], "benchmark")
        sel = sel[sel["benchmark"] == benchmark]
    if "alpha" not in sel.columns:
        _require_columns(sel, ["run_dir"], "evals_df (without an alpha column)")
        alphas = {run_dir: _read_alpha(run_dir) for run_dir in sel["run_dir"].unique()}
        sel = sel.assign(alpha=sel["run_dir"].map(alphas))
    agent_order = _ordered(agents, sel["agent"], "agents")
    benches = list(dict.fromkeys(sel["benchmark"]))
    runs = _with_se(sel, ["agent", "alpha", "run"], benches)
    runs = runs[runs["benchmark"] == ("AVG" if benchmark is None else benchmark)]
    agg = aggregate(runs, ["agent", "alpha"])
    table = stat_table(
        agg,
        ["agent"],
        "alpha",
        index_order=agent_order,
        column_order=sorted(set(agg["alpha"])),
        decimals=decimals,
    )
    table.columns = table.columns.set_names(["α", "stat"])
    return table
