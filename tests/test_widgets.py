"""The tuning panel and the run monitor build and run their callbacks headless (no display, no kernel)."""

from __future__ import annotations

import pytest

from workbench.lab.widgets import RunMonitor, TuningPanel

A1, A2 = "char-gpt2", "bpe-llama"


def _fake_step(step: int, agents: list[str]) -> dict[str, float]:
    """A metric dict as the trainer passes to on_step (the run-directory contract's keys)."""
    row: dict[str, float] = {"step": step}
    for i, agent in enumerate(agents):
        row[f"train/acc/{agent}"] = 0.1 * (i + 1) + 0.1 * step
        row[f"capability/{agent}"] = 0.1 * (i + 1) + 0.05 * step
        if step % 2 == 0:
            row[f"eval/acc/{agent}"] = 0.2 + 0.05 * step
        for j, source in enumerate(agents):
            mean = 1.0 if i == j else 0.8
            prefix = f"is/{agent}/{source}"
            row |= {
                f"{prefix}/ratio_mean": mean,
                f"{prefix}/ratio_min": mean - 0.1,
                f"{prefix}/ratio_max": mean,
            }
            row[f"{prefix}/clip_frac"] = 0.0 if i == j else 0.4
            if i != j:
                row[f"{prefix}/in_range_frac"] = 0.6
                row[f"omega/{agent}/{source}"] = (i + 1) / (j + 1)
    return row


@pytest.fixture
def panel_and_calls():
    calls: list[dict] = []
    panel = TuningPanel(calls.append, agents=[A1, A2], accuracies=[0.25, 0.5])
    return panel, calls


def test_panel_draws_weights_and_capability_tables_on_build(panel_and_calls):
    panel, _ = panel_and_calls
    assert panel.chart.value.lstrip().startswith("<svg")
    assert f"{A1} ← {A2}" in panel.chart.value and "m = 3 (lb 0.875)" in panel.chart.value
    assert "m=0: 0.800" in panel.message.value
    assert (
        A1 in panel.tables.value
        and "omega_baseline" in panel.tables.value
        and "adv_correct" in panel.tables.value
    )
    assert "2.000" in panel.tables.value  # cross_coef of A1 ← A2 = 0.5 / 0.25


def test_panel_redraws_on_change(panel_and_calls):
    panel, _ = panel_and_calls
    before = panel.chart.value
    panel.delta.value = 0.3  # lower bound 0.7 + m·0.025
    assert panel.chart.value != before
    assert "m=0: 0.700" in panel.message.value and "m=3: 0.775" in panel.message.value
    panel.delta_step.value = 0.0
    assert "m=3: 0.700" in panel.message.value


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("min_ratio", 2.0, "min_ratio = 2.0 is not allowed: in (0, 1]"),
        ("min_ratio", 0.0, "min_ratio = 0.0 is not allowed"),
        ("max_ratio", 0.5, "max_ratio = 0.5 is not allowed: &gt;= 1"),
    ],
)
def test_out_of_range_values_show_a_message_instead_of_raising(panel_and_calls, field, value, expected):
    panel, calls = panel_and_calls
    chart_before = panel.chart.value
    getattr(panel, field).value = value  # fires the observer; must not raise
    assert "not drawn" in panel.message.value and expected in panel.message.value
    assert panel.chart.value == chart_before  # the last valid chart stays
    panel.launch_button.click()
    assert calls == [] and "not launched" in panel.message.value
    getattr(panel, field).value = {"min_ratio": 0.1, "max_ratio": 10.0}[field]
    assert "not drawn" not in panel.message.value


def test_launch_calls_the_function_with_the_chosen_values_and_feeds_the_monitor():
    seen: list[dict] = []

    def fake_launch(params: dict) -> None:
        seen.append(params)
        for step in range(4):  # the trainer would call on_step once per step
            panel.monitor.on_step(_fake_step(step, [A1, A2]))

    panel = TuningPanel(fake_launch, agents=[A1, A2], accuracies=[0.25, 0.5], window=2)
    panel.alpha.value = 2.0
    panel.steps.value = 4
    panel.launch_button.click()
    assert seen == [
        {
            "alpha": 2.0,
            "delta": 0.2,
            "delta_step": 0.025,
            "window": 2,
            "min_ratio": 0.1,
            "max_ratio": 10.0,
            "steps": 4,
        }
    ]
    assert "run finished (4 steps received)" in panel.message.value
    assert not panel.launch_button.disabled
    assert all(p.value.lstrip().startswith("<svg") for p in panel.monitor.panes.values())
    # P̂ now averages the run's last accuracies with the sliders' (window 2: step 3's and the slider's).
    history = panel.accuracy_history()
    assert history[0] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.25])
    assert ">0.325<" in panel.tables.value  # (0.4 + 0.25) / 2 for A1


def test_launch_failure_is_shown_and_the_panel_stays_usable():
    def broken(params: dict) -> None:
        raise RuntimeError("out of memory")

    panel = TuningPanel(broken)
    panel.launch_button.click()
    assert "run failed: RuntimeError: out of memory" in panel.message.value
    assert not panel.launch_button.disabled
    panel.steps.value = 0
    panel.launch_button.click()
    assert "not launched: steps = 0 is not allowed" in panel.message.value


def test_panel_without_launch_function_and_bad_construction():
    panel = TuningPanel()
    assert panel.launch_button.disabled
    panel._on_launch()
    assert "no launch function" in panel.message.value
    assert panel._repr_mimebundle_()["application/vnd.jupyter.widget-view+json"]["model_id"]
    with pytest.raises(ValueError, match="need >= 2 agents with one accuracy each"):
        TuningPanel(agents=["a", "b"], accuracies=[0.5])


def test_monitor_redraws_every_n_steps_and_reports_missing_metrics():
    monitor = RunMonitor(redraw_every=2, algorithm="gspo")
    monitor.on_step(_fake_step(0, [A1]))
    assert all(p.value == "" for p in monitor.panes.values())  # not yet: every 2 steps
    monitor.on_step(_fake_step(1, [A1]))
    assert monitor.panes["accuracy"].value.lstrip().startswith("<svg")
    assert "GSPO" in monitor.panes["accuracy"].value
    assert monitor.panes["ω"].value == ""  # only the visible tab is drawn per step...
    monitor.tabs.selected_index = list(monitor.panes).index("ω")  # ...the others when opened
    assert "ω: melt_metric: no column under &#x27;omega&#x27;" in monitor.panes["ω"].value  # one agent: no ω
    assert "step 1 (2 steps received)" in monitor.status.value
    assert list(monitor.frame["step"]) == [0, 1]


def test_monitor_skips_malformed_records_without_raising():
    monitor = RunMonitor()
    monitor.on_step({"train/acc/a": 0.5})  # no step
    assert "skipped a metrics record" in monitor.status.value and monitor.records == []
    monitor.on_step(_fake_step(0, [A1, A2]))
    assert len(monitor.records) == 1 and "step 0" in monitor.status.value
    monitor.reset(run="next")
    assert monitor.records == [] and monitor.run == "next"
    with pytest.raises(ValueError, match="redraw_every = 0"):
        RunMonitor(redraw_every=0)


def test_the_panel_handles_three_agents():
    panel = TuningPanel(agents=["a", "b", "c"], accuracies=[0.25, 0.5, 0.75])
    for learner, source in (("a", "b"), ("a", "c"), ("c", "b")):
        assert f"{learner} ← {source}" in panel.chart.value
    assert all(name in panel.tables.value for name in ("a", "b", "c"))
