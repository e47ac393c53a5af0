"""When does sharing help? HACPO − GSPO against the number of samples behind the capability estimate P̂.

HACPO's baseline and loss weight read ω = P̂_k / P̂_j (Eqs. 7-10); P̂ averages each agent's accuracy over the
last K steps (Eq. 9), each step's from P prompts × G answers. The paper's estimate rests on 1,024 samples a
step; a small run's on a few dozen. A regime study trains HACPO and GSPO on one pair at several P (the same G,
mini-batches of P/2 prompts so the update count stays the same) and `write_regime_summary` sets, per P:

| column | what |
|---|---|
| ``delta``, ``ci_low``, ``ci_high``, ``resolved`` | HACPO − GSPO per agent and metric, paired over seeds × |
| | held-out items (`workbench.lab.verdicts`) |
| ``omega_std`` | the step-to-step std of ω^(k, j) within a run (k ≠ j), mean over runs and directions |
| ``p_hat_error``, ``p_hat_error_abs`` | P̂_k − the agent's held-out sampled accuracy (avg@k) at each |
| | evaluation step after 0: its mean, and the mean of its absolute value, over steps, agents and runs |

The held-out avg@k stands in for the agent's true accuracy at that step (the same task distribution, other
items, the same sampling temperature); the difference mixes P̂'s sampling noise with its lag (a K-step
window trails a learning agent). Experiments are named ``<pair>-p<P>``; P is read from each run's config.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from workbench.config.loading import read_run_config
from workbench.core.io import atomic_write_text
from workbench.lab.frames import load_runs
from workbench.lab.plots import regime_chart, save_chart
from workbench.lab.selection import select_runs
from workbench.lab.summary import write_summary

__all__ = ["REGIME_COLUMNS", "regime_table", "write_regime_summary"]

log = logging.getLogger(__name__)

REGIME_COLUMNS = (
    "experiment", "prompts_per_step", "samples_per_step", "agent", "metric", "delta", "ci_low", "ci_high",
    "resolved", "hacpo_mean", "gspo_mean", "n", "omega_std", "p_hat_error", "p_hat_error_abs",
)  # fmt: skip
"""Columns of ``regime.csv``."""


def _run_estimates(run: pd.DataFrame, agents: list[str]) -> dict[str, float]:
    """One HACPO run's ω step-to-step std (mean over directions) and P̂ − held-out avg@k at its evaluations."""
    omega = [
        run[f"omega/{a}/{b}"].std() for a in agents for b in agents if a != b and f"omega/{a}/{b}" in run
    ]
    errors = []
    for agent in agents:
        sampled = [c for c in run.columns if c.startswith("eval/avg@") and c.endswith(f"/{agent}")]
        if len(sampled) != 1 or f"capability/{agent}" not in run:
            continue
        column = sampled[0]
        evaluated = run[(run["step"] > 0) & run[column].notna()]
        errors += (evaluated[f"capability/{agent}"] - evaluated[column]).dropna().tolist()
    series = pd.Series(errors, dtype="float64")
    return {
        "omega_std": float(pd.Series(omega, dtype="float64").mean()),
        "p_hat_error": float(series.mean()),
        "p_hat_error_abs": float(series.abs().mean()),
    }


def regime_table(run_dirs: Iterable[Path | str], verdicts: pd.DataFrame) -> pd.DataFrame:
    """``regime.csv``: per experiment (one P) × agent × metric, HACPO − GSPO and the spread of ω and of
    P̂'s error (the module docstring's table).

    Args:
        run_dirs: The regime's finished runs (the ones ``verdicts`` was made from).
        verdicts: The ``verdicts.csv`` of those runs (`workbench.lab.summary.write_summary`).
    """
    runs = load_runs(list(run_dirs))
    hacpo = runs[runs["algorithm"] == "hacpo"]
    estimates = {}
    for experiment, frame in hacpo.groupby("experiment"):
        cfg = read_run_config(frame["run_dir"].iloc[0])
        agents = [a["name"] for a in cfg["agents"]]
        per_run = [_run_estimates(run, agents) for _, run in frame.groupby("run")]
        estimates[experiment] = pd.DataFrame(per_run).mean().to_dict() | {
            "prompts_per_step": cfg["train"]["prompts_per_step"],
            "samples_per_step": cfg["train"]["prompts_per_step"] * cfg["train"]["group_size"],
        }
    claims = verdicts[verdicts["claim"] == "HACPO ≥ GSPO"]
    rows = []
    for verdict in claims.itertuples():
        rows.append(
            {
                "experiment": verdict.experiment,
                "agent": verdict.agent,
                "metric": verdict.metric,
                "delta": verdict.delta,
                "ci_low": verdict.ci_low,
                "ci_high": verdict.ci_high,
                "resolved": verdict.resolved,
                "hacpo_mean": verdict.hacpo_mean,
                "gspo_mean": verdict.other_mean,
                "n": min(verdict.hacpo_n, verdict.other_n),
                **estimates.get(verdict.experiment, {}),
            }
        )
    table = pd.DataFrame(rows, columns=list(REGIME_COLUMNS))
    return table.sort_values(["prompts_per_step", "agent", "metric"], kind="stable").reset_index(drop=True)


def write_regime_summary(run_dirs: Iterable[Path | str], out_dir: str | Path) -> list[Path]:
    """The summary of a regime study: the comparison's files (`write_summary`), ``regime.csv`` and
    ``regime.svg`` (HACPO − GSPO against the samples a step, beside the spread of ω and of P̂'s error)."""
    out_dir = Path(out_dir)
    run_dirs = select_runs(list(run_dirs)).runs
    written = write_summary(run_dirs, out_dir)
    table = regime_table(run_dirs, pd.read_csv(out_dir / "verdicts.csv"))
    csv = out_dir / "regime.csv"
    atomic_write_text(csv, table.round(6).to_csv(index=False))
    written.append(csv)
    if len(table):
        written += save_chart(regime_chart(table), out_dir / "regime", formats=("svg",))
    log.info("wrote %s and %s", csv, out_dir / "regime.svg")
    return written
