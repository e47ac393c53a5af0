"""Booktabs LaTeX and CSV export of the paper tables, the best value per block in bold.

A stat table (``workbench.lab.stats``: columns ``(<column>, stat)`` with mean, std, n, se) prints one cell per
column, ``0.512 $\\pm$ 0.013`` (``0.512 $\\pm$ ---`` for one run), the best *mean* in bold; n goes in the
caption when it is the same everywhere (with "1 seed: a smoke test" for single runs), else in an ``n``
column per row. Its CSV keeps the numbers apart: ``<column>_mean``, ``_std``, ``_n``, ``_se``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

import pandas as pd

from workbench.core.io import atomic_write_text
from workbench.lab.stats import flat, format_cell, is_stat_table, row_n, seeds_note

logger = logging.getLogger(__name__)

_LATEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "×": r"$\times$",
    "−": r"$-$",
    "ω": r"$\omega$",
    "α": r"$\alpha$",
    "←": r"$\leftarrow$",
    "±": r"$\pm$",
    "—": "---",
    "–": "--",
}


def _latex_escape(text: str) -> str:
    return "".join(_LATEX_ESCAPES.get(ch, ch) for ch in str(text))


def _needed_decimals(table: pd.DataFrame, most: int = 6) -> int:
    """Fewest decimals (≤ ``most``) that print every finite value of ``table`` without rounding it."""
    values = pd.to_numeric(pd.Series(table.to_numpy().ravel()), errors="coerce").dropna()
    for decimals in range(most + 1):
        if ((values - values.round(decimals)).abs() < 1e-9).all():
            return decimals
    return most


def _format_value(value: float, decimals: int) -> str:
    return "--" if pd.isna(value) else f"{value:.{decimals}f}"


def _best_mask(
    table: pd.DataFrame, best: Literal["max", "min"], axis: Literal["column", "row"]
) -> pd.DataFrame:
    """True where a value is the best of its column within its block (first index level), or of its row."""
    numeric = table.apply(pd.to_numeric, errors="coerce")
    if axis == "row":
        target = numeric.max(axis=1) if best == "max" else numeric.min(axis=1)
        return numeric.eq(target, axis=0)
    if isinstance(numeric.index, pd.MultiIndex) and numeric.index.nlevels > 1:
        grouped = numeric.groupby(level=0, sort=False)
        target = grouped.transform("max" if best == "max" else "min")
    else:
        target = numeric.max() if best == "max" else numeric.min()
    return numeric.eq(target)


def _stat_cells(table: pd.DataFrame, decimals: int) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """A stat table as LaTeX cell texts, its means (for the bold marks), and the caption's seeds note."""
    groups = list(dict.fromkeys(table.columns.get_level_values(0)))
    means = pd.DataFrame({g: table[(g, "mean")] for g in groups}, index=table.index)
    cells = pd.DataFrame(index=table.index)
    for g in groups:
        cells[g] = [
            format_cell(m, s, int(n), decimals, pm=r" $\pm$ ", dash="---", missing="--")
            for m, s, n in zip(table[(g, "mean")], table[(g, "std")], table[(g, "n")])
        ]
    ns = row_n(table)
    note = seeds_note(table)
    if ns.nunique() > 1:
        cells["n"] = ns
        note = "mean ± std over seeds, n per row"
    return cells, means, note


def _latex_lines(
    table: pd.DataFrame, mask: pd.DataFrame, decimals: int, caption: str, label: str
) -> list[str]:
    multi = isinstance(table.index, pd.MultiIndex) and table.index.nlevels > 1
    row_name = table.index.names[-1] or ""
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{_latex_escape(caption)}}}",
        rf"\label{{{label}}}",
        r"\begin{tabular}{l" + "c" * len(table.columns) + "}",
        r"\toprule",
        " & ".join([_latex_escape(row_name), *(_latex_escape(c) for c in table.columns)]) + r" \\",
        r"\midrule",
    ]
    previous_block = None
    for i, key in enumerate(table.index):
        block, name = (key[0], key[-1]) if multi else (None, key)
        if multi and previous_block is not None and block != previous_block:
            lines.append(r"\midrule")
        previous_block = block
        cells = []
        for j, value in enumerate(table.iloc[i]):
            text = value if isinstance(value, str) else _format_value(value, decimals)
            bold = j < mask.shape[1] and bool(mask.iat[i, j])
            cells.append(rf"\textbf{{{text}}}" if bold else text)
        lines.append(" & ".join([_latex_escape(name), *cells]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return lines


def to_latex(
    table: pd.DataFrame,
    path: str | Path,
    caption: str,
    label: str,
    *,
    best: Literal["max", "min"] | None = "max",
    axis: Literal["column", "row"] = "column",
    decimals: int | None = None,
    csv: bool = True,
) -> list[Path]:
    """Write ``table`` as a booktabs LaTeX table (``.tex``) and as CSV, atomically.

    The best value (``best="max"`` or ``"min"``; None for no marking) of each column is set in bold
    within each block of the first index level (per agent, as in the paper's Table 1), or of each row
    with ``axis="row"`` (Table 4). Ties are all bold. A horizontal rule separates the blocks; only the
    last index level is printed as the row name.

    Args:
        table: From ``workbench.lab.tables`` (:func:`paper_table`, :func:`alpha_table`) or
            ``workbench.lab.ratios`` (:func:`ratio_stats_table`): stat tables; or any plain numeric table.
        path: Target ``.tex`` path; the CSV goes beside it with the suffix ``.csv``.
        caption: The LaTeX caption (escaped).
        label: The LaTeX label (``"tab:main"``), written verbatim.
        best: Which extreme is best, or None.
        axis: Mark the best per column within each block (``"column"``) or per row (``"row"``).
        decimals: Digits printed (default: 3 for a stat table; else the fewest that show every value
            exactly, at most 6, so a table rounded to 3 decimals prints with 3).
        csv: Also write the CSV.

    Returns:
        The paths written (``.tex`` first).
    """
    if best not in ("max", "min", None):
        raise ValueError(f"best must be 'max', 'min' or None, got {best!r}")
    if axis not in ("column", "row"):
        raise ValueError(f"axis must be 'column' or 'row', got {axis!r}")
    if table.empty:
        raise ValueError("table is empty: nothing to export")
    path = Path(path)
    if path.suffix != ".tex":
        raise ValueError(f"path must end in .tex, got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    shown, values = table, table
    if is_stat_table(table):
        decimals = 3 if decimals is None else decimals
        shown, values, note = _stat_cells(table, decimals)
        caption = f"{caption} ({note})"
    elif decimals is None:
        decimals = _needed_decimals(table)
    mask = (
        _best_mask(values, best, axis)
        if best
        else pd.DataFrame(False, index=values.index, columns=values.columns)
    )
    atomic_write_text(path, "\n".join(_latex_lines(shown, mask, decimals, caption, label)))
    written = [path]
    if csv:
        csv_path = path.with_suffix(".csv")
        atomic_write_text(csv_path, (flat(table) if is_stat_table(table) else table).to_csv())
        written.append(csv_path)
    logger.info("wrote %s", ", ".join(str(p) for p in written))
    return written
