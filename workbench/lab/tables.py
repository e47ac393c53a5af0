"""Paper-layout tables from run results, and their LaTeX/CSV export.

- :func:`paper_table`: Table 1 (rows ``"<agent> (<method>)"`` grouped per agent, the untrained ``"<agent>"``
  row first, columns = benchmarks + AVG); also Tables 2-3 when given a method subset.
- :func:`alpha_table`: Table 4 (one score per agent and α).
- :func:`ratio_stats_table`: Table 6 (per-step averages of the self and cross importance-ratio stats).
- ``workbench.lab.latex.to_latex``: booktabs LaTeX with the best value per column (within each agent block)
  in bold, and the same table as CSV; both written atomically.

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

__all__ = ["alpha_table", "as_long", "paper_table", "ratio_stats_table"]

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
    """Table 1 layout: one row per agent × method, one column per benchmark, plus AVG.

    A trained row holds each run's last evaluation (step > 0), averaged over runs (seeds) of the same
    agent and method. The untrained row (label ``"<agent>"``) holds the step-0 evaluations, averaged over
    all runs that logged one. AVG is the unweighted mean over the benchmark columns (NaN if one is
    missing), computed before rounding.

    Args:
        evals_df: Output of ``workbench.lab.frames.load_evals`` (columns run, algorithm, step, agent,
            benchmark, metric, value).
        metric: Which ``metric`` to tabulate (``"greedy_acc"``, ``"avg@4"``, ...).
        methods: Algorithms to include, in this order (default: all, paper order). Tables 2-3 are
            ``methods=["hacpo-adv", "hacpo"], include_untrained=False``.
        agents: Agents to include, in this order (default: order of appearance).
        benchmarks: Benchmark columns, in this order (default: order of appearance).
        include_untrained: Add the step-0 row of each agent when present.
        decimals: Rounding of the values.

    Returns:
        DataFrame indexed by (agent, model) where model is ``"<agent> (<method label>)"`` or ``"<agent>"``;
        columns = benchmarks + ``"AVG"``.
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
    method_order = sorted(set(trained["algorithm"]), key=method_sort_key)
    if methods is not None:
        method_order = _ordered(methods, trained["algorithm"], "methods")

    means = trained.groupby(["agent", "algorithm", "benchmark"])["value"].mean()
    base = sel[sel["step"] == 0].groupby(["agent", "benchmark"])["value"].mean()
    rows, index = [], []
    for agent in agent_order:
        if include_untrained and agent in base.index.get_level_values(0):
            rows.append([base.get((agent, b), math.nan) for b in bench_order])
            index.append((agent, agent))
        for algo in method_order:
            if (agent, algo) in means.index.droplevel(2):
                rows.append([means.get((agent, algo, b), math.nan) for b in bench_order])
                index.append((agent, f"{agent} ({method_label(algo)})"))
    table = pd.DataFrame(
        rows, columns=bench_order, index=pd.MultiIndex.from_tuples(index, names=["agent", "model"])
    )
    table["AVG"] = table[bench_order].mean(axis=1, skipna=False)
    return table.round(decimals)


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
    """Table 4 layout: one row per agent, one column per α, each cell the final score.

    α of a run comes from an ``alpha`` column of ``evals_df`` if present, else from ``hacpo.alpha`` in the
    run's ``config.yaml`` (``run_dir`` column). The score is the run's last evaluation (step > 0) on
    ``benchmark``, or the unweighted mean over benchmarks when ``benchmark`` is None, averaged over runs
    with the same α.

    Args:
        evals_df: Output of ``load_evals`` for the α-sweep runs (HACPO runs differing in α).
        metric: Which metric.
        benchmark: One benchmark, or None for the mean over all benchmarks.
        agents: Agents (rows) to include, in order (default: order of appearance).
        decimals: Rounding of the values.

    Returns:
        DataFrame indexed by agent, one column per α (ascending), named ``"α"``.
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
    # Per run: mean over benchmarks (one value if a benchmark was chosen); then mean over runs per α.
    per_run = sel.groupby(["agent", "alpha", "run"])["value"].mean()
    table = per_run.groupby(["agent", "alpha"]).mean().unstack("alpha")
    table = table.loc[agent_order].sort_index(axis=1)
    table.columns.name = "α"
    return table.round(decimals)


def ratio_stats_table(runs_df: pd.DataFrame, *, run: str | None = None, decimals: int = 5) -> pd.DataFrame:
    """Table 6 layout: per learner, the self (s_homo) and cross (s_hete) sequence-ratio statistics.

    Each column is the average over the run's steps of the per-step statistic: mean of ``ratio_mean``,
    mean of ``ratio_max``, mean of ``ratio_min``, and range = max − min (so 1.00020 − 0.99960 = 0.00060 as
    in the paper). With several cross sources per learner, each gets its own row ``"s_hete ← <source>"``.

    Args:
        runs_df: ``load_runs`` output (wide), or ``melt_metric(df, "is")`` (long).
        run: The run to summarize; required when the frame holds several runs.
        decimals: Rounding of the values.

    Returns:
        DataFrame indexed by (learner, ratio) with columns mean, max, min, range.
    """
    long = as_long(runs_df, "is")
    _require_columns(long, ["run", "learner", "source", "stat", "value"], "long 'is' frame")
    runs = list(dict.fromkeys(long["run"].tolist()))
    if run is None and len(runs) > 1:
        raise ValueError(f"runs_df holds {len(runs)} runs; pick one with run=..., one of {runs}")
    if run is not None:
        _ordered([run], long["run"], "run")
        long = long[long["run"] == run]
    long = long[long["stat"].isin(["ratio_mean", "ratio_max", "ratio_min"])]
    if long.empty:
        raise ValueError("no is/<learner>/<source>/ratio_{mean,min,max} metrics in runs_df")
    stats = long.groupby(["learner", "source", "stat"])["value"].mean().unstack("stat")
    rows, index = [], []
    for learner in dict.fromkeys(long["learner"].tolist()):
        sources = [s for s in dict.fromkeys(long.loc[long["learner"] == learner, "source"].tolist())]
        cross = [s for s in sources if s != learner]
        for source in ([learner] if learner in sources else []) + cross:
            label = "s_homo" if source == learner else ("s_hete" if len(cross) == 1 else f"s_hete ← {source}")
            s = stats.loc[(learner, source)]
            rows.append([s["ratio_mean"], s["ratio_max"], s["ratio_min"], s["ratio_max"] - s["ratio_min"]])
            index.append((learner, label))
    table = pd.DataFrame(
        rows,
        columns=["mean", "max", "min", "range"],
        index=pd.MultiIndex.from_tuples(index, names=["learner", "ratio"]),
    )
    return table.round(decimals)
