"""What a notebook shows of a report: every table and figure it made, and a sentence for each it could not.

`workbench.lab.report` builds tables and charts and writes them to files; a notebook cell displays them with
`gallery` (all of a report, titled, with the files it wrote) or `figure` (one chart, or a note saying why it
is absent: a cell that evaluates to ``None`` shows nothing useful). Stat tables (``workbench.lab.stats``)
appear as ``mean ± std`` with their n.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.lab import plots
from workbench.lab.stats import formatted, is_stat_table

__all__ = ["Gallery", "Note", "figure", "gallery"]


@dataclass(frozen=True)
class Note:
    """A sentence shown in place of a missing figure or table (text and HTML)."""

    text: str

    def _repr_html_(self) -> str:
        return f'<p style="color:#555"><em>{html.escape(self.text)}</em></p>'

    def __repr__(self) -> str:
        return self.text


def _absent(kind: str, name: str, present: Sequence[str]) -> Note:
    return Note(
        f"{kind} {name!r} was not drawn: the runs lack the metrics it needs (e.g. one agent has no ω, no run "
        f"was evaluated after step 0, or no HACPO run is present). Drawn: {sorted(present) or 'none'}."
    )


def figure(report: Any, name: str) -> Any:
    """``report.charts[name]``, or a `Note` saying it was not drawn and which figures were."""
    chart = report.charts.get(name)
    return chart if chart is not None else _absent("figure", name, list(report.charts))


def _table_html(name: str, table: pd.DataFrame) -> str:
    shown = formatted(table) if is_stat_table(table) else table
    note = shown.attrs.get("note", "")
    caption = f"{name}" + (f" ({note})" if note else "")
    body = shown.to_html(float_format=lambda x: f"{x:.3f}", na_rep="—", border=0)
    return f"<h4>{html.escape(caption)}</h4>{body}"


@dataclass
class Gallery:
    """Every table and chart of a report, in order, then the list of files written (renders as HTML)."""

    title: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    charts: dict[str, Any] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    expected: tuple[str, ...] = ()

    def _repr_html_(self) -> str:
        parts = [f"<h3>{html.escape(self.title)}</h3>"]
        parts += [_table_html(name, table) for name, table in self.tables.items()]
        for name, chart in self.charts.items():
            parts.append(f"<h4>{html.escape(name)}</h4>{plots.chart_to_svg(chart)}")
        missing = [n for n in self.expected if n not in self.tables and n not in self.charts]
        parts += [_absent("table or figure", n, [*self.tables, *self.charts])._repr_html_() for n in missing]
        if self.files:
            items = "".join(f"<li><code>{html.escape(str(p))}</code></li>" for p in self.files)
            parts.append(
                f"<details><summary>{len(self.files)} files written</summary><ul>{items}</ul></details>"
            )
        return "\n".join(parts)

    def __repr__(self) -> str:
        return (
            f"{self.title}: tables {list(self.tables)}, figures {list(self.charts)}, {len(self.files)} files"
        )


def gallery(report: Any, title: str, expected: Sequence[str] = ()) -> Gallery:
    """Everything ``report`` produced, for display in one cell.

    Args:
        report: A ``workbench.lab.report.Report``.
        title: Heading of the cell's output.
        expected: Table/figure names that should be there; each absent one gets a sentence.
    """
    return Gallery(title, dict(report.tables), dict(report.charts), list(report.files), tuple(expected))
