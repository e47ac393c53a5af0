"""A rerun against the committed summary: is each mean of its ``comparison.csv`` within 2 SE of the committed
one?

- :func:`read_comparison`: a ``comparison.csv`` as `workbench.lab.summary` wrote it.
- :func:`check_rerun`: a rerun's ``comparison.csv`` against the committed one, cell by cell within 2 SE.
- :func:`write_rerun_check`: the check of a rerun's summary folder, written to its ``rerun_check.csv``.
- :func:`rerun_check_line`, :func:`rerun_check_markdown`: what ``python -m workbench summarize
  --check-against`` prints.

``docs/statistics.md`` (section 6) says how a rerun is checked and why the tolerance is what it is.
Pure pandas.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from workbench.core.io import atomic_write_text
from workbench.lab.tables import _require_columns

__all__ = [
    "RERUN_CHECK_COLUMNS",
    "check_rerun",
    "read_comparison",
    "rerun_check_line",
    "rerun_check_markdown",
    "write_rerun_check",
]

RERUN_METRICS = ("greedy", "avgk")
"""Metrics of ``comparison.csv`` checked per experiment, method and agent (columns ``<metric>_mean, _se``)."""
INITIAL_METRICS = ("initial_greedy", "initial_avgk")
"""Metrics checked once per experiment and agent: ``comparison.csv`` repeats them in every method's row."""
RERUN_CHECK_COLUMNS = (
    "experiment", "method", "agent", "metric", "committed_mean", "rerun_mean", "difference", "committed_se",
    "rerun_se", "tolerance", "agrees", "note",
)  # fmt: skip
"""Columns of :func:`check_rerun` (and ``rerun_check.csv``)."""


def read_comparison(path: str | Path) -> pd.DataFrame:
    """A ``comparison.csv`` as written: names stay text (an agent called ``NA`` is no missing value), only
    empty cells are NaN.

    Raises:
        ValueError: The file is empty or not a CSV, or lacks ``experiment``, ``method`` or ``agent``.
    """
    names = {"experiment": str, "method": str, "agent": str}
    table = pd.read_csv(path, keep_default_na=False, na_values=[""], dtype=names)
    missing = [c for c in names if c not in table.columns]
    if missing:
        raise ValueError(f"{path} lacks columns {missing}: not a comparison.csv written by summarize")
    return table


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
        committed: The committed ``comparison.csv`` (:func:`read_comparison`).
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


def write_rerun_check(committed: pd.DataFrame, summary_dir: str | Path) -> tuple[pd.DataFrame, Path]:
    """Check the summary in ``summary_dir`` (a rerun) against the ``committed`` comparison
    (:func:`check_rerun`) and write the result to ``summary_dir/rerun_check.csv``.

    Returns:
        The check's table and the path written.
    """
    check = check_rerun(committed, read_comparison(Path(summary_dir) / "comparison.csv"))
    path = Path(summary_dir) / "rerun_check.csv"
    atomic_write_text(path, check.round(6).to_csv(index=False))
    return check, path


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
