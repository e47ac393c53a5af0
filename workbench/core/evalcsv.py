"""The two CSV logs of a run's held-out evaluations, written by `workbench.train.rundir.RunWriter`.

| file | columns | one row per step, agent, held-out set and |
|---|---|---|
| ``evals.csv`` | ``step, agent, benchmark, metric, value`` | metric |
| ``eval_items.csv`` | ``step, agent, benchmark, item, greedy, sampled, k`` | item |

In ``eval_items.csv``, ``greedy`` is 1 when the item's greedy response was correct and 0 if not (empty when
no greedy response was generated), ``sampled`` the number of correct responses among the ``k`` sampled ones
(empty when ``k`` is 0): enough to recompute greedy accuracy and avg@k, and to pair two runs item by item.

Both are append-only tables whose first column is the step. Each evaluation appends its rows with one atomic
rewrite (`workbench.core.io.atomic_write_text`), so a kill leaves either the table before or the table after
it, never half a row; a resume drops the rows after the checkpoint's step (`truncate`).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.core import io as wio
from workbench.core.io import to_float

__all__ = ["EVAL_COLUMNS", "ITEM_COLUMNS", "append_rows", "eval_row", "item_row", "truncate"]

EVAL_COLUMNS = ("step", "agent", "benchmark", "metric", "value")
"""Columns of ``evals.csv``."""
ITEM_COLUMNS = ("step", "agent", "benchmark", "item", "greedy", "sampled", "k")
"""Columns of ``eval_items.csv``."""
_EVAL_METRIC_RE = re.compile(r"^(greedy_acc|(avg|pass|best)@[1-9][0-9]*)$")


def append_rows(
    path: Path,
    columns: tuple[str, ...],
    step: int,
    rows: list[dict[str, Any]],
    to_row: Callable[[int, int, dict[str, Any]], list[Any]],
) -> None:
    """Append ``rows`` at ``step`` to the CSV table ``path`` (header first when new), atomically.

    Every row is checked (``to_row(step, index, row)``) before the file is touched.
    """
    body = io.StringIO()
    csv.writer(body, lineterminator="\n").writerows(to_row(step, i, row) for i, row in enumerate(rows))
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    if not old:
        header = io.StringIO()
        csv.writer(header, lineterminator="\n").writerow(columns)
        old = header.getvalue()
    wio.atomic_write_text(path, old + body.getvalue())


def truncate(path: Path, step: int) -> int:
    """Keep the header and the rows of steps ``<= step`` of the CSV table ``path``; returns rows dropped."""
    if not path.exists():
        return 0
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    header, body = rows[:1], rows[1:]
    kept = [r for r in body if r and int(r[0]) <= step]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(header + kept)
    wio.atomic_write_text(path, buf.getvalue())
    return len(body) - len(kept)


def _check_fields(what: str, step: int, index: int, row: dict[str, Any], columns: tuple[str, ...]) -> None:
    missing = [c for c in columns[1:] if c not in row]
    if missing:
        raise ValueError(f"{what}: row {index} lacks {missing}; each row needs {list(columns[1:])}")
    if "step" in row and row["step"] != step:
        raise ValueError(f"{what}: row {index} has step={row['step']!r} but step={step} was passed")


def eval_row(step: int, index: int, row: dict[str, Any]) -> list[Any]:
    """An ``evals.csv`` row from ``{agent, benchmark, metric, value}``.

    Raises:
        ValueError: A missing field, a conflicting ``step``, or an unknown metric name (allowed:
            ``greedy_acc``, ``avg@k``, ``pass@k``, ``best@k`` with an integer k >= 1).
    """
    _check_fields("append_evals", step, index, row, EVAL_COLUMNS)
    metric = str(row["metric"])
    if not _EVAL_METRIC_RE.match(metric):
        raise ValueError(
            f"append_evals: row {index} metric={metric!r}; "
            "allowed: greedy_acc, avg@k, pass@k, best@k (k >= 1)"
        )
    return [step, str(row["agent"]), str(row["benchmark"]), metric, repr(to_float(row["value"], "value"))]


def _count(value: Any, index: int, name: str, top: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise ValueError(f"append_eval_items: row {index} {name}={value!r}; allowed: an int in [0, {top}]")
    return value


def item_row(step: int, index: int, row: dict[str, Any]) -> list[Any]:
    """An ``eval_items.csv`` row from ``{agent, benchmark, item, greedy, sampled, k}``.

    Raises:
        ValueError: A missing field, a conflicting ``step``, ``greedy`` not 0, 1 or None, ``k`` not an int
            >= 0, or ``sampled`` not an int in [0, k] (None exactly when k is 0).
    """
    _check_fields("append_eval_items", step, index, row, ITEM_COLUMNS)
    greedy, sampled, k = row["greedy"], row["sampled"], row["k"]
    if greedy is not None:
        _count(greedy, index, "greedy", 1)
    k = _count(k, index, "k", 1 << 30)
    if (sampled is None) != (k == 0):
        raise ValueError(
            f"append_eval_items: row {index} sampled={sampled!r} with k={k}; sampled is None exactly when k=0"
        )
    if sampled is not None:
        _count(sampled, index, "sampled", k)
    cells = ["" if v is None else v for v in (greedy, sampled)]
    return [step, str(row["agent"]), str(row["benchmark"]), str(row["item"]), *cells, k]
