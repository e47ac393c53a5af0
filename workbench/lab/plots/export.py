"""Chart export: PNG, SVG, self-contained HTML, PDF or the Vega-Lite JSON, written atomically and offline."""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from pathlib import Path

import altair as alt

from workbench.core.io import atomic_write_bytes

__all__ = ["chart_to_svg", "save_chart"]

logger = logging.getLogger(__name__)


def _render(chart: alt.TopLevelMixin, fmt: str, scale: float) -> bytes:
    if fmt == "png":
        buffer = io.BytesIO()
        chart.save(buffer, format="png", scale_factor=scale)
        return buffer.getvalue()
    text = io.StringIO()
    if fmt == "html":
        chart.save(text, format="html", inline=True)
    else:
        chart.save(text, format=fmt)
    return text.getvalue().encode("utf-8")


def chart_to_svg(chart: alt.TopLevelMixin) -> str:
    """The chart as an SVG document (rendered offline by vl-convert), e.g. for an ipywidgets HTML."""
    return _render(chart, "svg", 1.0).decode("utf-8")


def save_chart(
    chart: alt.TopLevelMixin,
    path_stem: str | Path,
    formats: Sequence[str] = ("png", "svg", "html"),
    *,
    scale: float = 2.0,
) -> list[Path]:
    """Write ``chart`` to ``<path_stem>.<format>`` for each format, atomically.

    Args:
        chart: Any altair chart.
        path_stem: Target path without suffix (``figures/fig3``); its directory is created.
        formats: Any of ``"png"`` (``scale``× resolution), ``"svg"``, ``"html"`` (self-contained, works
            offline), ``"pdf"``, ``"json"`` (the Vega-Lite spec).
        scale: PNG scale factor.

    Returns:
        The paths written, in the order of ``formats``.
    """
    allowed = ("png", "svg", "html", "pdf", "json")
    unknown = [f for f in formats if f not in allowed]
    if unknown or not formats:
        raise ValueError(f"formats {list(formats)} invalid: each must be one of {allowed}")
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        path = stem.with_name(f"{stem.name}.{fmt}")
        atomic_write_bytes(path, _render(chart, fmt, scale))
        written.append(path)
    logger.info("saved %s", ", ".join(str(p) for p in written))
    return written
