"""Per-item evaluation results (each run's ``eval_items.csv``) in pandas, for paired comparisons of methods.

A run's ``eval_items.csv`` (`workbench.core.evalcsv`) holds, for every evaluation step, agent, held-out set
and item, whether the greedy response was correct and how many of the k sampled ones were. `load_eval_items`
reads any set of runs, `final_items` keeps each run's last evaluation, and `item_scores` turns a metric into
one score per item (greedy: 0/1; avg@k: correct / k), whose mean over items is the metric in ``evals.csv``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from workbench.core.evalcsv import ITEM_COLUMNS
from workbench.lab.frames import ID_COLUMNS, _finish, _run_ids, find_run_dirs

__all__ = ["final_items", "item_scores", "load_eval_items", "read_items_csv"]

_DTYPES = {
    "experiment": str, "run": str, "agent": str, "benchmark": str, "item": str, "greedy": "Int64",
    "sampled": "Int64", "k": "int64",
}  # fmt: skip


def read_items_csv(path: Path | str) -> pd.DataFrame:
    """A per-item CSV (a run's ``eval_items.csv``, the summary's ``items.csv.gz``): ids stay strings (an item
    named ``NA`` too), ``greedy`` and ``sampled`` are nullable integers."""
    empty = {"greedy": [""], "sampled": [""]}
    return pd.read_csv(path, dtype=_DTYPES, keep_default_na=False, na_values=empty)


def load_eval_items(paths: Iterable[Path | str] | Path | str) -> pd.DataFrame:
    """``eval_items.csv`` of all runs, with ``run, experiment, algorithm, seed, run_dir`` prepended.

    Returns:
        Columns ``run, experiment, algorithm, seed, run_dir, step, agent, benchmark, item, greedy, sampled,
        k`` (``greedy`` and ``sampled`` nullable integers). Runs without the file (made before it existed)
        contribute no rows.

    Raises:
        FileNotFoundError: A path does not exist.
    """
    frames = []
    for run_dir in find_run_dirs(paths):
        path = run_dir / "eval_items.csv"
        if not path.is_file():
            continue
        df = read_items_csv(path)
        for col, value in reversed(_run_ids(run_dir).items()):
            df.insert(0, col, value)
        frames.append(df)
    columns = [*ID_COLUMNS, *ITEM_COLUMNS]
    return _finish(frames, columns, ["run", "run_dir", "step", "agent", "benchmark"])


def final_items(items: pd.DataFrame) -> pd.DataFrame:
    """The rows of each run's last evaluation step, for runs evaluated after step 0 (`load_eval_items`)."""
    if items.empty:
        return items
    last = items.groupby("run_dir")["step"].transform("max")
    return items[(items["step"] == last) & (last > 0)].reset_index(drop=True)


def item_scores(items: pd.DataFrame, metric: str) -> pd.DataFrame:
    """``items`` with a ``value`` column: the item's score under ``metric``.

    Args:
        items: Rows of `load_eval_items` (or of the summary's ``items.csv.gz``).
        metric: ``greedy_acc`` (value = ``greedy``, 0 or 1) or ``avg@k`` (value = ``sampled / k``, rows with
            that k only).

    Returns:
        The rows that have a score under ``metric``, with ``value`` appended.

    Raises:
        ValueError: Another metric (pass@k and best@k are not means of per-item scores of this file).
    """
    if metric == "greedy_acc":
        rows = items[items["greedy"].notna()]
        return rows.assign(value=rows["greedy"].astype("float64"))
    if metric.startswith("avg@") and metric[4:].isdigit():
        rows = items[(items["k"] == int(metric[4:])) & items["sampled"].notna()]
        return rows.assign(value=rows["sampled"].astype("float64") / rows["k"])
    raise ValueError(f"item_scores: metric={metric!r}; allowed: greedy_acc or avg@k")
