"""Every chart renders to PNG and SVG from small fixture frames shaped like load_runs / melt_metric."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from workbench.config.methods import METHODS, SPARE_COLORS
from workbench.lab import plots
from workbench.lab.explore import cross_weight_table, metrics_frame
from workbench.lab.frames import load_runs, melt_metric
from workbench.train.rundir import RunWriter, create_run_dir

A1, A2 = "char-gpt2", "bpe-llama"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _step_metrics(step: int, agents: list[str], shift: float) -> dict[str, float]:
    """One step's metric dict as the trainer logs it (values follow simple formulas of the step)."""
    row: dict[str, float] = {}
    for i, agent in enumerate(agents):
        acc = 0.2 + 0.1 * i + 0.05 * step + shift
        row[f"train/acc/{agent}"] = acc
        row[f"capability/{agent}"] = acc - 0.01
        row[f"cost/{agent}/generated_responses"] = 64.0 * (step + 1)
        row[f"cost/{agent}/trained_responses"] = 64.0 * len(agents) * (step + 1)
        if step % 3 == 0:
            row[f"eval/acc/{agent}"] = acc + 0.02
        for j, source in enumerate(agents):
            prefix = f"is/{agent}/{source}"
            mean = 1.0 if i == j else 0.85 - 0.01 * step
            row |= {
                f"{prefix}/ratio_mean": mean,
                f"{prefix}/ratio_min": mean - 0.05,
                f"{prefix}/ratio_max": mean + 0.03,
            }
            row[f"{prefix}/clip_frac"] = 0.01 if i == j else 0.3 + 0.02 * step
            if i != j:
                row[f"{prefix}/in_range_frac"] = 0.7 - 0.02 * step
                row[f"omega/{agent}/{source}"] = (0.2 + 0.1 * i) / (0.2 + 0.1 * j)
    return row


def _run(run: str, algorithm: str, agents: list[str], shift: float = 0.0, steps: int = 7) -> pd.DataFrame:
    records = [{"step": s, **_step_metrics(s, agents, shift)} for s in range(steps)]
    return metrics_frame(records, run=run, experiment="pair", algorithm=algorithm)


@pytest.fixture(scope="module")
def runs_df() -> pd.DataFrame:
    """WIDE, as load_runs: HACPO on the pair, GSPO per agent (two seeds for A1), and one ablation."""
    frames = [
        _run("hacpo-0", "hacpo", [A1, A2], 0.05),
        _run("gspo-a1-0", "gspo", [A1], 0.0),
        _run("gspo-a1-1", "gspo", [A1], 0.02),
        _run("gspo-a2-0", "gspo", [A2], 0.0),
        _run("noclip-0", "hacpo-noclip", [A1, A2], -0.1),
    ]
    return pd.concat(frames, ignore_index=True)


def _datasets(chart) -> list[dict]:
    return [row for rows in chart.to_dict()["datasets"].values() for row in rows]


def _assert_renders(chart, tmp_path, name: str, texts: list[str]) -> str:
    spec = chart.to_dict()
    # Data only on the top level: a layer with its own data would ignore the facet (every panel all rows).
    assert "data" in spec
    inner = spec.get("spec", spec).get("layer", [])
    assert all("data" not in layer for layer in inner)
    png, svg = plots.save_chart(chart, tmp_path / name, formats=("png", "svg"))
    assert png.read_bytes().startswith(PNG_MAGIC) and png.stat().st_size > 2000
    text = svg.read_text()
    assert text.lstrip().startswith("<svg")
    for expected in texts:
        assert expected in text, f"{expected!r} not drawn in {name}.svg"
    return text


def test_training_curves_average_seeds_per_method_and_panel_per_agent(runs_df, tmp_path):
    chart = plots.training_curves(runs_df, "eval/acc", title="Figure 3")
    rows = _datasets(chart)
    gspo_a1_step3 = [
        r["value"] for r in rows if r["method"] == "GSPO" and r["agent"] == A1 and r["step"] == 3
    ]
    assert gspo_a1_step3 == pytest.approx([0.2 + 0.15 + 0.01 + 0.02])  # mean of the two seeds' shifts
    gspo = next(r for r in rows if r["method"] == "GSPO" and r["agent"] == A1 and r["step"] == 3)
    assert gspo["n"] == 2 and gspo["std"] == pytest.approx(0.02 / 2**0.5)  # the ±std band over seeds
    assert (gspo["lo"], gspo["hi"]) == pytest.approx(
        (gspo["value"] - gspo["std"], gspo["value"] + gspo["std"])
    )
    hacpo = next(r for r in rows if r["method"] == "HACPO" and r["agent"] == A1 and r["step"] == 3)
    assert hacpo["n"] == 1 and hacpo["lo"] is None  # one run: no band
    assert {r["step"] for r in rows} == {0, 3, 6}  # eval steps only
    spec = chart.to_dict()
    assert spec["facet"]["field"] == "agent"
    band, *layer = spec["spec"]["layer"]
    assert band["mark"]["type"] == "area" and band["encoding"]["y2"]["field"] == "hi"
    assert (
        layer[0]["encoding"]["strokeDash"]["field"] == "method"
        and layer[1]["encoding"]["shape"]["field"] == "method"
    )
    assert layer[0]["encoding"]["color"]["scale"]["domain"] == ["GSPO", "no Clip", "HACPO"]
    _assert_renders(chart, tmp_path, "fig3", [A1, A2, "GSPO", "HACPO", "Figure 3"])


def test_methods_keep_the_colours_of_the_methods_table(runs_df):
    mine = _run("mine-0", "my-variant", [A1, A2], 0.01)
    chart = plots.training_curves(pd.concat([runs_df, mine], ignore_index=True), "train/acc")
    scale = chart.to_dict()["spec"]["layer"][1]["encoding"]["color"]["scale"]
    assert scale["domain"] == ["GSPO", "no Clip", "my-variant", "HACPO"]
    expected = [METHODS["gspo"].color, METHODS["hacpo-noclip"].color, SPARE_COLORS[0], METHODS["hacpo"].color]
    assert scale["range"] == expected


def test_training_curves_filters_and_accepts_long_frames(runs_df, tmp_path):
    long = melt_metric(runs_df, "train/acc")
    chart = plots.training_curves(long, "train/acc", agents=[A2], algorithms=["hacpo"])
    rows = _datasets(chart)
    assert {r["agent"] for r in rows} == {A2} and {r["method"] for r in rows} == {"HACPO"}
    assert "facet" not in chart.to_dict()  # a single agent: one panel
    assert [la["mark"]["type"] for la in chart.to_dict()["layer"]] == ["line", "point"]  # one run: no band
    _assert_renders(chart, tmp_path, "train_acc", ["HACPO"])
    with pytest.raises(ValueError, match="no 'train/acc' values for agents"):
        plots.training_curves(long, "train/acc", agents=["nobody"])
    with pytest.raises(ValueError, match="no column under 'eval/pass'"):
        plots.training_curves(runs_df, "eval/pass")


def test_ablation_curves_pick_hacpo_variants(runs_df, tmp_path):
    chart = plots.ablation_curves(runs_df)
    assert {r["method"] for r in _datasets(chart)} == {"HACPO", "no Clip"}
    _assert_renders(chart, tmp_path, "fig4", ["HACPO ablations", "no Clip"])


def test_capability_and_omega_charts(runs_df, tmp_path):
    one_run = runs_df[runs_df["run"] == "hacpo-0"]
    cap = plots.capability_chart(one_run)
    assert "facet" not in cap.to_dict()
    _assert_renders(cap, tmp_path, "capability", [A1, A2, "capability"])
    many = plots.capability_chart(runs_df)
    assert many.to_dict()["facet"]["field"] == "method"  # a panel per method, seeds averaged
    gspo = [r for r in _datasets(many) if r["method"] == "GSPO" and r["agent"] == A1 and r["step"] == 2]
    assert len(gspo) == 1 and gspo[0]["n"] == 2
    omega = plots.omega_chart(one_run)
    pairs = {r["pair"] for r in _datasets(omega)}
    assert pairs == {f"{A1} / {A2}", f"{A2} / {A1}"}
    assert omega.to_dict()["layer"][0]["encoding"]["y"]["scale"]["type"] == "log"
    _assert_renders(omega, tmp_path, "omega", [f"{A1} / {A2}"])
    with pytest.raises(ValueError, match="no off-diagonal omega"):
        plots.omega_chart(pd.DataFrame(melt_metric(one_run, "omega").assign(source=lambda d: d["learner"])))


def test_ratio_chart_separates_self_and_cross_with_a_band(runs_df, tmp_path):
    chart = plots.ratio_chart(runs_df[runs_df["run"] == "hacpo-0"])
    rows = _datasets(chart)
    cross = [r for r in rows if r["learner"] == A1 and r["kind"] == f"cross ← {A2}" and r["step"] == 2]
    assert len(cross) == 1
    assert (cross[0]["ratio_min"], cross[0]["ratio_mean"], cross[0]["ratio_max"]) == pytest.approx(
        (0.78, 0.83, 0.86)
    )
    self_rows = [r for r in rows if r["kind"] == "self"]
    assert {r["ratio_mean"] for r in self_rows} == {1.0}
    mark_types = [layer["mark"]["type"] for layer in chart.to_dict()["spec"]["layer"][:1]]
    assert mark_types == ["area"]
    _assert_renders(chart, tmp_path, "ratios", ["self", f"cross ← {A2}"])
    gspo_only = plots.ratio_chart(runs_df[runs_df["run"] == "gspo-a1-0"])  # self samples only
    assert {r["kind"] for r in _datasets(gspo_only)} == {"self"}


def test_clip_fraction_chart(runs_df, tmp_path):
    chart = plots.clip_fraction_chart(runs_df[runs_df["run"] == "hacpo-0"])
    rows = _datasets(chart)
    pairs = {(r["panel"], r["stat"]) for r in rows}
    assert pairs == {(a, s) for a in (A1, A2) for s in ("clip_frac", "in_range_frac")}
    assert set(chart.to_dict()["facet"]) == {"row", "column"}  # a column per learner, a row per statistic
    in_range = [
        r["value"] for r in rows if r["panel"] == A1 and r["stat"] == "in_range_frac" and r["step"] == 5
    ]
    assert in_range == pytest.approx([0.6])
    _assert_renders(chart, tmp_path, "clip", ["in_range_frac", "clip_frac"])


def test_cross_weight_chart_from_the_explore_table(tmp_path):
    table = cross_weight_table(1.0, 0.2, 0.025, omega={"a ← b": 2.0, "b ← a": 0.5}, n_minibatches=4)
    chart = plots.cross_weight_chart(table)
    labels = {r["minibatch"] for r in _datasets(chart)}
    assert labels == {"m = 0 (lb 0.800)", "m = 1 (lb 0.825)", "m = 2 (lb 0.850)", "m = 3 (lb 0.875)"}
    _assert_renders(chart, tmp_path, "weights", ["m = 3 (lb 0.875)", "a ← b", "b ← a"])
    unclipped = plots.cross_weight_chart(cross_weight_table(1.0, 0.2, 0.0, n_minibatches=1, clip_cross=False))
    assert {r["minibatch"] for r in _datasets(unclipped)} == {"m = 0 (no clip)"}
    with pytest.raises(ValueError, match="missing columns"):
        plots.cross_weight_chart(table.drop(columns="weight"))


def test_cost_chart_shows_generated_and_trained(runs_df, tmp_path):
    chart = plots.cost_chart(runs_df)
    rows = _datasets(chart)
    hacpo = {(r["kind"], r["step"]): r["value"] for r in rows if r["method"] == "HACPO" and r["agent"] == A1}
    assert hacpo[("trained", 4)] == 2 * hacpo[("generated", 4)] == 640.0
    _assert_renders(chart, tmp_path, "cost", ["generated", "trained", "GSPO"])
    with pytest.raises(ValueError, match="unit must be"):
        plots.cost_chart(runs_df, unit="bytes")


def test_save_chart_html_is_self_contained_and_formats_are_checked(runs_df, tmp_path):
    chart = plots.capability_chart(runs_df[runs_df["run"] == "hacpo-0"])
    (html,) = plots.save_chart(chart, tmp_path / "sub" / "cap", formats=("html",))
    text = html.read_text()
    assert "<html" in text and "cdn.jsdelivr" not in text  # scripts inlined: opens offline
    assert json.dumps(A1) in text or A1 in text
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["cap.html"]  # no temp files left
    with pytest.raises(ValueError, match=r"formats \['gif'\] invalid"):
        plots.save_chart(chart, tmp_path / "x", formats=("gif",))
    assert plots.chart_to_svg(chart).lstrip().startswith("<svg")


def test_charts_from_real_run_directories(tmp_path):
    """End to end: RunWriter writes two runs, load_runs reads them, the charts take the frame."""
    for algorithm, agents in [("hacpo", [A1, A2]), ("gspo", [A1])]:
        writer = RunWriter(create_run_dir(tmp_path, "pair"))
        writer.write_config({"experiment": "pair", "algorithm": algorithm, "seed": 0, "agents": agents})
        for step in range(4):
            writer.log_metrics(step, _step_metrics(step, agents, 0.0))
    df = load_runs(tmp_path)
    assert set(df["algorithm"]) == {"hacpo", "gspo"}
    for chart in [
        plots.training_curves(df),
        plots.ratio_chart(df),
        plots.cost_chart(df),
        plots.clip_fraction_chart(df),
    ]:
        assert plots.chart_to_svg(chart).lstrip().startswith("<svg")


def test_setup_notebook_selects_the_offline_svg_renderer_and_the_theme():
    import altair as alt

    renderer, theme = alt.renderers.active, alt.theme.active
    try:
        plots.setup_notebook()
        assert alt.renderers.active == "svg" and alt.theme.active == "hacpo"
    finally:
        alt.renderers.enable(renderer)
        alt.theme.enable(theme)
        alt.data_transformers.enable("default")
