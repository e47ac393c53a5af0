"""The importance-ratio tables: the paper's Table 6, and the same per mini-batch index m.

- :func:`ratio_stats_table`: Table 6 (per-step averages of the self and cross importance-ratio stats).
- :func:`ratio_by_minibatch`: Table 6 per mini-batch index m: mean ratio and in-band share of each direction
  (the summary's ``ratios_by_minibatch.csv``); :func:`ratio_by_minibatch_markdown`: the same as Markdown.

Each run gives one value per cell, its average over steps, and the cell aggregates the runs (seeds) of one
experiment and method (``workbench.lab.stats.aggregate``, without per-run standard errors). Pure pandas (no
altair, no torch).
"""

from __future__ import annotations

import pandas as pd

from workbench.config.methods import method_label, method_sort_key
from workbench.lab.stats import aggregate, stat_table
from workbench.lab.tables import _ordered, _require_columns, as_long

__all__ = ["ratio_by_minibatch", "ratio_by_minibatch_markdown", "ratio_stats_table"]

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
    `workbench.train.metrics.learner_metrics`), then mean ± std over the runs of each experiment and method.

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
