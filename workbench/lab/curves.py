"""The learning curves of a comparison, as a small table and one figure per experiment (``results/summary/``).

`curve_table` gives, per experiment × method × agent × step, the held-out accuracies of every evaluation
(greedy and avg@k) and the agent's own rollout accuracy (``train/acc``) averaged over windows of
``window`` steps, each as mean ± std over seeds with n. `write_curves` writes it as ``curves.csv`` and draws
``curves_<experiment>.svg`` (held-out avg@k, or greedy when no avg@k was logged: one panel per agent, one
line per method, a ±std band over seeds; `workbench.lab.plots.training_curves`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.core.io import atomic_write_text
from workbench.lab.frames import melt_metric
from workbench.lab.plots import save_chart, training_curves

__all__ = ["curve_table", "write_curves"]

log = logging.getLogger(__name__)

KEYS = ["experiment", "method", "agent", "metric", "step"]


def _windowed(train: pd.DataFrame, window: int) -> pd.DataFrame:
    """``train/acc`` per run averaged over steps ``1..w``, ``w+1..2w``... (w = window); step = the window's
    last logged step."""
    train = train[train["step"] >= 1].copy()
    train["window"] = (train["step"] - 1) // window
    keys = ["run_dir", "experiment", "method", "agent", "window"]
    return train.groupby(keys, as_index=False).agg(step=("step", "max"), value=("value", "mean"))


def curve_table(evals: pd.DataFrame, runs: pd.DataFrame, *, window: int = 5) -> pd.DataFrame:
    """Mean, std and n over seeds of every held-out metric at every evaluation step, and of the rollout
    accuracy in windows of ``window`` steps (metric ``train_acc@<window>``).

    Args:
        evals: ``workbench.lab.frames.load_evals`` of the runs.
        runs: ``workbench.lab.frames.load_runs`` of the same runs.
        window: Steps per rollout-accuracy window.

    Returns:
        Columns ``experiment, method, agent, metric, step, mean, std, n``.
    """
    held_out = evals.rename(columns={"algorithm": "method"})[[*KEYS, "value", "run_dir"]]
    parts = [held_out]
    if any(c.startswith("train/acc/") for c in runs.columns):
        train = melt_metric(runs, "train/acc").rename(columns={"algorithm": "method"})
        windowed = _windowed(train, window)
        windowed["metric"] = f"train_acc@{window}"
        parts.append(windowed[[*KEYS, "value", "run_dir"]])
    table = pd.concat(parts, ignore_index=True)
    grouped = table.groupby(KEYS, sort=True)["value"]
    out = grouped.agg(mean="mean", std="std", n="count").reset_index()
    out["std"] = out["std"].where(out["n"] > 1, np.nan)
    return out


def write_curves(evals: pd.DataFrame, runs: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Write ``curves.csv`` and ``curves_<experiment>.svg`` under ``out_dir``; returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = curve_table(evals, runs)
    csv = out_dir / "curves.csv"
    atomic_write_text(csv, table.round(6).to_csv(index=False))
    written = [csv]
    avgs = sorted(
        (c.split("/")[1] for c in runs.columns if c.startswith("eval/avg@")), key=lambda m: int(m[4:])
    )
    family = f"eval/{avgs[-1]}" if avgs else "eval/acc"
    for experiment, frame in runs.groupby("experiment", sort=True):
        if not any(c.startswith(family + "/") and frame[c].notna().any() for c in frame.columns):
            continue
        chart = training_curves(
            frame,
            family,
            title=f"{experiment}: held-out {family.split('/')[1]} (mean ± std over seeds)",
            y_title=f"held-out {family.split('/')[1]}",
        )
        written += save_chart(chart, out_dir / f"curves_{experiment}", formats=("svg",))
    log.info("wrote %s", ", ".join(str(p) for p in written))
    return written
