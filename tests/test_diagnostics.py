"""Labels of the diagnostics view: one per run, also when a rerun sits beside the run it repeats."""

import yaml

from workbench.lab.diagnostics import run_labels


def _run(path, **config):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    return path


def test_runs_that_share_a_label_are_told_apart_by_their_run_id(tmp_path):
    committed = _run(tmp_path / "a" / "20261204T152102Z-d948", algorithm="hacpo", label="", seed=1)
    rerun = _run(tmp_path / "b" / "20261207T030516Z-5fa9", algorithm="hacpo", label="", seed=1)
    arm = _run(tmp_path / "b" / "20261207T045829Z-b4bc", algorithm="hacpo", label="hacpo-omega", seed=1)
    assert run_labels([committed, rerun, arm]) == {
        committed.name: "HACPO, seed 1 · 20261204T152102Z-d948",
        rerun.name: "HACPO, seed 1 · 20261207T030516Z-5fa9",
        arm.name: "HACPO − ω, seed 1",
    }
    assert run_labels([committed, arm])[committed.name] == "HACPO, seed 1"


def test_pick_runs_keeps_the_methods_in_their_order_and_one_seed(tmp_path):
    from workbench.lab.diagnostics import pick_runs

    gspo = _run(tmp_path / "r" / "g0", algorithm="gspo", seed=0)
    hacpo = _run(tmp_path / "r" / "h0", algorithm="hacpo", label="", seed=0)
    adv = _run(tmp_path / "r" / "a0", algorithm="hacpo", label="hacpo-adv", seed=0)
    other_seed = _run(tmp_path / "r" / "a1", algorithm="hacpo", label="hacpo-adv", seed=1)
    runs = [gspo, hacpo, adv, other_seed]
    assert pick_runs(runs, ["hacpo-adv", "gspo"], 0) == [adv, gspo]
    assert pick_runs(runs, seed=1) == [other_seed]
    assert pick_runs(runs) == runs
