"""Paper-style reports from run directories: the tables and figures the notebooks show and save.

Each report reads runs through ``workbench.lab.frames`` only (never trains): it keeps the runs that may be
averaged over seeds (``select_runs``: finished, same config but for the seed, same code version) and lists
the others in ``excluded.csv``; builds the pandas tables (mean ± std over seeds, n) and altair charts (mean
over seeds with a ±std band), writes them under ``out_dir`` (LaTeX + CSV tables; PNG, SVG and HTML figures)
and returns them so a notebook can display them. ``05_figures`` calls these on everything under ``results/``.

A notebook cell displays a report with `gallery` (all of it, titled, with the files it wrote) or `figure`
(one chart, or a `Note` saying why it is absent: a cell that evaluates to ``None`` shows nothing useful).
Stat tables (``workbench.lab.stats``) appear as ``mean ± std`` with their n (`table_html`, which the tuning
widgets use too).
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.config.methods import methods_in
from workbench.core.io import atomic_write_text
from workbench.lab import diagnostics, latex, plots, ratios, stats, tables
from workbench.lab.explore import capability_table, cross_weight_table
from workbench.lab.frames import load_evals, load_runs
from workbench.lab.selection import EXCLUDED_COLUMNS, select_runs

__all__ = [
    "Gallery",
    "Note",
    "Report",
    "ablation_report",
    "benchmark_report",
    "figure",
    "gallery",
    "quickstart_report",
    "save_accuracy_table",
    "show",
    "table_html",
    "tuning_report",
]

log = logging.getLogger(__name__)


@dataclass
class Report:
    """What a report produced: tables and charts by name, every file written, and the runs left out."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    charts: dict[str, Any] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    excluded: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(EXCLUDED_COLUMNS)))
    """Runs found but not aggregated (``run_dir, experiment, method, seed, reason``)."""

    def add_table(
        self, name: str, build: Callable[[], pd.DataFrame], out_dir: Path, caption: str, **options: Any
    ) -> None:
        """Build a table (skipped with a warning when the runs cannot make it, e.g. they would mix
        experiments), keep it and write it as ``<out_dir>/<name>.tex`` and ``.csv``."""
        try:
            table = build()
        except ValueError as exc:
            log.warning("skipped table %s: %s", name, exc)
            return
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
    """Write the demo's accuracy table (`workbench.lab.accuracy.accuracy_table`) as ``accuracy.tex``, ``.csv``
    and ``.md``.

    The CSV has one row per (agent, metric) and columns ``<column>_mean, _std, _n, _se`` for ``initial``,
    each method and each gain; ``accuracy.md`` is the same as text to print (``0.512 ± 0.013 (SE 0.016)``,
    n per row, and the seeds note: "1 seed: a smoke test" for one seed). Runs left out of it
    (``table.attrs["excluded"]``) go to ``excluded.csv``.
    """
    caption = "Held-out accuracy per agent: before training, after each method, and the paired gain"
    files = latex.to_latex(table, Path(out_dir) / "accuracy.tex", caption, "tab:accuracy", best=None)
    shown = stats.formatted(table, with_se=True)
    text = f"{caption}: {shown.attrs['note']} (SE: standard error, workbench.lab.stats).\n\n"
    files.append(Path(out_dir) / "accuracy.md")
    atomic_write_text(files[-1], text + stats.markdown(shown))
    excluded = table.attrs.get("excluded")
    if isinstance(excluded, pd.DataFrame) and len(excluded):
        path = Path(out_dir) / "excluded.csv"
        atomic_write_text(path, excluded.to_csv(index=False))
        files.append(path)
    return files


RunDirs = Iterable[Path | str] | Mapping[str, Path | str | Sequence[Path | str]]
"""Run directories, folders of them, or ``{method: run_dir | [run_dir per seed]}`` from
``workbench.jobs.compare``."""


def _select(run_dirs: RunDirs, out_dir: Path, report: Report) -> list[Path]:
    """The runs that may be averaged; the others are logged and written to ``excluded.csv``."""
    if isinstance(run_dirs, Mapping):
        values = run_dirs.values()
        paths = [p for v in values for p in ([v] if isinstance(v, str | Path) else list(v))]
    else:
        paths = list(run_dirs)
    selection = select_runs(paths)
    report.excluded = selection.excluded
    if len(selection.excluded):
        log.warning("left out %d runs (see excluded.csv):\n%s", len(selection.excluded), selection.excluded)
        path = out_dir / "excluded.csv"
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, selection.excluded.to_csv(index=False))
        report.files.append(path)
    return selection.runs


def quickstart_report(run_dirs: RunDirs, out_dir: str | Path) -> Report:
    """Training curves, capability/ω, ratio statistics and clip fractions of a method comparison."""
    out_dir, report = Path(out_dir), Report()
    runs = _select(run_dirs, out_dir, report)
    df = load_runs(runs)
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


def benchmark_report(run_dirs: RunDirs, out_dir: str | Path) -> Report:
    """Table 1 (agent × method × benchmark, AVG) and Figure 3 (held-out accuracy over steps), plus cost."""
    out_dir, report = Path(out_dir), Report()
    runs = _select(run_dirs, out_dir, report)
    df, evals = load_runs(runs), load_evals(runs)
    if not evals.empty:
        report.add_table(
            "table1",
            lambda: tables.paper_table(evals),
            out_dir,
            "Held-out greedy accuracy per agent and method (Table 1)",
        )
        for metric in sorted(m for m in set(evals["metric"]) if m.startswith("avg@")):
            report.add_table(
                f"table1_{metric.replace('@', '')}",
                lambda metric=metric: tables.paper_table(evals, metric),
                out_dir,
                f"Held-out sampled accuracy {metric} per agent and method (Table 1)",
            )
    report.add_chart(
        "figure3", plots.training_curves, df, "eval/acc", y_title="held-out accuracy", out_dir=out_dir
    )
    report.add_chart(
        "train_acc", plots.training_curves, df, "train/acc", y_title="rollout accuracy", out_dir=out_dir
    )
    report.add_chart("cost", plots.cost_chart, df, out_dir=out_dir)
    return report


def ablation_report(run_dirs: RunDirs, out_dir: str | Path) -> Report:
    """Tables 2-4 and 6 and Figure 4 from HACPO runs and its ablations (``label`` names of the methods table).

    Which method goes in which table comes from ``workbench.config.methods.METHODS`` (its ``paper`` field).
    """
    out_dir, report = Path(out_dir), Report()
    runs = _select(run_dirs, out_dir, report)
    df, evals = load_runs(runs), load_evals(runs)
    if not evals.empty:
        present = set(evals["algorithm"])
        components = [m for m in [*methods_in("Table 2"), *methods_in("Table 3"), "hacpo"] if m in present]
        if len(components) > 1:
            report.add_table(
                "table2_3",
                lambda: tables.paper_table(evals, methods=components, include_untrained=False),
                out_dir,
                "Removing the capability-aware advantage (−Adv, Table 2) or ω in the loss (−ω, Table 3)",
            )
        alpha_evals = evals[evals["algorithm"].isin(["hacpo", *methods_in("Table 4")])]
        if alpha_evals["run_dir"].nunique() > 1:
            report.add_table(
                "table4",
                lambda: tables.alpha_table(alpha_evals),
                out_dir,
                "α sensitivity (Table 4)",
                axis="row",
            )
    hacpo_runs = df[df["algorithm"] == "hacpo"]
    if not hacpo_runs.empty:
        report.add_table(
            "table6",
            lambda: ratios.ratio_stats_table(hacpo_runs),
            out_dir,
            "Importance-ratio statistics of HACPO (Table 6)",
            best=None,
        )
    report.add_chart("figure4", plots.ablation_curves, df, "eval/acc", out_dir=out_dir)
    report.add_chart("ratios", plots.ratio_chart, df, out_dir=out_dir)
    report.add_chart("clip_fractions", plots.clip_fraction_chart, df, out_dir=out_dir)
    return report


def diagnostics_report(run_dirs: Iterable[Path | str], agent: str, out_dir: str | Path) -> Report:
    """Why ``agent`` did what it did in each run (`workbench.lab.diagnostics`): the per-source signals over
    steps (figure ``diagnostics``) and one row per run with its final held-out accuracy by difficulty, its
    length ratio and its per-source advantage sums (table ``arms``, `diagnostics.arm_table`)."""
    out_dir, report = Path(out_dir), Report()
    runs = list(run_dirs)
    report.add_chart(
        "diagnostics",
        plots.diagnostics_chart,
        diagnostics.signals_frame(runs),
        title=f"Per-source signals over steps ({agent} and its partners)",
        out_dir=out_dir,
    )
    report.add_table(
        "arms",
        lambda: diagnostics.arm_table(runs, agent),
        out_dir,
        f"{agent}: final held-out accuracy by difficulty, length ratio and advantage sums per run",
        best=None,
    )
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


# ---------------------------------------------------------------- display in a notebook


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


@dataclass(frozen=True)
class Shown:
    """A written file shown in a notebook cell as itself: Markdown rendered, an SVG drawn, else its text."""

    path: Path

    def _repr_markdown_(self) -> str | None:
        return self.path.read_text(encoding="utf-8") if self.path.suffix == ".md" else None

    def _repr_svg_(self) -> str | None:
        return self.path.read_text(encoding="utf-8") if self.path.suffix == ".svg" else None

    def __repr__(self) -> str:
        return self.path.read_text(encoding="utf-8") if self.path.is_file() else f"{self.path} (not written)"


def show(path: str | Path) -> Shown:
    """A file a report wrote (``comparison.md``, ``verdicts.svg``), for display in one cell."""
    return Shown(Path(path))


def figure(report: Report, name: str) -> Any:
    """``report.charts[name]``, or a `Note` saying it was not drawn and which figures were."""
    chart = report.charts.get(name)
    return chart if chart is not None else _absent("figure", name, list(report.charts))


def table_html(table: pd.DataFrame, caption: str, *, index: bool = True) -> str:
    """A table as an HTML heading and body: a stat table as ``mean ± std`` with its seeds note, numbers to 3
    decimals, "—" where a value does not exist (the advantage of a correct answer in an all-wrong group)."""
    shown = stats.formatted(table) if stats.is_stat_table(table) else table
    note = shown.attrs.get("note", "")
    caption += f" ({note})" if note else ""
    body = shown.to_html(index=index, float_format=lambda x: f"{x:.3f}", na_rep="—", border=0)
    return f"<h4 style='margin:0.4em 0 0.2em'>{html.escape(caption)}</h4>{body}"


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
        parts += [table_html(table, name) for name, table in self.tables.items()]
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


def gallery(report: Report, title: str, expected: Sequence[str] = ()) -> Gallery:
    """Everything ``report`` produced, for display in one cell.

    Args:
        report: A `Report`.
        title: Heading of the cell's output.
        expected: Table/figure names that should be there; each absent one gets a sentence.
    """
    return Gallery(title, dict(report.tables), dict(report.charts), list(report.files), tuple(expected))
