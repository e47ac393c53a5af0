"""ipywidgets panels for tuning HACPO in JupyterLab: see what the knobs do, launch a short run, watch it.

- :class:`TuningPanel`: sliders and fields for α, δ, δ_step, the capability window K, the ω clamp and two
  (or more) agents' accuracies. On every change it redraws, without training, the weight a cross sample
  gets against its ratio s in each mini-batch of a step (``explore.cross_weight_table``) and what P̂, ω
  and the capability baseline make of the accuracies (``explore.capability_table``). Its "launch" button
  calls the function it was given with the chosen values; its :class:`RunMonitor` shows the run.
- :class:`RunMonitor`: takes the trainer's per-step metric dicts (``on_step``) and redraws accuracy,
  capability, ω, self/cross ratio statistics and clip fractions as the run proceeds.

Charts are SVG strings rendered offline (vl-convert) inside ``ipywidgets.HTML``, so they show in JupyterLab
without a Vega-Lite extension and the panels work headless (the tests build them without a display). A bad
value never raises out of a callback: the message appears in the panel.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ipywidgets as w
import pandas as pd

from workbench.core.io import atomic_write_text
from workbench.lab import plots
from workbench.lab.explore import capability_table, cross_weight_table, metrics_frame, validate_tuning
from workbench.lab.report import Report, table_html

logger = logging.getLogger(__name__)

__all__ = ["RunMonitor", "TuningPanel"]

_STYLE = {"description_width": "9em"}
_LAYOUT = w.Layout(width="26em")


def _message(text: str, *, error: bool = False) -> str:
    color = "#B00020" if error else "#333333"
    return f'<div style="color:{color}; white-space:pre-wrap">{html.escape(text)}</div>'


# (pane title, chart builder) of the RunMonitor, in display order.
_MONITOR_CHARTS: tuple[tuple[str, Callable[[pd.DataFrame], Any]], ...] = (
    ("accuracy", lambda df: plots.training_curves(df, "train/acc", y_title="rollout accuracy", title=None)),
    ("held-out", lambda df: plots.training_curves(df, "eval/acc", y_title="held-out accuracy", title=None)),
    ("capability", plots.capability_chart),
    ("ω", plots.omega_chart),
    ("ratios", plots.ratio_chart),
    ("clip fractions", plots.clip_fraction_chart),
)


class RunMonitor:
    """Live charts of a run, fed one metric dict per step by the trainer (``train(..., on_step=m.on_step)``).

    Args:
        run: Label of the run in the charts.
        algorithm: The run's algorithm (method label and colour).
        redraw_every: Redraw after every this many steps (the visible chart only: ~0.1-0.4 s a step).

    Attributes:
        records: The metric dicts received so far.
        widget: The ipywidgets box to display (``display(monitor)`` works too).
    """

    def __init__(self, *, run: str = "live", algorithm: str = "hacpo", redraw_every: int = 1) -> None:
        if not isinstance(redraw_every, int) or redraw_every < 1:
            raise ValueError(f"redraw_every = {redraw_every!r} is not allowed: an integer >= 1")
        self.run, self.algorithm, self.redraw_every = run, algorithm, redraw_every
        self.records: list[dict[str, Any]] = []
        self.status = w.HTML(_message("waiting for the first step"))
        self.panes = {name: w.HTML() for name, _ in _MONITOR_CHARTS}
        self.tabs = w.Tab(children=list(self.panes.values()), titles=list(self.panes))
        self.tabs.observe(self._on_tab, names="selected_index")
        self._stale: set[str] = set()  # panes whose chart is older than the records
        self.widget = w.VBox([self.status, self.tabs])

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    @property
    def frame(self) -> pd.DataFrame:
        """The records as the wide frame of ``load_runs`` (one row per step)."""
        return metrics_frame(self.records, run=self.run, algorithm=self.algorithm)

    def reset(self, *, run: str | None = None, algorithm: str | None = None) -> None:
        """Forget the records (a new run starts); optionally relabel it."""
        self.records = []
        self.run = run or self.run
        self.algorithm = algorithm or self.algorithm
        self.status.value = _message("waiting for the first step")
        for pane in self.panes.values():
            pane.value = ""
        self._stale = set()

    def on_step(self, metrics: Mapping[str, Any]) -> None:
        """Record one step's metrics and redraw every ``redraw_every`` steps. Never raises: a malformed
        dict is reported in the status line and skipped, so a display problem cannot stop training."""
        try:
            record = dict(metrics)
            metrics_frame([record])  # validates the step
        except (TypeError, ValueError) as err:
            self.status.value = _message(f"skipped a metrics record: {err}", error=True)
            logger.warning("RunMonitor skipped a metrics record: %s", err)
            return
        self.records.append(record)
        if len(self.records) % self.redraw_every == 0:
            self.redraw()

    def _selected(self) -> str:
        index = self.tabs.selected_index
        return list(self.panes)[index if index is not None else 0]

    def _on_tab(self, change: Any = None) -> None:
        name = self._selected()
        if name in self._stale and self.records:
            self._draw(name, self.frame)
            self._stale.discard(name)

    def _draw(self, name: str, frame: pd.DataFrame) -> None:
        try:
            self.panes[name].value = plots.chart_to_svg(dict(_MONITOR_CHARTS)[name](frame))
        except ValueError as err:  # e.g. no eval step yet, or ω with a single agent
            self.panes[name].value = _message(f"{name}: {err}")

    def redraw(self, *, all_panes: bool = False) -> None:
        """Rebuild the visible chart (or all) from the records; the others are drawn when their tab is
        opened, so a step costs one rendering. A chart whose metrics are absent says so in its pane."""
        if not self.records:
            return
        frame = self.frame
        names = list(self.panes) if all_panes else [self._selected()]
        for name in names:
            self._draw(name, frame)
        self._stale = set(self.panes) - set(names)
        self.status.value = _message(f"step {int(frame['step'].max())} ({len(frame)} steps received)")


class TuningPanel:
    """Tune HACPO's α, δ, δ_step, K and the ω clamp, and see their effect at once, without training.

    Args:
        launch: Called with :meth:`params` when "launch short run" is pressed (e.g. a function that
            builds a config with these values and calls ``train(config, on_step=panel.monitor.on_step)``);
            None disables the button.
        agents: Agent names (two or more).
        accuracies: Initial accuracy of each agent, in [0, 1].
        alpha: Initial α.
        delta: Initial δ.
        delta_step: Initial δ_step.
        window: Initial capability window K.
        min_ratio: Initial lower clamp of ω.
        max_ratio: Initial upper clamp of ω.
        n_minibatches: Mini-batches per step shown in the weight chart.
        steps: Initial length of the short run.
        monitor: The monitor that shows the launched run (default: a new :class:`RunMonitor`).

    Attributes:
        widget: The ipywidgets box to display (``display(panel)`` works too).
        message: Status and error line; chart: the weight chart (SVG); tables: P̂, ω and baselines.
    """

    def __init__(
        self,
        launch: Callable[[dict[str, Any]], None] | None = None,
        *,
        agents: Sequence[str] = ("agent-0", "agent-1"),
        accuracies: Sequence[float] = (0.3, 0.6),
        alpha: float = 1.0,
        delta: float = 0.2,
        delta_step: float = 0.025,
        window: int = 5,
        min_ratio: float = 0.1,
        max_ratio: float = 10.0,
        n_minibatches: int = 4,
        steps: int = 20,
        monitor: RunMonitor | None = None,
    ) -> None:
        if len(agents) < 2 or len(agents) != len(accuracies):
            raise ValueError(
                f"need >= 2 agents with one accuracy each, got agents={agents} accuracies={accuracies}"
            )
        self.agents, self.launch = list(agents), launch
        slider = {"continuous_update": False, "style": _STYLE, "layout": _LAYOUT}
        self.alpha = w.FloatSlider(value=alpha, min=0.0, max=4.0, step=0.1, description="α", **slider)
        self.delta = w.FloatSlider(value=delta, min=0.0, max=0.9, step=0.01, description="δ", **slider)
        self.delta_step = w.FloatSlider(
            value=delta_step,
            min=0.0,
            max=0.1,
            step=0.005,
            readout_format=".3f",
            description="δ_step",
            **slider,
        )
        self.window = w.IntSlider(value=window, min=1, max=50, description="window K", **slider)
        self.n_minibatches = w.IntSlider(
            value=n_minibatches, min=1, max=16, description="mini-batches", **slider
        )
        field = {"style": _STYLE, "layout": _LAYOUT}
        self.min_ratio = w.FloatText(value=min_ratio, description="ω clamp min", **field)
        self.max_ratio = w.FloatText(value=max_ratio, description="ω clamp max", **field)
        self.accuracies = [
            w.FloatSlider(value=a, min=0.0, max=1.0, step=0.01, description=f"accuracy {n}", **slider)
            for n, a in zip(self.agents, accuracies)
        ]
        self.steps = w.IntText(value=steps, description="run steps", **field)
        self.launch_button = w.Button(description="launch short run", disabled=launch is None, icon="play")
        self.message, self.chart, self.tables = w.HTML(), w.HTML(), w.HTML()
        self.summary: Any = None  # the last drawn capability summary and weight table (`save` writes them)
        self.weights: pd.DataFrame | None = None
        self.monitor = monitor or RunMonitor()
        for control in self._controls():
            control.observe(self._on_change, names="value")
        self.launch_button.on_click(self._on_launch)
        knobs = w.VBox([self.alpha, self.delta, self.delta_step, self.n_minibatches])
        capability = w.VBox([self.window, self.min_ratio, self.max_ratio, *self.accuracies])
        run = w.HBox([self.steps, self.launch_button])
        self.widget = w.VBox(
            [w.HBox([knobs, capability]), self.message, self.chart, self.tables, run, self.monitor.widget]
        )
        self.refresh()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def _controls(self) -> list[w.ValueWidget]:
        fixed = [self.alpha, self.delta, self.delta_step, self.window, self.n_minibatches]
        return [*fixed, self.min_ratio, self.max_ratio, *self.accuracies]

    def params(self) -> dict[str, Any]:
        """The chosen hyperparameters (validated): alpha, delta, delta_step, window, min_ratio, max_ratio
        (the config's ``hacpo`` section names) and steps (the run length).

        Raises:
            ValueError: A value is not allowed (the message names it and the allowed range).
        """
        values = {
            "alpha": float(self.alpha.value),
            "delta": float(self.delta.value),
            "delta_step": float(self.delta_step.value),
            "window": int(self.window.value),
            "min_ratio": float(self.min_ratio.value),
            "max_ratio": float(self.max_ratio.value),
        }
        validate_tuning(**values)
        steps = self.steps.value
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps = {steps!r} is not allowed: an integer >= 1")
        return {**values, "steps": steps}

    def accuracy_history(self) -> list[list[float]]:
        """Per agent: the rollout accuracies (``train/acc``) of the monitored run, then the sliders' values.

        Before any run this is one step (the sliders), so P̂ equals the accuracies; after a run the window
        K decides how many of its last steps P̂ averages.
        """
        current = [float(a.value) for a in self.accuracies]
        columns = [f"train/acc/{name}" for name in self.agents]
        frame = self.monitor.frame if self.monitor.records else None
        if frame is None or any(c not in frame.columns for c in columns):
            return [[value] for value in current]
        past = frame[columns].dropna()
        return [[*past[c].tolist(), value] for c, value in zip(columns, current)]

    def _on_change(self, change: Any = None) -> None:
        self.refresh()

    def refresh(self) -> bool:
        """Recompute the weight chart and the capability tables from the current values.

        Returns:
            True when drawn; False when a value is invalid (the message says which; nothing raises).
        """
        try:
            params = self.params()
            summary = capability_table(
                self.accuracy_history(),
                window=params["window"],
                min_ratio=params["min_ratio"],
                max_ratio=params["max_ratio"],
                agents=self.agents,
            )
            coefs = {f"{r.learner} ← {r.source}": r.cross_coef for r in summary.omega.itertuples()}
            table = cross_weight_table(
                params["alpha"], params["delta"], params["delta_step"], coefs, int(self.n_minibatches.value)
            )
            svg = plots.chart_to_svg(plots.cross_weight_chart(table))
        except ValueError as err:
            self.message.value = _message(f"not drawn: {err}", error=True)
            return False
        self.summary, self.weights = summary, table
        self.chart.value = svg
        self.tables.value = (
            table_html(
                summary.p_hat,
                "capability P̂ (Eq. 9): mean of the last K accuracies (the run's, then the sliders')",
                index=False,
            )
            + table_html(
                summary.omega,
                "ω: omega_baseline weights the source in the learner's baseline; "
                "cross_coef scales the source's samples in the learner's loss",
                index=False,
            )
            + table_html(
                summary.baselines,
                "learner baselines μ̂ and advantages for example reward groups "
                "(— : the group has no correct, or no wrong, response)",
                index=False,
            )
        )
        self.message.value = _message(
            "lower bounds: "
            + ", ".join(
                f"m={m}: {b:.3f}" for m, b in table.groupby("minibatch")["lower_bound"].first().items()
            )
        )
        return True

    def save(self, out_dir: str | Path) -> Report:
        """Write the values shown now, agents named, under ``out_dir``: ``cross_weight.csv``,
        ``capability_p_hat.csv``, ``capability_omega.csv``, ``capability_baselines.csv`` and the weight chart
        (PNG, SVG, HTML); return them as a report.

        Raises:
            ValueError: A value is invalid (the panel's message says which).
        """
        if not self.refresh():
            raise ValueError(self.message.value)
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        report = Report(tables={"cross_weight": self.weights})
        report.tables |= {
            f"capability_{n}": getattr(self.summary, n) for n in ("p_hat", "omega", "baselines")
        }
        for name, table in report.tables.items():
            atomic_write_text(out_dir / f"{name}.csv", table.to_csv(index=False))
            report.files.append(out_dir / f"{name}.csv")
        report.add_chart("cross_weight", plots.cross_weight_chart, self.weights, out_dir=out_dir)
        return report

    def _on_launch(self, button: Any = None) -> None:
        """Validate, reset the monitor and call ``launch(params)``; errors are shown, not raised."""
        if self.launch is None:
            self.message.value = _message("no launch function was given to this panel", error=True)
            return
        try:
            params = self.params()
        except ValueError as err:
            self.message.value = _message(f"not launched: {err}", error=True)
            return
        self.monitor.reset()
        self.launch_button.disabled = True
        self.message.value = _message(f"running with {params} ...")
        try:
            self.launch(params)
        except Exception as err:  # a UI callback: show what went wrong and keep the panel usable
            logger.exception("the launched run failed")
            self.message.value = _message(f"run failed: {type(err).__name__}: {err}", error=True)
        else:
            self.monitor.redraw(all_panes=True)
            self.refresh()  # P̂ now averages the run's last K accuracies
            self.message.value = _message(f"run finished ({len(self.monitor.records)} steps received)")
        finally:
            self.launch_button.disabled = False
