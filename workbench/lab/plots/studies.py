"""The figures of studies, drawn from their summary tables: a run's per-source signals (`diagnostics_chart`),
every claim's Δ with its interval (`verdict_chart`) and the regime map (`regime_chart`)."""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import pandas as pd

from workbench.lab.plots.charts import _lines, _rule
from workbench.lab.plots.style import PANEL_HEIGHT, PANEL_WIDTH, finish, series_style

__all__ = ["diagnostics_chart", "regime_chart", "verdict_chart"]


def diagnostics_chart(
    frame: pd.DataFrame,
    *,
    panels: Sequence[str] | None = None,
    title: str | None = "Per-source signals over steps",
) -> alt.TopLevelMixin:
    """One figure of `workbench.lab.diagnostics.signals_frame`: a row per panel (its y title), a column per
    run, each series a line over steps; the length-ratio panel has a reference line at 1.

    Args:
        frame: Columns ``label, step, panel, series, value``.
        panels: Which panels, in order; None = every panel of ``frame``, in its order.
        title: Figure title.

    Raises:
        ValueError: No values for the panels.
    """
    order = list(dict.fromkeys(frame["panel"])) if panels is None else list(panels)
    frame = frame[frame["panel"].isin(order)]
    if frame.empty:
        raise ValueError(f"no values for the panels {order} in these runs")
    columns = sorted(set(frame["label"]))
    rows = []
    for panel in (p for p in order if p in set(frame["panel"])):
        data = frame[frame["panel"] == panel]
        style = series_style("series", sorted(set(data["series"])), panel)
        layers = _lines(
            "value", style, panel, ["label", "series", "step", alt.Tooltip("value:Q", format=".3f")]
        )
        if panel.startswith("length ratio"):
            layers.append(_rule("y"))
        chart = alt.layer(*layers, data=data).properties(width=PANEL_WIDTH, height=PANEL_HEIGHT)
        rows.append(chart.facet(column=alt.Column("label:N", title=None, sort=columns)))
    figure = alt.vconcat(*rows).resolve_scale(
        color="independent", strokeDash="independent", shape="independent"
    )
    return finish(figure, title)


def verdict_chart(verdicts: pd.DataFrame, *, title: str | None = None) -> alt.TopLevelMixin:
    """Every claim's Δ = method − baseline with its 95% interval (`workbench.lab.verdicts`), a row per claim,
    a panel per agent and metric; black circles where the interval excludes 0 (resolved), grey diamonds where
    it does not.

    Args:
        verdicts: Rows of ``verdicts.csv`` (``experiment, agent, metric, claim, delta, ci_low, ci_high,
            resolved``).
        title: Figure title.

    Raises:
        ValueError: No claim with a Δ.
    """
    data = verdicts.dropna(subset=["delta"]).copy()
    if data.empty:
        raise ValueError("no verdict with a Δ to draw")
    data["panel"] = data["agent"].astype(str) + " · " + data["metric"].astype(str)
    if data["experiment"].nunique() > 1:
        data["panel"] = data["experiment"].astype(str) + ": " + data["panel"]
    data["verdict"] = data["resolved"].map({True: "resolved", False: "within noise"})
    claims = list(dict.fromkeys(data["claim"]))
    y = alt.Y("claim:N", sort=claims, title=None)
    rule = alt.Chart().mark_rule().encode(x=alt.X("ci_low:Q", title="Δ (95% CI)"), x2="ci_high:Q", y=y)
    verdict = alt.Scale(domain=["resolved", "within noise"], range=["#000000", "#999999"])
    point = (
        alt.Chart()
        .mark_point(size=60, filled=True)
        .encode(
            x="delta:Q",
            y=y,
            color=alt.Color("verdict:N", scale=verdict, title="verdict"),
            shape=alt.Shape("verdict:N", scale=alt.Scale(domain=verdict.domain, range=["circle", "diamond"])),
            tooltip=["claim", "panel", alt.Tooltip("delta:Q", format="+.3f"), "ci_low", "ci_high", "p_value"],
        )
    )
    chart = alt.layer(rule, point, _rule("x", 0.0), data=data).properties(
        width=PANEL_WIDTH, height=14 * len(claims)
    )
    return finish(chart.facet(facet=alt.Facet("panel:N", title=None), columns=2), title)


def regime_chart(
    table: pd.DataFrame, *, title: str | None = "Sharing against the samples behind P̂"
) -> alt.TopLevelMixin:
    """A regime study (`workbench.lab.regime.regime_table`): HACPO − GSPO with its 95% interval against the
    samples a step (P × G, log scale), a panel per metric and a colour per agent; below it, the step-to-step
    std of ω and the mean |P̂ − held-out avg@k| at each P.

    Raises:
        ValueError: An empty table.
    """
    if table.empty:
        raise ValueError("no regime rows to draw")
    x = alt.X(
        "samples_per_step:Q", scale=alt.Scale(type="log", base=2), title="samples behind P̂ a step (P × G)"
    )
    agents = sorted(set(table["agent"]))
    style = series_style("agent", agents, "agent")
    band = (
        alt.Chart()
        .mark_rule()
        .encode(x=x, y=alt.Y("ci_low:Q", title="HACPO − GSPO (95% CI)"), y2="ci_high:Q", color=style["color"])
    )
    line = (
        alt.Chart()
        .mark_line(point=True)
        .encode(x=x, y="delta:Q", color=style["color"], strokeDash=style["strokeDash"])
    )
    deltas = (
        alt.layer(band, line, _rule("y", 0.0), data=table)
        .properties(width=PANEL_WIDTH, height=PANEL_HEIGHT)
        .facet(column=alt.Column("metric:N", title=None))
    )
    spread = table.drop_duplicates("experiment").melt(
        id_vars=["samples_per_step"], value_vars=["omega_std", "p_hat_error_abs"], var_name="measure"
    )
    spread["measure"] = spread["measure"].map(
        {"omega_std": "std of ω over steps", "p_hat_error_abs": "|P̂ − avg@k|"}
    )
    measures = series_style("measure", ["std of ω over steps", "|P̂ − avg@k|"], "spread")
    lower = (
        alt.Chart(spread)
        .mark_line(point=True)
        .encode(
            x=x,
            y=alt.Y("value:Q", title="spread"),
            color=measures["color"],
            strokeDash=measures["strokeDash"],
        )
        .properties(width=PANEL_WIDTH, height=PANEL_HEIGHT)
    )
    return finish(
        alt.vconcat(deltas, lower).resolve_scale(color="independent", strokeDash="independent"), title
    )
