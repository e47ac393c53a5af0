"""Paper-layout tables from run results, every cell a mean ± std over seeds with n, and their export.

- :func:`paper_table`: Table 1 (rows ``"<agent> (<method>)"`` grouped per agent, the untrained ``"<agent>"``
  row first, columns = benchmarks + AVG); also Tables 2-3 when given a method subset.
- :func:`alpha_table`: Table 4 (one score per agent and α).
- :func:`ratio_stats_table`: Table 6 (per-step averages of the self and cross importance-ratio stats).
- :func:`ratio_by_minibatch`: Table 6 per mini-batch index m: mean ratio and in-band share of each direction.
- :func:`check_rerun`: a rerun's ``comparison.csv`` against the committed one, cell by cell within 2 SE.
- ``workbench.lab.latex.to_latex``: booktabs LaTeX (``0.512 ± 0.013``, n in the caption or a column) with the
  best mean per column (within each agent block) in bold, and the same table as CSV; both written atomically.

Every table is a *stat table* (``workbench.lab.stats``): columns ``(<benchmark | α | statistic>, stat)`` with
``mean, std, n, se``. Each run gives one value per cell (its last evaluation; for Table 6 its average over
steps), and the cell aggregates the runs (seeds) of that agent and method; standard errors follow
``workbench.lab.stats`` (binomial per run on the held-out items, combined over seeds).

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

__all__ = [
    "RERUN_CHECK_COLUMNS",
    "alpha_table",
    "as_long",
    "check_rerun",
    "paper_table",
    "ratio_by_minibatch",
    "ratio_by_minibatch_markdown",
    "ratio_stats_table",
    "rerun_check_line",
    "rerun_check_markdown",
]

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
            "pass one experiment per method (filter evals_df, or workbench.lab.frames.select_runs)"
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


_RATIO_STATS = ("mean", "max", "min", "range")


def ratio_stats_table(runs_df: pd.DataFrame, *, run: str | None = None, decimals: int = 5) -> pd.DataFrame:
    """Table 6 layout: per learner, the self (s_homo) and cross (s_hete) sequence-ratio statistics.

    Per run, each statistic is the average over the run's steps of the per-step statistic: mean of
    ``ratio_mean``, mean of ``ratio_max``, mean of ``ratio_min``, and range = max − min (so 1.00020 − 0.99960
    = 0.00060 as in the paper); then mean ± std over the runs (seeds). With several cross sources per
    learner, each gets its own row ``"s_hete ← <source>"``.

    Args:
        runs_df: ``load_runs`` output (wide), or ``melt_metric(df, "is")`` (long), of the seeds of one
            experiment and method.
        run: Summarize this run only (n = 1).
        decimals: Rounding of mean, std and se.

    Returns:
        A stat table indexed by (learner, ratio), columns ``(mean | max | min | range, stat)``.

    Raises:
        ValueError: No ratio metrics, an unknown run, or runs of several experiments or methods.
    """
    long = as_long(runs_df, "is")
    _require_columns(long, ["run", "learner", "source", "stat", "value"], "long 'is' frame")
    if run is not None:
        _ordered([run], long["run"], "run")
        long = long[long["run"] == run]
    for col in ("experiment", "algorithm"):
        values = list(dict.fromkeys(long[col].dropna().tolist())) if col in long.columns else []
        if len(values) > 1:
            raise ValueError(
                f"runs_df holds runs of several {col}s {values}: pick the seeds of one (or run=...)"
            )
    long = long[long["stat"].isin(["ratio_mean", "ratio_max", "ratio_min"])]
    if long.empty:
        raise ValueError("no is/<learner>/<source>/ratio_{mean,min,max} metrics in runs_df")
    per_run = long.groupby(["run", "learner", "source", "stat"], sort=False)["value"].mean().unstack("stat")
    per_run = per_run.reindex(columns=["ratio_mean", "ratio_max", "ratio_min"])
    per_run.columns = ["mean", "max", "min"]
    per_run["range"] = per_run["max"] - per_run["min"]
    tidy = per_run.reset_index().melt(
        id_vars=["run", "learner", "source"], value_vars=list(_RATIO_STATS), var_name="column"
    )
    rows, labels = [], {}
    for learner in dict.fromkeys(long["learner"].tolist()):
        sources = list(dict.fromkeys(long.loc[long["learner"] == learner, "source"].tolist()))
        cross = [s for s in sources if s != learner]
        for source in ([learner] if learner in sources else []) + cross:
            label = "s_homo" if source == learner else ("s_hete" if len(cross) == 1 else f"s_hete ← {source}")
            labels[(learner, source)] = label
            rows.append((learner, label))
    tidy["ratio"] = [labels[(a, b)] for a, b in zip(tidy["learner"], tidy["source"])]
    agg = aggregate(tidy, ["learner", "ratio", "column"], se=None)
    return stat_table(
        agg,
        ["learner", "ratio"],
        "column",
        index_order=rows,
        column_order=list(_RATIO_STATS),
        decimals=decimals,
    )


def ratio_by_minibatch(runs_df: pd.DataFrame) -> pd.DataFrame:
    """Per direction (learner ← source) and mini-batch index m: the mean sequence ratio and the share of
    samples inside the clip band (cross: [lb_m, 1]; self: GSPO's band, as 1 − its clip share).

    Each run's value is its average over steps of the per-step statistic (``is_mb/<learner>/<source>/<m>/*``,
    `workbench.train.update.learner_metrics`), then mean ± std over the runs of each experiment and method.

    Returns:
        Columns ``experiment, method, learner, source, minibatch, ratio_mean, ratio_std, in_band_mean,
        in_band_std, n``; empty when no run logged per-mini-batch statistics.
    """
    columns = ["experiment", "method", "learner", "source", "minibatch", "ratio_mean", "ratio_std"]
    columns += ["in_band_mean", "in_band_std", "n"]
    keys = [c for c in runs_df.columns if isinstance(c, str) and c.startswith("is_mb/")]
    if not keys:
        return pd.DataFrame(columns=columns)
    long = runs_df.melt(id_vars=["experiment", "algorithm", "run_dir"], value_vars=keys).dropna(
        subset=["value"]
    )
    parts = long["variable"].str.split("/", expand=True)
    long = long.assign(learner=parts[1], source=parts[2], minibatch=parts[3].astype(int), stat=parts[4])
    clipped = long["stat"] == "clip_frac"
    long.loc[clipped, "value"] = 1.0 - long.loc[clipped, "value"]
    long["stat"] = long["stat"].replace(
        {"clip_frac": "in_band", "in_range_frac": "in_band", "ratio_mean": "ratio"}
    )
    by = ["experiment", "algorithm", "learner", "source", "minibatch", "stat"]
    per_run = long.groupby([*by, "run_dir"], sort=False)["value"].mean().reset_index()
    # unstack, not pivot_table: with one seed every std is NaN and its column must stay
    agg = aggregate(per_run, by, se=None).set_index(by)[["mean", "std", "n"]].unstack("stat")
    agg = agg.dropna(subset=[("n", "ratio")])
    out = pd.DataFrame(
        {
            "ratio_mean": agg[("mean", "ratio")],
            "ratio_std": agg[("std", "ratio")],
            "in_band_mean": agg[("mean", "in_band")],
            "in_band_std": agg[("std", "in_band")],
            "n": agg[("n", "ratio")].astype("int64"),
        }
    ).reset_index()
    out = out.rename(columns={"algorithm": "method"})
    out["self"] = out["learner"] == out["source"]
    order = sorted(
        range(len(out)),
        key=lambda i: (
            out["experiment"].iat[i], method_sort_key(out["method"].iat[i]), out["learner"].iat[i],
            bool(not out["self"].iat[i]), out["source"].iat[i], int(out["minibatch"].iat[i]),
        ),
    )  # fmt: skip
    return out.iloc[order].drop(columns="self").reset_index(drop=True)[columns]


def ratio_by_minibatch_markdown(table: pd.DataFrame) -> list[str]:
    """Markdown lines of `ratio_by_minibatch`: per experiment and method, one row per direction
    (``learner ← source``) and one column per mini-batch index m, cells ``mean ratio / in-band share``."""
    lines: list[str] = []
    for (exp, method), group in table.groupby(["experiment", "method"], sort=False):
        ms = sorted(group["minibatch"].unique())
        lines += [
            "",
            f"{exp}, {method_label(method)}: mean sequence ratio / share inside the clip band, per "
            f"mini-batch index m (mean over steps and {int(group['n'].max())} seeds):",
            "",
            "| learner ← source | " + " | ".join(f"m = {m}" for m in ms) + " |",
            "|---|" + "---|" * len(ms),
        ]
        for (learner, source), rows in group.groupby(["learner", "source"], sort=False):
            cells = {
                int(r.minibatch): f"{r.ratio_mean:.3f} / {r.in_band_mean:.0%}" for r in rows.itertuples()
            }
            label = f"{learner} (self)" if learner == source else f"{learner} ← {source}"
            lines.append(f"| {label} | " + " | ".join(cells.get(int(m), "") for m in ms) + " |")
    return lines


# ---------------------------------------------------------------- a rerun against the committed summary

RERUN_METRICS = ("greedy", "avgk")
"""Metrics of ``comparison.csv`` checked per experiment, method and agent (columns ``<metric>_mean, _se``)."""
INITIAL_METRICS = ("initial_greedy", "initial_avgk")
"""Metrics checked once per experiment and agent: ``comparison.csv`` repeats them in every method's row."""
RERUN_CHECK_COLUMNS = (
    "experiment", "method", "agent", "metric", "committed_mean", "rerun_mean", "difference", "committed_se",
    "rerun_se", "tolerance", "agrees", "note",
)  # fmt: skip
"""Columns of :func:`check_rerun` (and ``rerun_check.csv``)."""


def _cells(table: pd.DataFrame, what: str, initial: bool) -> dict[tuple[str, str, str], pd.Series]:
    """Rows of a ``comparison.csv`` by (experiment, method, agent); the initial cells by (experiment, "",
    agent), from the first row of each experiment and agent."""
    keys = ["experiment", "method", "agent"]
    if not initial:
        doubled = table[table.duplicated(keys, keep=False)]
        if len(doubled):
            first = tuple(doubled[keys].iloc[0])
            raise ValueError(f"{what} has several rows for (experiment, method, agent) = {first}")
        return {(r["experiment"], r["method"], r["agent"]): r for _, r in table.iterrows()}
    firsts = table.drop_duplicates(["experiment", "agent"])
    return {(r["experiment"], "", r["agent"]): r for _, r in firsts.iterrows()}


def _value(row: pd.Series | None, column: str) -> float:
    if row is None or column not in row.index or pd.isna(row[column]):
        return math.nan
    return float(row[column])


def _label(row: pd.Series | None) -> str:
    """The avg@k a row's ``avgk`` columns hold (``""`` when unknown)."""
    value = None if row is None else row.get("avgk")
    return value if isinstance(value, str) else ""


def check_rerun(committed: pd.DataFrame, rerun: pd.DataFrame, *, within: float = 2.0) -> pd.DataFrame:
    """Each mean of a rerun's ``comparison.csv`` against the committed one: does it lie within 2 SE?

    For every cell, a metric of an (experiment, method, agent) row (``greedy``, ``avgk``) or of an
    (experiment, agent) (``initial_greedy``, ``initial_avgk``: the untrained agents, the same in every
    method's row of a pair, so checked once, with ``method`` empty), the difference of the two means is
    compared with ``within`` standard errors of that difference:

        tolerance = within · sqrt(se_committed² + se_rerun²)

    The two SEs combine like this because the committed mean and the rerun's are two independent estimates of
    the same quantity (separate training runs, each with its own seeds' spread and held-out error), and the
    variance of a difference of independent estimates is the sum of their variances. The cell *agrees* when
    |rerun − committed| ≤ tolerance: for a faithful rerun about 1 cell in 20 still lies outside by chance.
    When both summaries answer the same held-out items (``task.eval_seed`` fixed, the default), part of each
    SE (the held-out sampling error) is shared rather than independent, so the tolerance is wider than
    needed: the check is conservative, it flags only larger differences.

    Args:
        committed: The committed ``comparison.csv`` (``workbench.lab.summary.read_comparison``).
        rerun: The rerun's ``comparison.csv``, read the same way.
        within: How many standard errors of the difference a rerun may be off (2: about 95%).

    Returns:
        Columns :data:`RERUN_CHECK_COLUMNS`, one row per cell with a mean in either table, in the committed
        table's order (the rerun's own rows after). ``agrees`` is a nullable boolean: ``<NA>`` with a
        ``note`` when the cell cannot be compared (``missing in rerun``, ``missing in committed``, no
        standard error, or another avg@k); cells without a mean in both tables are left out.

    Raises:
        ValueError: A table lacks ``experiment``, ``method`` or ``agent``, or repeats a row.
    """
    keys = ["experiment", "method", "agent"]
    _require_columns(committed, keys, "the committed comparison")
    _require_columns(rerun, keys, "the rerun's comparison")
    tables = {"committed": committed, "rerun": rerun}
    experiments = list(dict.fromkeys([*committed["experiment"], *rerun["experiment"]]))
    rows = []
    for initial, metrics in ((True, INITIAL_METRICS), (False, RERUN_METRICS)):
        old, new = (_cells(t, f"the {w} comparison", initial) for w, t in tables.items())
        for key in dict.fromkeys([*old, *new]):
            a, b = old.get(key), new.get(key)
            for metric in metrics:
                mean_a, mean_b = _value(a, f"{metric}_mean"), _value(b, f"{metric}_mean")
                if math.isnan(mean_a) and math.isnan(mean_b):
                    continue
                se_a, se_b = _value(a, f"{metric}_se"), _value(b, f"{metric}_se")
                tolerance = within * math.hypot(se_a, se_b)
                difference = mean_b - mean_a
                note, agrees = "", pd.NA
                if math.isnan(mean_a) or math.isnan(mean_b):
                    note = f"missing in {'committed' if math.isnan(mean_a) else 'rerun'}"
                elif metric.endswith("avgk") and _label(a) != _label(b):
                    note = f"not the same metric: {_label(a) or '?'} vs {_label(b) or '?'}"
                elif math.isnan(tolerance):
                    note = "no standard error"
                else:
                    agrees = bool(abs(difference) <= tolerance)
                rows.append(
                    (*key, metric, mean_a, mean_b, difference, se_a, se_b, tolerance, agrees, note, initial)
                )
    out = pd.DataFrame(rows, columns=[*RERUN_CHECK_COLUMNS, "initial"])
    order = sorted(
        range(len(out)),
        key=lambda i: (experiments.index(out["experiment"].iat[i]), not out["initial"].iat[i]),
    )
    out = out.iloc[order].drop(columns="initial").reset_index(drop=True)
    out["agrees"] = out["agrees"].astype("boolean")
    return out


def rerun_check_line(check: pd.DataFrame, within: float = 2.0) -> str:
    """``"N of M cells agree within 2 SE"`` for :func:`check_rerun`'s table, then how many lie outside and
    how many could not be compared (M counts the compared cells only)."""
    compared = check["agrees"].dropna()
    agree = int(compared.sum())
    line = f"{agree} of {len(compared)} cells agree within {within:g} SE"
    if agree < len(compared):
        line += f"; {len(compared) - agree} outside (by chance about 1 in 20 may be)"
    if len(check) > len(compared):
        notes = check.loc[check["agrees"].isna(), "note"].value_counts()
        line += "; not compared: " + ", ".join(f"{n} {note}" for note, n in notes.items())
    return line


def rerun_check_markdown(check: pd.DataFrame) -> list[str]:
    """Markdown lines of :func:`check_rerun`'s table: one row per cell, means to 3 decimals, ``agrees`` as
    yes / **no** / the note of a cell not compared."""

    def number(value: float, sign: str = "") -> str:
        return "—" if pd.isna(value) else f"{value:{sign}.3f}"

    lines = [
        "| experiment | method | agent | metric | committed | rerun | Δ | ± tolerance | agrees |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in check.itertuples(index=False):
        agrees = r.note if pd.isna(r.agrees) else ("yes" if r.agrees else "**no**")
        cells = [r.experiment, r.method, r.agent, r.metric, number(r.committed_mean), number(r.rerun_mean)]
        cells += [number(r.difference, "+"), number(r.tolerance), agrees]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines
