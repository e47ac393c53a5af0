"""Seeds through the library (workbench.jobs.compare): one run per seed and method, and the demo's accuracy
table (workbench.lab.accuracy) as mean ± std over seeds. Training is replaced by a recorder; run directories
are written by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from fake_runs import write_run

from workbench.config.checks import ConfigError
from workbench.jobs import compare
from workbench.lab import accuracy, report

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"


@pytest.fixture
def trained(monkeypatch):
    """Replace training: record each config and step callback, return a fake run dir per call."""
    calls = []

    def fake_train(cfg, on_step=None):
        calls.append(cfg)
        if on_step is not None:
            on_step({"step": 1, "train/acc/x": 0.5})
        return Path(f"/runs/{cfg.method}/seed{cfg.seed}")

    monkeypatch.setattr(compare, "train", fake_train)
    return calls


def test_run_comparison_one_run_per_seed_and_method(trained):
    steps = []
    runs = compare.run_comparison(QUICKSTART, ["hacpo", "gspo"], seeds=[0, 1, 2], on_step=steps.append)
    assert runs == {m: [Path(f"/runs/{m}/seed{s}") for s in (0, 1, 2)] for m in ("hacpo", "gspo")}
    # Seeds are the outer loop: every method of seed 0 first.
    assert [(c.algorithm, c.seed) for c in trained][:3] == [("hacpo", 0), ("gspo", 0), ("hacpo", 1)]
    assert all(c.seeds is None for c in trained)  # each seed its own config (hash, run directory)
    assert steps[0] == {"algorithm": "hacpo", "seed": 0, "step": 1, "train/acc/x": 0.5}


def test_seeds_default_to_the_config(trained, tmp_path):
    data = yaml.safe_load(QUICKSTART.read_text()) | {"seeds": [4, 5]}
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(data))
    runs = compare.run_comparison(tmp_path / "e.yaml", ["gspo"])
    assert runs == {"gspo": [Path("/runs/gspo/seed4"), Path("/runs/gspo/seed5")]}
    trained.clear()
    assert compare.run_comparison(QUICKSTART, ["gspo"], overrides={"seed": 7}) == {
        "gspo": [Path("/runs/gspo/seed7")]
    }
    with pytest.raises(ConfigError, match=r"seeds = \[1, 1\] is not allowed"):
        compare.run_comparison(QUICKSTART, ["gspo"], seeds=[1, 1])
    with pytest.raises(ConfigError, match="unknown method 'ppo'"):
        compare.run_comparison(QUICKSTART, ["ppo"])


def test_a_comparison_of_ablations_sets_each_ones_label_and_switches(trained):
    runs = compare.run_comparison(QUICKSTART, ["hacpo", "hacpo-adv", "naive-sym"], seeds=[0])
    assert list(runs) == ["hacpo", "hacpo-adv", "naive-sym"]
    by_method = {c.method: c for c in trained}
    assert (
        by_method["hacpo-adv"].algorithm == "hacpo" and not by_method["hacpo-adv"].hacpo.capability_baseline
    )
    assert by_method["naive-sym"].algorithm == "naive" and by_method["naive-sym"].hacpo.naive_symmetric
    assert by_method["hacpo"].label == "" and by_method["hacpo"].hacpo.capability_baseline


def test_run_experiments_and_run_seeds(trained):
    runs = compare.run_experiments(
        [QUICKSTART, ROOT / "experiments" / "ablations" / "hacpo-bytes.yaml"], seeds=[0, 1]
    )
    assert {m: len(p) for m, p in runs.items()} == {"hacpo": 2, "hacpo-bytes": 2}
    assert [(c.method, c.seed) for c in trained] == [
        ("hacpo", 0),
        ("hacpo-bytes", 0),
        ("hacpo", 1),
        ("hacpo-bytes", 1),
    ]
    trained.clear()
    from workbench.config.loading import load_experiment

    cfg = load_experiment(QUICKSTART, {"seeds": [3, 1]})
    assert compare.run_seeds(cfg) == [Path("/runs/hacpo/seed3"), Path("/runs/hacpo/seed1")]
    assert compare.run_seeds(load_experiment(QUICKSTART)) == [Path("/runs/hacpo/seed0")]


def test_short_run_trains_once_with_the_config_seed(trained, tmp_path):
    data = yaml.safe_load(QUICKSTART.read_text()) | {"seeds": [4, 5], "seed": 2}
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(data))
    assert compare.ShortRun(tmp_path / "e.yaml")({"alpha": 2.0, "steps": 3}) == Path("/runs/hacpo/seed2")
    assert trained[0].hacpo.alpha == 2.0 and trained[0].train.steps == 3 and trained[0].seeds is None


@pytest.fixture
def comparison(tmp_path):
    runs = {"hacpo": [], "gspo": []}
    for seed in (0, 1, 2):
        runs["hacpo"].append(
            write_run(tmp_path, seed=seed, final=(0.50 + 0.02 * seed, 0.70), avg=(0.45, 0.65))
        )
        runs["gspo"].append(
            write_run(tmp_path, algorithm="gspo", seed=seed, final=(0.48, 0.70), avg=(0.44, 0.6))
        )
    runs["gspo"].append(write_run(tmp_path, algorithm="gspo", seed=3, done=False))
    return runs


def test_accuracy_table_mean_std_n_and_paired_gains(comparison):
    table = accuracy.accuracy_table(comparison)
    assert list(table.index) == [("a", "greedy_acc"), ("a", "avg@4"), ("b", "greedy_acc"), ("b", "avg@4")]
    groups = list(dict.fromkeys(table.columns.get_level_values(0)))
    assert groups == ["initial", "hacpo", "gspo", "hacpo − gspo"]
    a = table.loc[("a", "greedy_acc")]
    assert a[("hacpo", "mean")] == pytest.approx(0.52) and a[("hacpo", "std")] == pytest.approx(0.02)
    assert a[("hacpo", "n")] == 3 and a[("gspo", "n")] == 3  # the unfinished 4th GSPO seed is left out
    assert a[("initial", "mean")] == pytest.approx(0.4) and a[("initial", "n")] == 3
    assert a[("hacpo − gspo", "mean")] == pytest.approx(0.04) and a[("hacpo − gspo", "std")] == pytest.approx(
        0.02
    )
    se_run = math.sqrt(0.5 * 0.5 / 100)
    assert a[("initial", "se")] == pytest.approx(math.sqrt(0.4 * 0.6 / 100), abs=1e-3)
    assert a[("hacpo", "se")] == pytest.approx(math.sqrt(0.02**2 / 3 + se_run**2), abs=2e-3)
    assert list(table.attrs["excluded"]["reason"]) == ["not finished (no DONE marker)"]
    greedy_only = accuracy.accuracy_table({m: p[0] for m, p in comparison.items()}, metrics=["greedy_acc"])
    assert list(greedy_only.index) == [("a", "greedy_acc"), ("b", "greedy_acc")]
    assert greedy_only.loc[("a", "greedy_acc"), ("hacpo", "n")] == 1


def test_save_accuracy_table_csv_columns_and_latex(comparison, tmp_path):
    table = accuracy.accuracy_table(comparison)
    files = report.save_accuracy_table(table, tmp_path / "out")
    assert [f.name for f in files] == ["accuracy.tex", "accuracy.csv", "accuracy.md", "excluded.csv"]
    text = (tmp_path / "out" / "accuracy.md").read_text()
    assert "mean ± std over 3 seeds" in text and "| a | greedy_acc | 0.400 ± 0.000 (SE 0.049) |" in text
    csv = pd.read_csv(tmp_path / "out" / "accuracy.csv", index_col="agent")
    assert {
        "metric",
        "initial_mean",
        "initial_std",
        "initial_n",
        "initial_se",
        "hacpo_mean",
        "gspo_se",
    } <= set(csv)
    tex = (tmp_path / "out" / "accuracy.tex").read_text()
    assert r"0.520 $\pm$ 0.020" in tex and "over 3 seeds" in tex
