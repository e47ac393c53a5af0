"""The chart functions: Figures 3-4 and the training diagnostics, each a finished chart in the house style.

Every function takes the WIDE frame of ``workbench.lab.frames.load_runs`` (or ``explore.metrics_frame``) or
the LONG frame of ``melt_metric`` for its key family; the table in ``workbench.lab.plots`` lists them.

Runs of one method (within one experiment) are seeds of one another: every curve is their mean per step,
drawn with a ±std band when there are two or more (a single line for one run); ``n`` and ``std`` are in the
tooltips. Pass the runs of ``workbench.lab.selection.select_runs`` so that only comparable runs are averaged.
"""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import pandas as pd

from workbench.config.methods import METHODS, method_label
from workbench.lab.plots.style import (
    DASHES,
    PANEL_HEIGHT,
    PANEL_WIDTH,
    finish,
    method_style,
    series_style,
)
from workbench.lab.tables import as_long

__all__ = [
    "ablation_curves",
    "capability_chart",
    "clip_fraction_chart",
    "cost_chart",
    "cross_weight_chart",
    "omega_chart",
    "ratio_chart",
    "training_curves",
]


def _long(df: pd.DataFrame, prefix: str, needed: Sequence[str]) -> pd.DataFrame:
    long = as_long(df, prefix)
    missing = [c for c in needed if c not in long.columns]
    if missing:
        raise ValueError(f"the {prefix!r} frame lacks columns {missing}; it has {list(long.columns)}")
    long = long.dropna(subset=["value"])
    if long.empty:
        raise ValueError(f"no {prefix!r} values to plot")
    return long


def _lines(
    y: str, style: dict, y_title: str, tooltip: Sequence[str], *, points: bool = True, **y_kw
) -> list[alt.Chart]:
    """Line (colour + dash) and point (colour + shape) layers over ``step``, without data (see _facet)."""
    base = alt.Chart().encode(
        x=alt.X("step:Q", title="step"), y=alt.Y(f"{y}:Q", title=y_title, **y_kw), tooltip=list(tooltip)
    )
    layers = [base.mark_line().encode(color=style["color"], strokeDash=style["strokeDash"])]
    if points:
        layers.append(base.mark_point().encode(color=style["color"], shape=style["shape"]))
    return layers


def _rule(channel: str, at: float = 1.0) -> alt.Chart:
    """A dotted grey reference line at ``at`` on ``channel`` ("x" or "y")."""
    return alt.Chart().mark_rule(color="#888888", strokeDash=[2, 2]).encode(**{channel: alt.datum(at)})


def _facet(
    layers: Sequence[alt.Chart], data: pd.DataFrame, column: str | None, row: str | None
) -> alt.TopLevelMixin:
    """Layer data-less ``layers`` over ``data``; facet by ``column`` (wrapping at 3) and/or ``row`` when
    they take more than one value. The data sits on the top level so every panel sees only its rows."""
    chart = alt.layer(*layers, data=data).properties(width=PANEL_WIDTH, height=PANEL_HEIGHT)
    col = column if column and data[column].nunique() > 1 else None
    rw = row if row and data[row].nunique() > 1 else None
    if col is None and rw is None:
        return chart
    sort_of = {f: list(dict.fromkeys(data[f].tolist())) for f in (col, rw) if f}
    if rw is None:
        return chart.facet(facet=alt.Facet(f"{col}:N", title=None, sort=sort_of[col]), columns=3)
    kwargs = {"row": alt.Row(f"{rw}:N", title=None, sort=sort_of[rw])}
    if col:
        kwargs["column"] = alt.Column(f"{col}:N", title=None, sort=sort_of[col])
    return chart.facet(**kwargs)


def _method_field(long: pd.DataFrame) -> pd.Series:
    """The method label of each row, ``"<experiment>: <method>"`` when the frame holds several experiments."""
    labels = long["algorithm"].map(method_label)
    if "experiment" in long.columns and long["experiment"].nunique() > 1:
        labels = long["experiment"].astype(str) + ": " + labels
    return labels


def _mean_std(long: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """``value`` = the mean over runs (seeds) per ``keys``, with ``std``, ``n`` and the band ``lo``/``hi``
    = mean ∓ std (NaN for a single run: no band)."""
    data = long.groupby(list(keys), as_index=False, sort=False)["value"].agg(["mean", "std", "count"])
    data = data.rename(columns={"mean": "value", "count": "n"})
    data["lo"], data["hi"] = data["value"] - data["std"], data["value"] + data["std"]
    return data


def _band(data: pd.DataFrame, style: dict, y_title: str) -> list[alt.Chart]:
    """A translucent ±std band per series (none when every point is a single run)."""
    if not (data["n"] > 1).any():
        return []
    band = alt.Chart().mark_area(opacity=0.18)
    return [band.encode(x="step:Q", y=alt.Y("lo:Q", title=y_title), y2="hi:Q", color=style["color"])]


def _source_kind(long: pd.DataFrame) -> pd.Series:
    """``"self"`` for a learner's own samples, ``"cross ← <source>"`` for shared ones."""
    cross = "cross ← " + long["source"].astype(str)
    return cross.where(long["source"] != long["learner"], "self")


def _kind_domain(kinds: pd.Series) -> list[str]:
    return sorted(set(kinds), key=lambda k: (k != "self", k))


def training_curves(
    df: pd.DataFrame,
    metric: str = "eval/acc",
    *,
    agents: Sequence[str] | None = None,
    algorithms: Sequence[str] | None = None,
    title: str | None = None,
    y_title: str = "accuracy",
) -> alt.TopLevelMixin:
    """Figure 3: a metric over steps, one panel per agent, one line per method: the mean over its runs
    (seeds) with a ±std band.

    Args:
        df: ``load_runs`` (wide) or ``melt_metric(df, metric)`` (long: step, agent, algorithm, value).
        metric: Key family with one ``agent`` segment (``"eval/acc"``, ``"train/acc"``, ``"capability"``).
        agents: Agents to show (default all).
        algorithms: Methods to show (default all).
        title: Chart title.
        y_title: Y axis title.
    """
    long = _long(df, metric, ["step", "agent", "algorithm", "value"])
    if agents is not None:
        long = long[long["agent"].isin(agents)]
    if algorithms is not None:
        long = long[long["algorithm"].isin(algorithms)]
    if long.empty:
        raise ValueError(f"no {metric!r} values for agents={agents} algorithms={algorithms}")
    data = _mean_std(long, ["agent", "algorithm", "step"])
    style, _ = method_style(data["algorithm"].tolist())
    data["method"] = data["algorithm"].map(method_label)
    layers = _lines("value", style, y_title, data.columns, scale=alt.Scale(zero=False))
    return finish(_facet([*_band(data, style, y_title), *layers], data, "agent", None), title)


def ablation_curves(
    df: pd.DataFrame,
    metric: str = "eval/acc",
    *,
    variants: Sequence[str] | None = None,
    agents: Sequence[str] | None = None,
    title: str | None = "HACPO ablations",
) -> alt.TopLevelMixin:
    """Figure 4: HACPO against its ablations (default: ``hacpo`` and every method of ``df`` that the methods
    table lists as an ablation of it).

    Args:
        df: As for :func:`training_curves`.
        metric: Key family with one ``agent`` segment.
        variants: Algorithms to compare (e.g. ``["hacpo", "hacpo-nostepwise", "hacpo-noclip"]``).
        agents: Agents to show.
        title: Chart title.
    """
    if variants is None:
        present = df["algorithm"].dropna().unique().tolist()
        variants = [a for a in present if a in METHODS and METHODS[a].algorithm == "hacpo"]
    return training_curves(df, metric, agents=agents, algorithms=variants, title=title)


def capability_chart(
    df: pd.DataFrame, *, title: str | None = "capability (windowed accuracy, Eq. 9)"
) -> alt.TopLevelMixin:
    """P̂ per agent over steps (Eq. 9), mean over seeds with a ±std band; one panel per method."""
    long = _long(df, "capability", ["run", "algorithm", "step", "agent", "value"])
    data = _mean_std(long.assign(method=_method_field(long)), ["method", "agent", "step"])
    style = series_style("agent", list(dict.fromkeys(data["agent"])), "agent")
    layers = _lines("value", style, "capability", data.columns, scale=alt.Scale(domain=[0, 1]))
    return finish(_facet([*_band(data, style, "capability"), *layers], data, "method", None), title)


def omega_chart(
    df: pd.DataFrame, *, title: str | None = "capability ratio ω (learner / source)"
) -> alt.TopLevelMixin:
    """ω^(learner, source) = P̂_learner / P̂_source over steps (Eq. 8), log scale, a rule at 1."""
    long = _long(df, "omega", ["run", "algorithm", "step", "learner", "source", "value"])
    long = long[long["learner"] != long["source"]]
    if long.empty:
        raise ValueError("no off-diagonal omega/<learner>/<source> values to plot (one agent?)")
    long = long.assign(pair=long["learner"] + " / " + long["source"], method=_method_field(long))
    data = _mean_std(long, ["method", "pair", "step"])
    data[["lo", "hi"]] = data[["lo", "hi"]].where(data[["lo", "hi"]] > 0)  # a log scale: no band below 0
    style = series_style("pair", list(dict.fromkeys(data["pair"])), "ω")
    layers = _lines("value", style, "ω", data.columns, scale=alt.Scale(type="log"))
    return finish(_facet([*_band(data, style, "ω"), *layers, _rule("y")], data, "method", None), title)


def _is_stats(df: pd.DataFrame, stats: Sequence[str]) -> pd.DataFrame:
    long = _long(df, "is", ["run", "algorithm", "step", "learner", "source", "stat", "value"])
    long = long[long["stat"].isin(stats)]
    if long.empty:
        raise ValueError(f"no is/<learner>/<source>/{{{','.join(stats)}}} values to plot")
    return long.assign(kind=_source_kind(long), method=_method_field(long))


def ratio_chart(
    df: pd.DataFrame, *, title: str | None = "sequence ratio s: self vs cross"
) -> alt.TopLevelMixin:
    """Mean sequence ratio s of self and cross samples per learner, with a min-max band (Table 6 over time).

    One panel per learner (and a row per method when there are several); the dotted rule marks s = 1. With
    several runs (seeds) of a method, each statistic is averaged over them (the band: the mean min-max).
    """
    long = _is_stats(df, ["ratio_mean", "ratio_min", "ratio_max"])
    keys = ["method", "learner", "kind", "step"]
    data = long.pivot_table(index=keys, columns="stat", values="value", aggfunc="mean").reset_index()
    data.columns.name = None
    for stat in ("ratio_mean", "ratio_min", "ratio_max"):
        if stat not in data.columns:
            data[stat] = float("nan")
    domain = _kind_domain(data["kind"])
    style = series_style("kind", domain, "samples")
    band = (
        alt.Chart()
        .mark_area(opacity=0.18)
        .encode(x="step:Q", y=alt.Y("ratio_min:Q", title="s"), y2="ratio_max:Q", color=style["color"])
    )
    lines = _lines("ratio_mean", style, "s", data.columns, scale=alt.Scale(zero=False))
    return finish(_facet([band, *lines, _rule("y")], data, "learner", "method"), title)


def clip_fraction_chart(
    df: pd.DataFrame, *, title: str | None = "clipped and in-range fractions"
) -> alt.TopLevelMixin:
    """Per learner (a column of panels each): fraction of self/cross samples clipped (``clip_frac``) and of
    cross samples in [lower bound, 1] (``in_range_frac``: those that get gradient), a row per statistic;
    mean over seeds with a ±std band, a panel per method and learner when there are several methods."""
    long = _is_stats(df, ["clip_frac", "in_range_frac"])
    data = _mean_std(long, ["method", "learner", "kind", "stat", "step"])
    data = data.assign(panel=data["learner"])
    if data["method"].nunique() > 1:
        data = data.assign(panel=data["method"] + ", " + data["learner"])
    style = series_style("kind", _kind_domain(data["kind"]), "samples")
    layers = _lines("value", style, "fraction", data.columns, scale=alt.Scale(domain=[0, 1]))
    return finish(_facet([*_band(data, style, "fraction"), *layers], data, "panel", "stat"), title)


def cross_weight_chart(
    table: pd.DataFrame, *, title: str | None = "cross-sample weight clip(s)·sg[clip(s)]^α·ω"
) -> alt.TopLevelMixin:
    """The weight of a cross sample against its ratio s, one curve per mini-batch (stepwise bounds).

    Args:
        table: ``workbench.lab.explore.cross_weight_table`` output (pair, minibatch, lower_bound, s, weight).
        title: Chart title.
    """
    needed = ["pair", "minibatch", "lower_bound", "s", "weight"]
    missing = [c for c in needed if c not in table.columns]
    if missing or table.empty:
        raise ValueError(f"table must be a non-empty cross_weight_table frame; missing columns {missing}")
    labels = table["minibatch"].astype(str).radd("m = ") + table["lower_bound"].map(
        lambda b: f" (lb {b:.3f})" if b > float("-inf") else " (no clip)"
    )
    data = table[["pair", "s", "weight"]].assign(minibatch=labels)
    style = series_style("minibatch", list(dict.fromkeys(labels)), "mini-batch")
    lines = (
        alt.Chart()
        .mark_line()
        .encode(
            x=alt.X("s:Q", title="sequence ratio s"),
            y=alt.Y("weight:Q", title="weight"),
            color=style["color"],
            strokeDash=style["strokeDash"],
            tooltip=list(data.columns),
        )
    )
    return finish(_facet([lines, _rule("x")], data, "pair", None), title)


def cost_chart(
    df: pd.DataFrame, *, unit: str = "responses", title: str | None = "rollouts generated vs trained on"
) -> alt.TopLevelMixin:
    """Cumulative responses (or tokens) each agent generated and trained on, per method (mean over seeds,
    ±std band).

    Sharing shows as ``trained`` above ``generated``: HACPO trains on its partners' rollouts too.

    Args:
        df: ``load_runs`` (wide) or ``melt_metric(df, "cost")`` (long: agent, stat).
        unit: ``"responses"`` or ``"tokens"``.
        title: Chart title.
    """
    if unit not in ("responses", "tokens"):
        raise ValueError(f"unit must be 'responses' or 'tokens', got {unit!r}")
    long = _long(df, "cost", ["run", "algorithm", "step", "agent", "stat", "value"])
    long = long[long["stat"].isin([f"generated_{unit}", f"trained_{unit}"])]
    if long.empty:
        raise ValueError(f"no cost/<agent>/generated_{unit} or trained_{unit} values to plot")
    data = _mean_std(long, ["agent", "algorithm", "stat", "step"])
    data["kind"] = data["stat"].str.split("_").str[0]
    method, _ = method_style(data["algorithm"].tolist())
    data["method"] = data["algorithm"].map(method_label)
    dash = alt.StrokeDash(
        "kind:N",
        title="rollouts",
        scale=alt.Scale(domain=["generated", "trained"], range=[DASHES[0], DASHES[1]]),
    )
    base = alt.Chart().encode(
        x=alt.X("step:Q", title="step"),
        y=alt.Y("value:Q", title=f"cumulative {unit}"),
        tooltip=list(data.columns),
    )
    lines = base.mark_line().encode(color=method["color"], strokeDash=dash, detail="method:N")
    marks = base.mark_point().encode(color=method["color"], shape=method["shape"])
    bands = []
    if (data["n"] > 1).any():
        area = alt.Chart().mark_area(opacity=0.18)
        bands = [area.encode(x="step:Q", y="lo:Q", y2="hi:Q", color=method["color"], detail="kind:N")]
    return finish(_facet([*bands, lines, marks], data, "agent", None), title)
