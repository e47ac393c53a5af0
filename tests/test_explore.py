"""Data behind the tuning widgets: cross-sample weights, capability summaries, live metric frames."""

from __future__ import annotations

import math
import subprocess
import sys

import pandas as pd
import pytest

from workbench.lab.explore import capability_table, cross_weight_table, metrics_frame, validate_tuning


def test_cross_weight_follows_the_clipped_power_law_per_minibatch():
    alpha, omega = 2.0, 1.5
    table = cross_weight_table(alpha, 0.2, 0.025, omega=omega, n_minibatches=4)
    assert set(table.columns) == {"pair", "minibatch", "lower_bound", "s", "weight", "in_range"}
    bounds = table.groupby("minibatch")["lower_bound"].first().tolist()
    assert bounds == pytest.approx([0.8, 0.825, 0.85, 0.875])  # spec §3(d)
    for row in table.sample(60, random_state=0).itertuples():
        clipped = min(max(row.s, row.lower_bound), 1.0)
        # clip(s)·sg[clip(s)]^α·ω, evaluated by hand.
        assert row.weight == pytest.approx(clipped ** (alpha + 1) * omega)
        assert row.in_range == (row.lower_bound <= row.s <= 1.0)
    # Later mini-batches keep fewer ratios in range (stepwise tightening).
    in_range = table.groupby("minibatch")["in_range"].mean().tolist()
    assert in_range == sorted(in_range, reverse=True) and in_range[0] > in_range[-1]


def test_cross_weight_reductions_alpha_zero_and_no_clip():
    s_grid = [0.5, 0.9, 1.1]
    plain = cross_weight_table(0.0, 0.2, 0.0, n_minibatches=1, s_grid=s_grid)
    assert plain["weight"].tolist() == pytest.approx([0.8, 0.9, 1.0])  # α = 0: just clip(s)
    unclipped = cross_weight_table(1.0, 0.2, 0.025, n_minibatches=2, s_grid=s_grid, clip_cross=False)
    assert unclipped["weight"].tolist() == pytest.approx([s**2 for s in s_grid] * 2)
    assert unclipped["in_range"].all()


def test_cross_weight_bound_is_capped_at_one():
    table = cross_weight_table(1.0, 0.1, 0.05, n_minibatches=4, s_grid=[0.95, 1.0])
    assert table.groupby("minibatch")["lower_bound"].first().tolist() == pytest.approx([0.9, 0.95, 1.0, 1.0])


def test_cross_weight_one_curve_set_per_pair():
    table = cross_weight_table(
        1.0, 0.2, 0.025, omega={"a ← b": 2.0, "b ← a": 0.5}, n_minibatches=2, s_grid=[1.0]
    )
    assert table.set_index(["pair", "minibatch"])["weight"].to_dict() == {
        ("a ← b", 0): 2.0,
        ("a ← b", 1): 2.0,
        ("b ← a", 0): 0.5,
        ("b ← a", 1): 0.5,
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"delta": 1.0}, r"delta = 1\.0 is not allowed: in \[0, 1\) \(the lower bound 1 − δ must be"),
        ({"alpha": -0.5}, r"alpha = -0\.5 is not allowed: >= 0"),
        ({"delta_step": math.nan}, r"delta_step = nan"),
        ({"n_minibatches": 0}, r"n_minibatches = 0 .*integer in \[1, 64\]"),
        ({"omega": -1.0}, r"omega\['ω = -1'\] = -1\.0"),
        ({"s_grid": [0.5, 0.0]}, r"s_grid must hold finite ratios > 0"),
    ],
)
def test_cross_weight_rejects_bad_values_by_name(kwargs, message):
    args = {"alpha": 1.0, "delta": 0.2, "delta_step": 0.025} | kwargs
    with pytest.raises(ValueError, match=message):
        cross_weight_table(**args)


def test_validate_tuning_clamp_order_and_window():
    validate_tuning(alpha=0.0, delta=0.0, delta_step=0.0, window=1, min_ratio=1.0, max_ratio=1.0)
    with pytest.raises(ValueError, match=r"min_ratio = 1\.5 is not allowed: in \(0, 1\]"):
        validate_tuning(min_ratio=1.5, max_ratio=10.0)
    with pytest.raises(ValueError, match=r"window = 2\.5 .*integer >= 1"):
        validate_tuning(window=2.5)
    with pytest.raises(ValueError, match=r"window = 0"):
        capability_table([0.5, 0.5], window=0)


def test_capability_table_hand_worked_two_agents():
    summary = capability_table([0.25, 0.5], window=5, agents=["char", "bpe"], group_size=4)
    assert summary.p_hat["p_hat"].tolist() == pytest.approx([0.25, 0.5])
    omega = summary.omega.set_index(["learner", "source"])
    # ω[learner, source] = P̂_learner / P̂_source weights the baseline; the loss uses the transpose.
    assert omega.loc[("char", "bpe")].tolist() == pytest.approx([0.5, 2.0])
    assert omega.loc[("bpe", "char")].tolist() == pytest.approx([2.0, 0.5])
    rows = summary.baselines.set_index(["group", "learner"])
    assert rows.loc[("as accuracies", "char"), "rewards"] == "1000 | 1100"
    # μ̂_char = (1·1 + 0.5·2) / 8, μ̂_bpe = (2·1 + 1·2) / 8 (Eq. 7); σ = Bessel std of the 8 rewards (Eq. 6).
    assert rows.loc[("as accuracies", "char"), "baseline"] == pytest.approx(0.25)
    assert rows.loc[("as accuracies", "bpe"), "baseline"] == pytest.approx(0.5)
    sigma = pd.Series([1, 0, 0, 0, 1, 1, 0, 0]).std()
    assert rows.loc[("as accuracies", "char"), "adv_correct"] == pytest.approx(0.75 / sigma, rel=1e-5)
    assert rows.loc[("as accuracies", "bpe"), "adv_wrong"] == pytest.approx(-0.5 / sigma, rel=1e-5)
    assert rows.loc[("all wrong", "char"), "guard"] == "uniform group"
    assert rows.loc[("all wrong", "char"), "adv_wrong"] == 0.0
    assert math.isnan(rows.loc[("all wrong", "char"), "adv_correct"])


def test_capability_table_baseline_guard_fires_for_a_much_weaker_source():
    # ω[strong, weak] = 10 (clamped): the weak agent's one right answer pushes the baseline above 1.
    summary = capability_table([0.05, 0.5], agents=["weak", "strong"], group_size=2)
    rows = summary.baselines.set_index(["group", "learner"])
    assert rows.loc[("only weak right", "strong"), "guard"] == "baseline > max reward"
    assert rows.loc[("only weak right", "strong"), "baseline"] == pytest.approx(0.0)  # its own rewards' mean
    assert rows.loc[("only weak right", "weak"), "guard"] == ""


def test_capability_table_window_over_a_history():
    history = [[0.1, 0.2, 0.3], [0.5, 0.5, 0.9]]  # [A][steps]
    summary = capability_table(history, window=2, min_ratio=0.5, max_ratio=2.0)
    assert summary.p_hat["p_hat"].tolist() == pytest.approx([0.25, 0.7])
    assert summary.p_hat["steps_in_window"].tolist() == [2, 2]
    assert summary.p_hat["accuracy"].tolist() == pytest.approx([0.3, 0.9])
    omega = summary.omega.set_index(["learner", "source"])["omega_baseline"]
    assert omega[("agent-0", "agent-1")] == pytest.approx(0.5)  # 0.25/0.7 clamped up to min_ratio
    assert omega[("agent-1", "agent-0")] == pytest.approx(2.0)


def test_capability_table_rejects_bad_accuracies_and_names():
    with pytest.raises(ValueError, match=r"accuracies\[1\]\[0\] = 1\.5 is not allowed"):
        capability_table([0.5, 1.5])
    with pytest.raises(ValueError, match="agents has 1 names for 2 agents"):
        capability_table([0.5, 0.5], agents=["x"])
    with pytest.raises(ValueError, match=r"min_ratio = 2 is not allowed: in \(0, 1\]"):
        capability_table([0.5, 0.5], min_ratio=2, max_ratio=1.5)


def test_metrics_frame_matches_the_load_runs_shape():
    records = [
        {"step": 0, "train/acc/a": 0.1, "eval/acc/a": 0.2},
        {"step": 1, "train/acc/a": 0.3},
        {"step": 1, "omega/a/b": 2.0},  # a second record of step 1 is merged
    ]
    frame = metrics_frame(records, run="r", algorithm="hacpo")
    assert list(frame.columns) == [
        "run",
        "experiment",
        "algorithm",
        "seed",
        "run_dir",
        "step",
        "eval/acc/a",
        "omega/a/b",
        "train/acc/a",
    ]
    assert frame["step"].tolist() == [0, 1]
    assert frame["train/acc/a"].tolist() == [0.1, 0.3]
    assert math.isnan(frame.loc[1, "eval/acc/a"]) and frame.loc[1, "omega/a/b"] == 2.0
    with pytest.raises(ValueError, match=r"metrics record 1 has step = 'x'"):
        metrics_frame([{"step": 0}, {"step": "x"}])


def test_heavy_imports_stay_at_the_edges():
    """explore: torch + pandas only; tables: pandas only; plots: + altair. Two fresh interpreters."""
    code = """
import sys
def loaded(names):
    return [m for m in names if m in sys.modules]
import workbench.lab.tables
print("tables", loaded(["altair", "ipywidgets", "torch"]))
import workbench.lab.plots
print("plots", loaded(["ipywidgets", "torch"]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["tables []", "plots []"]
    code = (
        "import sys, workbench.lab.explore\n"
        "print([m for m in ('altair', 'ipywidgets', 'peft', 'transformers') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_capability_table_for_three_agents_has_the_3x3_omega_and_every_learner_baseline():
    """n = 3: six ordered (learner, source) pairs of ω and three learner baselines per example group."""
    summary = capability_table([0.25, 0.5, 0.75], window=5, agents=["a", "b", "c"], group_size=4)
    omega = summary.omega.set_index(["learner", "source"])
    assert len(omega) == 6
    assert omega.loc[("a", "c"), "omega_baseline"] == pytest.approx(1 / 3)
    assert omega.loc[("a", "c"), "cross_coef"] == pytest.approx(3.0)
    rows = summary.baselines.set_index(["group", "learner"])
    # μ̂_a = (1·1 + (1/2)·2 + (1/3)·3) / 12 over the 12 rewards 1000 | 1100 | 1110 (Eq. 7)
    assert rows.loc[("as accuracies", "a"), "baseline"] == pytest.approx(3 / 12)
    assert set(rows.loc["as accuracies"].index) == {"a", "b", "c"}
