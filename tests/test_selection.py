"""Which runs may be averaged over seeds (selection.select_runs): finished, same config but for the seed, same
code version; everything else is listed with its reason. Tiny run directories written by hand."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from workbench.lab import selection
from workbench.train.rundir import RunWriter, create_run_dir

CURRENT = "c0de00000000"


def _run(
    root: Path,
    seed: int,
    *,
    experiment: str = "pair",
    algorithm: str = "hacpo",
    lr: float = 1e-4,
    version: str | None = CURRENT,
    done: bool = True,
    finished: str = "2026-01-01T00:00:00+00:00",
    resumed_with: str | None = None,
    output_root: str = "results",
    weights: dict[str, str] | None = None,
    resumed_weights: dict[str, str] | None = None,
) -> Path:
    run_dir = create_run_dir(root, experiment)
    writer = RunWriter(run_dir)
    writer.write_config(
        {
            "experiment": experiment,
            "algorithm": algorithm,
            "seed": seed,
            "seeds": [0, 1, 2],
            "agents": [{"name": "a", "model": "tiny:a"}, {"name": "b", "model": "tiny:b"}],
            "train": {"lr": lr, "steps": 4},
            "output": {"root": output_root, "run_id": None},
        }
    )
    env: dict = {"python": "3.11"} | ({"code_version": version} if version is not None else {})
    if weights is not None:
        env["start_weights"] = weights
    if resumed_with is not None or resumed_weights is not None:
        env["resumes"] = [{"code_version": resumed_with or version, "start_weights": resumed_weights}]
    (run_dir / "environment.json").write_text(json.dumps(env))
    if done:
        (run_dir / "DONE").write_text(json.dumps({"steps": 4, "finished_at": finished}))
    return run_dir


def _reasons(selection: selection.RunSelection) -> dict[str, str]:
    return {
        Path(r).name: reason for r, reason in zip(selection.excluded["run_dir"], selection.excluded["reason"])
    }


def test_seeds_of_one_config_are_kept_and_outsiders_listed(tmp_path):
    kept = [_run(tmp_path, s, output_root=f"out{s}") for s in (0, 1, 2)]  # seeds and output.* may differ
    unfinished = _run(tmp_path, 3, done=False)
    unknown = _run(tmp_path, 4, version=None)
    mixed = _run(tmp_path, 5, resumed_with="0ther0000000")
    other_lr = _run(tmp_path, 6, lr=1e-3, finished="2025-01-01T00:00:00+00:00")
    gspo = _run(tmp_path, 0, algorithm="gspo")
    sel = selection.select_runs(tmp_path, current_version=CURRENT)
    assert sel.runs == sorted(p.resolve() for p in [*kept, gspo])
    reasons = _reasons(sel)
    assert reasons[unfinished.name] == "not finished (no DONE marker)"
    assert reasons[unknown.name].startswith("code version unknown (environment.json lacks code_version")
    assert reasons[mixed.name] == "resumed under other code (code versions ['0ther0000000', 'c0de00000000'])"
    assert reasons[other_lr.name] == "config differs from the chosen runs in train.lr"
    assert list(sel.excluded.columns) == list(selection.EXCLUDED_COLUMNS)
    groups = sel.groups.set_index("method")
    assert groups.loc["hacpo", "seeds"] == [0, 1, 2] and groups.loc["hacpo", "runs"] == 3
    assert groups.loc["hacpo", "chosen_because"] == "made by the current code version"
    assert groups.loc["gspo", "seeds"] == [0]


def test_current_code_wins_else_the_most_recent_group(tmp_path):
    old = [_run(tmp_path, s, version="01d000000000", finished="2026-02-01T00:00:00+00:00") for s in (0, 1)]
    new = [_run(tmp_path, s, finished="2026-01-01T00:00:00+00:00") for s in (0, 1)]
    sel = selection.select_runs(tmp_path, current_version=CURRENT)
    assert sel.runs == sorted(p.resolve() for p in new)  # the current code, though older
    assert set(_reasons(sel).values()) == {
        "code version 01d000000000 differs from the chosen c0de00000000 (made by the current code version)"
    }
    elsewhere = selection.select_runs(tmp_path, current_version="ffffffffffff")
    assert elsewhere.runs == sorted(p.resolve() for p in old)  # no current-code group: the newest
    assert "most recently finished" in elsewhere.groups.loc[0, "chosen_because"]
    assert len(elsewhere.excluded) == 2


def test_duplicate_seed_keeps_the_newer_run_and_experiments_are_separate(tmp_path):
    first = _run(tmp_path, 0, finished="2026-01-01T00:00:00+00:00")
    second = _run(tmp_path, 0, finished="2026-01-02T00:00:00+00:00")
    other = _run(tmp_path, 0, experiment="size")
    sel = selection.select_runs(tmp_path, current_version=CURRENT)
    assert sel.runs == sorted(p.resolve() for p in [second, other])
    assert _reasons(sel) == {first.name: f"seed 0 also in {second.name} (newer, same config)"}
    assert sorted(sel.groups["experiment"]) == ["pair", "size"]


def test_default_version_is_this_code_and_files_may_be_broken(tmp_path):
    from workbench.core.machine import code_version

    run = _run(tmp_path, 0, version=code_version())
    broken = _run(tmp_path, 1)
    (broken / "config.yaml").write_text("- not a mapping\n")
    os.utime(run / "DONE")
    sel = selection.select_runs([run, broken])
    assert (
        sel.runs == [run.resolve()]
        and sel.groups.loc[0, "chosen_because"] == "made by the current code version"
    )
    assert _reasons(sel)[broken.name].startswith("config.yaml unreadable")
    with pytest.raises(FileNotFoundError):
        selection.select_runs(tmp_path / "nope")


SAME = {"a": "a" * 64, "b": "b" * 64}


def test_only_runs_with_the_same_starting_weights_are_averaged(tmp_path):
    kept = [_run(tmp_path, s, weights=SAME) for s in (0, 1, 2)]
    other_b = _run(tmp_path, 3, weights={**SAME, "b": "c" * 64}, finished="2026-03-01T00:00:00+00:00")
    older = _run(tmp_path, 4)  # no digests recorded: unknown, kept as before
    changed = _run(tmp_path, 5, weights=SAME, resumed_weights={**SAME, "a": "d" * 64})
    gspo = [_run(tmp_path, s, algorithm="gspo") for s in (0, 1)]
    sel = selection.select_runs(tmp_path, current_version=CURRENT)
    assert sel.runs == sorted(p.resolve() for p in [*kept, older, *gspo])
    reasons = _reasons(sel)
    # The digests most runs share win, though the outsider finished last.
    assert reasons[other_b.name] == (
        "starting weights of agent b differ: cccccccccccc vs bbbbbbbbbbbb in the chosen runs"
    )
    assert (
        reasons[changed.name]
        == "starting weights of agent a changed on resume: aaaaaaaaaaaa then dddddddddddd"
    )
    notes = sel.groups.set_index("method")["start_weights"]
    assert notes["hacpo"] == "same in 3 runs; not recorded in 1 (older run): unchecked"
    assert notes["gspo"] == "not recorded (older runs)"


def test_a_tie_between_starting_weights_goes_to_the_most_recently_finished(tmp_path):
    first = _run(tmp_path, 0, weights=SAME, finished="2026-01-01T00:00:00+00:00")
    second = _run(tmp_path, 1, weights={"a": "e" * 64, "b": SAME["b"]}, finished="2026-01-02T00:00:00+00:00")
    sel = selection.select_runs(tmp_path, current_version=CURRENT)
    assert sel.runs == [second.resolve()]
    assert _reasons(sel) == {
        first.name: "starting weights of agent a differ: aaaaaaaaaaaa vs eeeeeeeeeeee in the chosen runs"
    }


def test_code_versions_the_user_names_are_pooled_and_the_groups_say_so(tmp_path):
    old = [_run(tmp_path, s, version="01d000000000") for s in (0, 1)]
    new = _run(tmp_path, 2, version="7e3000000000", finished="2026-02-01T00:00:00+00:00")
    resumed = _run(tmp_path, 3, version="01d000000000", resumed_with="7e3000000000")
    stranger = _run(tmp_path, 4, version="5742a0000000")
    alone = selection.select_runs(tmp_path, current_version=CURRENT)
    assert alone.runs == [new]  # by default one code version: the most recently finished group
    versions = ["01d000000000", "7e3000000000"]
    pooled = selection.select_runs(tmp_path, current_version=CURRENT, same_code=versions)
    assert pooled.runs == sorted([*old, new, resumed])  # a run resumed across the pooled versions counts too
    assert _reasons(pooled) == {
        stranger.name: "code version 5742a0000000 differs from the chosen 01d000000000+7e3000000000 "
        "(code versions 01d000000000, 7e3000000000 pooled by the user (same_code))"
    }
    group = pooled.groups.iloc[0]
    assert (group["code_version"], group["runs"], group["seeds"]) == (
        "01d000000000+7e3000000000",
        4,
        [0, 1, 2, 3],
    )
    with pytest.raises(ValueError, match=r"same_code = \['01d000000000'\] is not allowed: name two"):
        selection.select_runs(tmp_path, same_code=["01d000000000"])
