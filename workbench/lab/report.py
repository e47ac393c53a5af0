"""Paper-style reports from run directories: the tables and figures the notebooks show and save.

Each report reads runs through ``workbench.lab.frames`` only (never trains), builds the pandas tables and
altair
charts, writes them under ``out_dir`` (LaTeX + CSV tables; PNG, SVG and HTML figures) and returns them so a
notebook can display them. ``05_figures`` calls these on everything under ``results/``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.config.methods import methods_in
from workbench.core.io import atomic_write_text
from workbench.lab import latex, plots, tables
from workbench.lab.explore import capability_table, cross_weight_table
from workbench.lab.frames import find_run_dirs, load_evals, load_runs

__all__ = [
    "Report",
    "ablation_report",
    "benchmark_report",
    "quickstart_report",
    "save_accuracy_table",
    "tuning_report",
]

log = logging.getLogger(__name__)


@dataclass
class Report:
    """What a report produced: tables and charts by name, and every file written."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    charts: dict[str, Any] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)

    def add_table(self, name: str, table: pd.DataFrame, out_dir: Path, caption: str, **options: Any) -> None:
        """Keep ``table`` and write it as ``<out_dir>/<name>.tex`` and ``.csv``."""
        self.tables[name] = table
        if not table.empty:
            self.files += latex.to_latex(table, out_dir / f"{name}.tex", caption, f"tab:{name}", **options)

    def add_chart(self, name: str, build: Any, *args: Any, out_dir: Path, **kwargs: Any) -> None:
        """Build a chart (skipped with a log line when the runs lack its metrics) and save it."""
        try:
            chart = build(*args, **kwargs)
        except ValueError as exc:
            log.info("skipped figure %s: %s", name, exc)
            return
        self.charts[name] = chart
        self.files += plots.save_chart(chart, out_dir / name)


def save_accuracy_table(table: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Write the demo's per-agent accuracy table (``compare.accuracy_table``) as ``accuracy.tex``/``.csv``."""
    return latex.to_latex(
        table, Path(out_dir) / "accuracy.tex", "Held-out greedy accuracy per agent", "tab:accuracy", best=None
    )


def _runs(run_dirs: Iterable[Path | str] | dict[str, Path]) -> list[Path]:
    paths = list(run_dirs.values()) if isinstance(run_dirs, dict) else list(run_dirs)
    return find_run_dirs(paths)


def quickstart_report(run_dirs: Iterable[Path | str] | dict[str, Path], out_dir: str | Path) -> Report:
    """Training curves, capability/ω, ratio statistics and clip fractions of a method comparison."""
    out_dir, runs = Path(out_dir), _runs(run_dirs)
    df = load_runs(runs)
    report = Report()
    report.add_chart(
        "train_acc", plots.training_curves, df, "train/acc", y_title="rollout accuracy", out_dir=out_dir
    )
    report.add_chart(
        "eval_acc", plots.training_curves, df, "eval/acc", y_title="held-out accuracy", out_dir=out_dir
    )
    report.add_chart("capability", plots.capability_chart, df, out_dir=out_dir)
    report.add_chart("omega", plots.omega_chart, df, out_dir=out_dir)
    report.add_chart("ratios", plots.ratio_chart, df, out_dir=out_dir)
    report.add_chart("clip_fractions", plots.clip_fraction_chart, df, out_dir=out_dir)
    report.add_chart("cost", plots.cost_chart, df, out_dir=out_dir)
    return report


def benchmark_report(run_dirs: Iterable[Path | str] | dict[str, Path], out_dir: str | Path) -> Report:
    """Table 1 (agent × method × benchmark, AVG) and Figure 3 (held-out accuracy over steps), plus cost."""
    out_dir, runs = Path(out_dir), _runs(run_dirs)
    df, evals = load_runs(runs), load_evals(runs)
    report = Report()
    if not evals.empty:
        report.add_table(
            "table1",
            tables.paper_table(evals),
            out_dir,
            "Held-out greedy accuracy per agent and method (Table 1)",
        )
    report.add_chart(
        "figure3", plots.training_curves, df, "eval/acc", y_title="held-out accuracy", out_dir=out_dir
    )
    report.add_chart(
        "train_acc", plots.training_curves, df, "train/acc", y_title="rollout accuracy", out_dir=out_dir
    )
    report.add_chart("cost", plots.cost_chart, df, out_dir=out_dir)
    return report


def ablation_report(run_dirs: Iterable[Path | str] | dict[str, Path], out_dir: str | Path) -> Report:
    """Tables 2-4 and 6 and Figure 4 from HACPO runs and its ablations (``label`` names of the methods table).

    Which method goes in which table comes from ``workbench.config.methods.METHODS`` (its ``paper`` field).
    """
    out_dir, runs = Path(out_dir), _runs(run_dirs)
    df, evals = load_runs(runs), load_evals(runs)
    report = Report()
    if not evals.empty:
        present = set(evals["algorithm"])
        components = [m for m in [*methods_in("Table 2"), *methods_in("Table 3"), "hacpo"] if m in present]
        if len(components) > 1:
            report.add_table(
                "table2_3",
                tables.paper_table(evals, methods=components, include_untrained=False),
                out_dir,
                "Removing the capability-aware advantage (−Adv, Table 2) or ω in the loss (−ω, Table 3)",
            )
        alpha_evals = evals[evals["algorithm"].isin(["hacpo", *methods_in("Table 4")])]
        if alpha_evals["run_dir"].nunique() > 1:
            report.add_table(
                "table4", tables.alpha_table(alpha_evals), out_dir, "α sensitivity (Table 4)", axis="row"
            )
    hacpo_runs = df[df["algorithm"] == "hacpo"]
    if not hacpo_runs.empty:
        try:
            stats = tables.ratio_stats_table(hacpo_runs)
        except ValueError as exc:
            log.info("skipped table 6: %s", exc)
        else:
            report.add_table("table6", stats, out_dir, "Importance-ratio statistics (Table 6)", best=None)
    report.add_chart("figure4", plots.ablation_curves, df, "eval/acc", out_dir=out_dir)
    report.add_chart("ratios", plots.ratio_chart, df, out_dir=out_dir)
    report.add_chart("clip_fractions", plots.clip_fraction_chart, df, out_dir=out_dir)
    return report


def tuning_report(
    params: dict[str, Any], accuracies: list[float], out_dir: str | Path, *, n_minibatches: int = 4
) -> Report:
    """What HACPO's knobs do, without training: cross-sample weights per mini-batch, P̂, ω and baselines.

    Args:
        params: ``alpha, delta, delta_step, window, min_ratio, max_ratio`` (e.g. ``TuningPanel.params()``).
        accuracies: One accuracy per agent.
        out_dir: Where ``cross_weight.csv``, ``capability_*.csv`` and the weight chart go.
        n_minibatches: Mini-batches per learner per step.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = capability_table(
        [[a] for a in accuracies],
        window=params["window"],
        min_ratio=params["min_ratio"],
        max_ratio=params["max_ratio"],
    )
    coefs = {f"{r.learner} ← {r.source}": r.cross_coef for r in summary.omega.itertuples()}
    weights = cross_weight_table(params["alpha"], params["delta"], params["delta_step"], coefs, n_minibatches)
    report = Report(tables={"cross_weight": weights, "p_hat": summary.p_hat, "omega": summary.omega})
    report.tables["baselines"] = summary.baselines
    for name, table in report.tables.items():
        path = out_dir / (f"{name}.csv" if name == "cross_weight" else f"capability_{name}.csv")
        atomic_write_text(path, table.to_csv(index=False))
        report.files.append(path)
    report.add_chart("cross_weight", plots.cross_weight_chart, weights, out_dir=out_dir)
    return report
