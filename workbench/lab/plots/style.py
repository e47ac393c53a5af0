"""The house style of every figure, in one place: palette, dashes, markers, the Vega-Lite theme.

Series differ by colour *and* dash *and* marker, so figures stay readable in greyscale print. Methods take
their fixed colour and order from ``workbench.config.methods.METHODS``, so one method looks the same in every
figure; other series (agents, sample kinds) take :data:`PALETTE` in order.
"""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt

from workbench.config.methods import method_colors, method_label, method_sort_key

__all__ = [
    "DASHES",
    "PALETTE",
    "PANEL_HEIGHT",
    "PANEL_WIDTH",
    "SHAPES",
    "THEME",
    "finish",
    "method_style",
    "series_style",
    "setup_notebook",
]

#: Okabe-Ito colours (colour-blind safe), then black.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
#: Dash patterns paired with the colours, so series differ in greyscale too.
DASHES = ([1, 0], [6, 3], [2, 2], [8, 3, 2, 3], [4, 4], [1, 4], [10, 2], [3, 6])
#: Marker shapes paired with the colours.
SHAPES = ("circle", "square", "triangle-up", "diamond", "cross", "triangle-down", "triangle-left", "stroke")
PANEL_WIDTH, PANEL_HEIGHT = 240, 160
#: Vega-Lite config applied to every chart (also registered as the altair theme ``"hacpo"``).
THEME: dict = {
    "font": "Helvetica, Arial, sans-serif",
    "background": "white",
    "view": {"stroke": "#BBBBBB", "continuousWidth": PANEL_WIDTH, "continuousHeight": PANEL_HEIGHT},
    "axis": {"labelFontSize": 11, "titleFontSize": 12, "gridColor": "#E5E5E5", "tickColor": "#888888"},
    "header": {"labelFontSize": 12, "titleFontSize": 12},
    "legend": {"labelFontSize": 11, "titleFontSize": 12, "orient": "bottom", "symbolStrokeWidth": 2},
    "title": {"fontSize": 14, "anchor": "start"},
    "line": {"strokeWidth": 2},
    "point": {"size": 36, "filled": True},
}


@alt.theme.register("hacpo", enable=False)
def _hacpo_theme() -> alt.theme.ThemeConfig:
    return {"config": THEME}


def setup_notebook() -> None:
    """Render charts offline in JupyterLab: the ``svg`` renderer (via vl-convert) and the house theme."""
    alt.renderers.enable("svg")
    alt.theme.enable("hacpo")
    alt.data_transformers.disable_max_rows()  # long runs exceed altair's 5,000-row default


def finish(chart: alt.TopLevelMixin, title: str | None) -> alt.TopLevelMixin:
    """Set the title and apply :data:`THEME` (charts carry their style, whatever theme is enabled)."""
    if title:
        chart = chart.properties(title=title)
    return chart.configure(**THEME)


def series_style(field: str, domain: Sequence[str], title: str, colors: Sequence[str] | None = None) -> dict:
    """Colour + dash + shape encodings sharing one legend for a nominal ``field`` with this ``domain``."""
    domain = list(domain)
    colors = list(colors) if colors is not None else [PALETTE[i % len(PALETTE)] for i in range(len(domain))]
    n = len(domain)
    legend = {"title": title, "sort": domain}
    return {
        "color": alt.Color(f"{field}:N", scale=alt.Scale(domain=domain, range=colors), **legend),
        "strokeDash": alt.StrokeDash(
            f"{field}:N",
            scale=alt.Scale(domain=domain, range=[DASHES[i % len(DASHES)] for i in range(n)]),
            **legend,
        ),
        "shape": alt.Shape(
            f"{field}:N",
            scale=alt.Scale(domain=domain, range=[SHAPES[i % len(SHAPES)] for i in range(n)]),
            **legend,
        ),
    }


def method_style(algorithms: Sequence[str]) -> tuple[dict, list[str]]:
    """Styles of a ``method`` field holding method labels: display order and colours of the methods table
    (``workbench.config.methods``); returns the styles and the labels in legend order."""
    ordered = sorted(dict.fromkeys(algorithms), key=method_sort_key)
    labels = [method_label(a) for a in ordered]
    return series_style("method", labels, "method", method_colors(ordered)), labels
