"""Paper-layout tables (Tables 1, 4, 6) as mean ± std over seeds with n, and their LaTeX/CSV export."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml

from workbench.lab import stats
from workbench.lab.latex import to_latex
from workbench.lab.ratios import ratio_stats_table
from workbench.lab.tables import alpha_table, paper_table

A1, A2 = "char-gpt2", "bpe-llama"
BENCHES = ("arith", "gsm")


def _eval_rows(run, algorithm, agent, step, values, metric="greedy_acc", run_dir=None):
    return [
        {
            "run": run,
            "experiment": "pair",
            "algorithm": algorithm,
            "run_dir": run_dir or f"results/pair/{run}",
            "step": step,
            "agent": agent,
            "benchmark": bench,
            "metric": metric,
            "value": value,
        }
        for bench, value in zip(BENCHES, values)
    ]


@pytest.fixture
def evals_df() -> pd.DataFrame:
    """Shape of ``load_evals``: initial eval at step 0, a mid eval at step 5, a final eval at step 10."""
    rows = []
    # Two seeds of GSPO for A1 (mean of them expected), one GSPO for A2.
    rows += _eval_rows("gspo-a1-s0", "gspo", A1, 0, [0.20, 0.10])
    rows += _eval_rows("gspo-a1-s0", "gspo", A1, 5, [0.90, 0.90])  # not the last step: ignored
    rows += _eval_rows("gspo-a1-s0", "gspo", A1, 10, [0.30, 0.20])
    rows += _eval_rows("gspo-a1-s1", "gspo", A1, 0, [0.20, 0.10])
    rows += _eval_rows("gspo-a1-s1", "gspo", A1, 10, [0.40, 0.30])
    rows += _eval_rows("gspo-a2", "gspo", A2, 0, [0.50, 0.40])
    rows += _eval_rows("gspo-a2", "gspo", A2, 10, [0.55, 0.45])
    for run, algo, v1, v2 in [
        ("hacpo", "hacpo", [0.45, 0.25], [0.60, 0.50]),
        ("naive", "naive", [0.10, 0.05], [0.4, 0.3]),
    ]:
        rows += _eval_rows(run, algo, A1, 0, [0.20, 0.10]) + _eval_rows(run, algo, A2, 0, [0.50, 0.40])
        rows += _eval_rows(run, algo, A1, 10, v1) + _eval_rows(run, algo, A2, 10, v2)
    rows += _eval_rows("hacpo", "hacpo", A1, 10, [0.99, 0.99], metric="avg@4")
    return pd.DataFrame(rows)


def _means(table: pd.DataFrame, row) -> list[float]:
    return table.loc[row].xs("mean", level="stat").tolist()


def test_paper_table_layout_matches_table_1(evals_df):
    table = paper_table(evals_df)
    assert list(dict.fromkeys(table.columns.get_level_values(0))) == [*BENCHES, "AVG"]
    assert list(table.columns.get_level_values(1)[:4]) == ["mean", "std", "n", "se"]
    assert table.index.names == ["agent", "model"]
    assert list(table.index.get_level_values("model")) == [
        A1,
        f"{A1} (GSPO)",
        f"{A1} (Naive)",
        f"{A1} (HACPO)",
        A2,
        f"{A2} (GSPO)",
        f"{A2} (Naive)",
        f"{A2} (HACPO)",
    ]
    # Two GSPO seeds are averaged; the mid-run eval at step 5 is ignored; AVG is the unweighted mean.
    gspo = table.loc[(A1, f"{A1} (GSPO)")]
    assert _means(table, (A1, f"{A1} (GSPO)")) == pytest.approx([0.35, 0.25, 0.30])
    assert gspo[("arith", "std")] == pytest.approx(0.071) and gspo[("arith", "n")] == 2
    assert gspo[("AVG", "std")] == pytest.approx(0.071)  # per-run AVG 0.25 and 0.35 (rounded)
    assert _means(table, (A1, A1)) == pytest.approx([0.2, 0.1, 0.15])
    assert table.loc[(A2, f"{A2} (HACPO)"), ("AVG", "mean")] == pytest.approx(0.55)
    one = table.loc[(A2, f"{A2} (HACPO)")]
    assert one[("AVG", "n")] == 1 and math.isnan(one[("AVG", "std")]) and math.isnan(one[("AVG", "se")])


def test_paper_table_selects_methods_and_metric(evals_df):
    table = paper_table(evals_df, methods=["naive", "hacpo"], include_untrained=False, agents=[A2])
    assert list(table.index.get_level_values("model")) == [f"{A2} (Naive)", f"{A2} (HACPO)"]
    avg4 = paper_table(evals_df, metric="avg@4")
    assert avg4.loc[(A1, f"{A1} (HACPO)"), ("AVG", "mean")] == pytest.approx(0.99)


def test_paper_table_names_and_orders_methods_by_the_methods_table(evals_df):
    rows = []
    for run in ("hacpo-noclip", "mine", "hacpo-adv"):  # labels of run configs: known ablations, a user's own
        rows += _eval_rows(run, run, A1, 10, [0.3, 0.3])
    table = paper_table(pd.concat([evals_df, pd.DataFrame(rows)]), agents=[A1], include_untrained=False)
    assert list(table.index.get_level_values("model")) == [
        f"{A1} (GSPO)",
        f"{A1} (Naive)",
        f"{A1} (HACPO − Adv)",
        f"{A1} (no Clip)",
        f"{A1} (mine)",
        f"{A1} (HACPO)",
    ]


def test_paper_table_rounds_and_marks_missing_benchmarks(evals_df):
    extra = pd.DataFrame(_eval_rows("hacpo", "hacpo", A1, 10, [0.123456, 0.5])[:1]).assign(benchmark="math")
    table = paper_table(pd.concat([evals_df, extra]))
    assert table.loc[(A1, f"{A1} (HACPO)"), ("math", "mean")] == 0.123
    assert math.isnan(table.loc[(A1, f"{A1} (GSPO)"), ("AVG", "mean")])  # GSPO was not evaluated on "math"
    assert table.loc[(A1, f"{A1} (GSPO)"), ("math", "n")] == 0


def test_paper_table_bad_input_names_the_problem(evals_df):
    with pytest.raises(ValueError, match=r"metric 'pass@8'.*greedy_acc"):
        paper_table(evals_df, metric="pass@8")
    with pytest.raises(ValueError, match=r"methods \['grpo'\] not in the data"):
        paper_table(evals_df, methods=["grpo"])
    with pytest.raises(ValueError, match=r"lacks columns.*benchmark"):
        paper_table(evals_df.drop(columns="benchmark"))
    other = evals_df[evals_df["run"] == "gspo-a1-s1"].assign(experiment="other", run="x")
    with pytest.raises(
        ValueError, match=r"char-gpt2 \(gspo\) has runs of several experiments \['other', 'pair'\]"
    ):
        paper_table(pd.concat([evals_df, other]))


def test_paper_table_standard_errors_and_seeds(evals_df):
    """se: binomial per run on the held-out items, then sqrt(std²/n + mean(se²)); step 0 counted per seed."""
    seeds = {"gspo-a1-s0": 0, "gspo-a1-s1": 1, "gspo-a2": 0, "hacpo": 0, "naive": 0}
    df = evals_df.assign(items=100, seed=evals_df["run"].map(seeds))
    table = paper_table(df, decimals=6)
    runs = [0.3, 0.4]
    ses = [math.sqrt(p * (1 - p) / 100) for p in runs]
    expected = math.sqrt(pd.Series(runs).std() ** 2 / 2 + sum(e**2 for e in ses) / 2)
    assert table.loc[(A1, f"{A1} (GSPO)"), ("arith", "se")] == pytest.approx(expected, abs=1e-6)
    hacpo = table.loc[(A1, f"{A1} (HACPO)")]
    assert hacpo[("arith", "se")] == pytest.approx(math.sqrt(0.45 * 0.55 / 100), abs=1e-6)
    avg_se = math.sqrt(0.45 * 0.55 / 100 + 0.25 * 0.75 / 100) / 2
    assert hacpo[("AVG", "se")] == pytest.approx(avg_se, abs=1e-6)
    # The initial agent: four runs of seed 0 and one of seed 1 evaluate it: two measurements, not five.
    assert table.loc[(A1, A1), ("arith", "n")] == 2


def test_stat_helpers_format_and_flatten(evals_df):
    table = paper_table(evals_df)
    shown = stats.formatted(table)
    assert shown.loc[(A1, f"{A1} (GSPO)"), "arith"] == "0.350 ± 0.071"
    assert shown.loc[(A2, f"{A2} (HACPO)"), "arith"] == "0.600 ± —"  # one run: no spread
    assert shown.loc[(A1, f"{A1} (GSPO)"), "n"] == "2" and shown.loc[(A2, f"{A2} (GSPO)"), "n"] == "1"
    assert "1–4 seeds" in shown.attrs["note"] and "smoke test" in shown.attrs["note"]
    assert stats.seeds_note(table[table.index.get_level_values("model") == f"{A2} (HACPO)"]) == (
        "1 seed: a smoke test"
    )
    flat = stats.flat(table)
    assert list(flat.columns[:4]) == ["arith_mean", "arith_std", "arith_n", "arith_se"]
    assert stats.combine([0.5]) == {
        "mean": 0.5,
        "std": pytest.approx(math.nan, nan_ok=True),
        "n": 1,
        "se": pytest.approx(math.nan, nan_ok=True),
    }
    assert stats.combine([0.4, 0.6], [0.1, 0.1])["se"] == pytest.approx(math.sqrt(0.02 / 2 + 0.01))
    assert stats.binomial_se(0.5, 100) == pytest.approx(0.05) and math.isnan(stats.binomial_se(0.5, None))


def test_to_latex_bolds_the_best_per_column_within_each_agent_block(evals_df, tmp_path):
    table = paper_table(evals_df)
    tex_path, csv_path = to_latex(table, tmp_path / "t1.tex", caption="Main results", label="tab:main")
    lines = tex_path.read_text().splitlines()
    body = {line.split(" & ")[0]: line for line in lines if line.endswith(r"\\") and " & " in line}
    pm = r" $\pm$ "
    # Column "arith": A1's best is HACPO (0.45); A2's best is HACPO (0.60). AVG: A1 HACPO 0.35, A2 HACPO 0.55.
    assert rf"\textbf{{0.450{pm}---}}" in body[f"{A1} (HACPO)"]
    assert rf"\textbf{{0.600{pm}---}}" in body[f"{A2} (HACPO)"]
    assert r"\textbf" not in body[f"{A1} (Naive)"]
    # A2's untrained 0.50 is below A2's best (0.60) even though above A1's best: blocks are separate.
    assert r"\textbf" not in body[A2]
    # gsm: A1's GSPO (mean of two seeds) ties HACPO at 0.25: both bold; n differs per row: an n column.
    assert body[f"{A1} (GSPO)"] == (
        rf"{A1} (GSPO) & 0.350{pm}0.071 & \textbf{{0.250{pm}0.071}} & 0.300{pm}0.071 & 2 \\"
    )
    assert sum(line == r"\midrule" for line in lines) == 2  # after the header, between the two agents
    assert "model & arith & gsm & AVG & n" in "\n".join(lines)
    assert r"\caption{Main results (mean $\pm$ std over seeds, n per row)}" in lines
    back = pd.read_csv(csv_path, index_col=[0, 1])
    assert list(back.columns[:4]) == ["arith_mean", "arith_std", "arith_n", "arith_se"]
    assert back.loc[(A1, f"{A1} (GSPO)"), "AVG_mean"] == pytest.approx(0.3)
    assert back.loc[(A1, f"{A1} (GSPO)"), "arith_n"] == 2


def test_to_latex_puts_a_constant_n_in_the_caption(evals_df, tmp_path):
    table = paper_table(evals_df, methods=["naive", "hacpo"], include_untrained=False)
    (tex,) = to_latex(table, tmp_path / "one.tex", "Smoke", "tab:one", csv=False)
    text = tex.read_text()
    assert r"\caption{Smoke (1 seed: a smoke test)}" in text and "& n" not in text


def test_to_latex_min_row_axis_escaping_and_ties(tmp_path):
    table = pd.DataFrame({"a_b": [1.0, 2.0], "c%": [1.0, 0.5]}, index=pd.Index(["x×2", "y"], name="model"))
    (tex,) = to_latex(table, tmp_path / "t.tex", "Cap & more", "tab:x", best="min", axis="row", csv=False)
    text = tex.read_text()
    assert r"model & a\_b & c\% \\" in text
    assert r"x$\times$2 & \textbf{1.0} & \textbf{1.0} \\" in text  # ties are all bold
    assert r"y & 2.0 & \textbf{0.5} \\" in text
    assert r"\caption{Cap \& more}" in text
    assert not (tmp_path / "t.csv").exists()
    with pytest.raises(ValueError, match=r"must end in \.tex"):
        to_latex(table, tmp_path / "t.txt", "c", "l")
    with pytest.raises(ValueError, match="best must be"):
        to_latex(table, tmp_path / "t.tex", "c", "l", best="largest")


def _is_rows(run, learner, source, step, mean, lo, hi):
    base = {
        "run": run,
        "experiment": "pair",
        "algorithm": "hacpo",
        "step": step,
        "learner": learner,
        "source": source,
    }
    return [
        {**base, "stat": stat, "value": v}
        for stat, v in [("ratio_mean", mean), ("ratio_min", lo), ("ratio_max", hi)]
    ]


def test_ratio_stats_table_averages_per_step_stats_like_table_6():
    rows = []
    for step, (m, lo, hi) in enumerate([(1.0, 0.999, 1.001), (1.0002, 0.9996, 1.0004)]):
        rows += _is_rows("r1", A1, A1, step, m, lo, hi)
    for step, (m, lo, hi) in enumerate([(0.9, 0.8, 0.95), (0.8, 0.7, 0.85)]):
        rows += _is_rows("r1", A1, A2, step, m, lo, hi)
    rows += _is_rows("r1", A2, A2, 0, 1.0, 1.0, 1.0) + _is_rows("r1", A2, A1, 0, 1.2, 1.1, 1.3)
    long = pd.DataFrame(rows)
    table = ratio_stats_table(long)
    assert list(dict.fromkeys(table.columns.get_level_values(0))) == ["mean", "max", "min", "range"]
    assert list(table.index) == [(A1, "s_homo"), (A1, "s_hete"), (A2, "s_homo"), (A2, "s_hete")]
    assert _means(table, (A1, "s_homo")) == pytest.approx([1.0001, 1.0007, 0.9993, 0.0014])
    assert _means(table, (A1, "s_hete")) == pytest.approx([0.85, 0.9, 0.75, 0.15])
    # Seeds: per-run statistics first, then mean ± std over runs.
    shifted = long.assign(run="r2", value=long["value"] + 0.1)
    two_runs = pd.concat([long, shifted])
    both = ratio_stats_table(two_runs)
    assert _means(both, (A1, "s_hete")) == pytest.approx([0.9, 0.95, 0.8, 0.15])
    assert both.loc[(A1, "s_hete"), ("mean", "std")] == pytest.approx(math.sqrt(0.005), abs=1e-5)
    assert both.loc[(A1, "s_hete"), ("range", "std")] == pytest.approx(0.0)
    assert both.loc[(A1, "s_hete"), ("mean", "n")] == 2
    assert ratio_stats_table(two_runs, run="r1").equals(table)
    with pytest.raises(ValueError, match=r"several algorithms \['hacpo', 'gspo'\]"):
        ratio_stats_table(pd.concat([long, long.assign(run="g", algorithm="gspo")]))


def test_ratio_stats_table_names_each_cross_source_when_several():
    rows = _is_rows("r", "x", "x", 0, 1, 1, 1) + _is_rows("r", "x", "y", 0, 0.9, 0.8, 1)
    rows += _is_rows("r", "x", "z", 0, 0.7, 0.6, 0.8)
    table = ratio_stats_table(pd.DataFrame(rows))
    assert list(table.index.get_level_values("ratio")) == ["s_homo", "s_hete ← y", "s_hete ← z"]


def test_alpha_table_reads_alpha_from_each_run_config(tmp_path, evals_df):
    rows = []
    for alpha, scores in [(0.0, [0.30, 0.40]), (1.0, [0.50, 0.70]), (2.0, [0.40, 0.45])]:
        run_dir = tmp_path / f"alpha{alpha}"
        run_dir.mkdir()
        (run_dir / "config.yaml").write_text(
            yaml.safe_dump({"algorithm": "hacpo", "hacpo": {"alpha": alpha}})
        )
        rows += _eval_rows(f"a{alpha}", "hacpo", A1, 0, [0.1, 0.1], run_dir=str(run_dir))
        rows += _eval_rows(f"a{alpha}", "hacpo", A1, 10, scores, run_dir=str(run_dir))
        rows += _eval_rows(f"a{alpha}", "hacpo", A2, 10, [s + 0.1 for s in scores], run_dir=str(run_dir))
    df = pd.DataFrame(rows)
    table = alpha_table(df)
    assert table.columns.names == ["α", "stat"]
    assert list(dict.fromkeys(table.columns.get_level_values(0))) == [0.0, 1.0, 2.0]
    assert list(table.index) == [A1, A2]
    assert _means(table, A1) == pytest.approx([0.35, 0.6, 0.425])
    assert _means(alpha_table(df, benchmark="gsm"), A2) == pytest.approx([0.5, 0.8, 0.55])
    assert set(table.xs("n", axis=1, level="stat").to_numpy().ravel()) == {1}
    with_column = df.assign(alpha=df["run"].str.removeprefix("a").astype(float), run_dir="/nonexistent")
    assert alpha_table(with_column).equals(table)
    with pytest.raises(ValueError, match=r"cannot read hacpo\.alpha"):
        alpha_table(df.assign(run_dir=str(tmp_path / "missing")))


def test_to_latex_row_axis_marks_best_alpha(tmp_path):
    table = pd.DataFrame({0.0: [0.63, 0.756], 1.0: [0.664, 0.792], 3.0: [0.668, 0.77]}, index=["1.7B", "4B"])
    table.columns.name = "α"
    tex, _ = to_latex(table, tmp_path / "alpha.tex", "α sensitivity", "tab:alpha", axis="row")
    text = tex.read_text()
    assert r"1.7B & 0.630 & 0.664 & \textbf{0.668} \\" in text
    assert r"4B & 0.756 & \textbf{0.792} & 0.770 \\" in text
