"""Tracking sinks fed through the step callback: TensorBoard, Trackio, Weights & Biases (offline)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from workbench.config.loading import load_experiment
from workbench.core.env import PROJECT_ROOT
from workbench.train.rundir import RunWriter, create_run_dir
from workbench.train.tracking import SINKS, Tracker, report_to_problem

QUICKSTART = PROJECT_ROOT / "experiments" / "quickstart.yaml"
STEPS = [
    {"step": 0, "eval/acc/a": 0.25, "algorithm": "hacpo"},
    {"step": 1, "train/acc/a": 0.5, "loss/a": -0.1, "bad": float("nan"), "flag": True},
]


def _run(tmp_path: Path, *sinks: str):
    cfg = load_experiment(QUICKSTART, {"output.root": str(tmp_path), "output.report_to": list(sinks)})
    run_dir = create_run_dir(tmp_path, cfg.experiment)
    RunWriter(run_dir).write_config(cfg.to_dict())
    return cfg, run_dir


def test_the_sinks_are_the_configs():
    from workbench.config.experiment import REPORT_TO

    assert tuple(SINKS) == REPORT_TO


def test_nothing_is_tracked_by_default(tmp_path):
    cfg, run_dir = _run(tmp_path)
    with Tracker(cfg) as tracker:
        for metrics in STEPS:
            tracker.on_step(metrics)
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml"]


def test_wandb_gets_numbers_per_step_offline(tmp_path, monkeypatch):
    calls = []

    class FakeRun:
        def log(self, values, step):
            calls.append(("log", step, values))

        def finish(self):
            calls.append(("finish",))

    def init(**kwargs):
        calls.append(("init", kwargs))
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init, __spec__=object()))
    monkeypatch.setattr("workbench.train.tracking.importlib.util.find_spec", lambda name: object())
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg, run_dir = _run(tmp_path, "wandb")
    with Tracker(cfg) as tracker:  # the run directory is found on the first step
        for metrics in STEPS:
            tracker.on_step(metrics)
    (_, kwargs), *logs, finish = calls
    assert kwargs["mode"] == "offline" and kwargs["dir"] == str(run_dir) and kwargs["project"] == "quickstart"
    assert logs == [("log", 0, {"eval/acc/a": 0.25}), ("log", 1, {"train/acc/a": 0.5, "loss/a": -0.1})]
    assert finish == ("finish",)


def test_a_missing_or_unknown_sink_is_named(monkeypatch):
    assert report_to_problem(["tensorboard", "neptune"]) == (
        "output.report_to = ['tensorboard', 'neptune'] is not allowed: 'neptune' is not one of "
        "['tensorboard', 'trackio', 'wandb']"
    )
    monkeypatch.setattr("workbench.train.tracking.importlib.util.find_spec", lambda name: None)
    assert "'trackio' is not installed (pip install trackio)" in report_to_problem(["trackio"])


def test_tensorboard_is_installed_by_the_set_up():
    assert report_to_problem(["tensorboard"]) is None  # pyproject.toml pins it among the dependencies


def test_tensorboard_events_in_the_run_directory(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg, run_dir = _run(tmp_path, "tensorboard")
    with Tracker(cfg, run_dir) as tracker:
        for metrics in STEPS:
            tracker.on_step(metrics)
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["eval/acc/a", "loss/a", "train/acc/a"]
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("loss/a")] == [(1, -0.1)]


@pytest.mark.skipif(importlib.util.find_spec("trackio") is None, reason="trackio is not installed")
def test_trackio_logs_locally(tmp_path):
    """In a fresh process: trackio reads ``TRACKIO_DIR`` when imported (kept out of the user's cache)."""
    code = (
        "import sys; from pathlib import Path\n"
        "from workbench.config.loading import load_experiment\n"
        "from workbench.train.tracking import Tracker\n"
        f"cfg = load_experiment({str(QUICKSTART)!r}, {{'output.report_to': ['trackio']}})\n"
        "with Tracker(cfg, Path(sys.argv[1])) as t:\n"
        "    t.on_step({'step': 0, 'eval/acc/a': 0.25}); t.on_step({'step': 1, 'eval/acc/a': 0.5})\n"
        "import trackio.sqlite_storage as s\n"
        "print(s.SQLiteStorage.get_logs('quickstart', s.SQLiteStorage.get_runs('quickstart')[0]))\n"
    )
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "0.5" in out.stdout and any((tmp_path / "trackio").iterdir())


def test_a_cli_run_shows_up_in_tensorboard(tmp_path):
    """``--set output.report_to=[tensorboard]`` on a first ``run``: the run's scalars are in its folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    overrides = [
        "train.steps=2", "train.prompts_per_step=2", "train.group_size=2", "train.minibatch_prompts=1",
        "train.max_new_tokens=6", "train.eval_every=0", "train.eval_samples=0", "task.train_size=8",
        "task.eval_size=2", f"output.root={tmp_path}", "output.report_to=[tensorboard]",
    ]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "workbench", "run", str(QUICKSTART), "--set", *overrides],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (run_dir,) = (tmp_path / "quickstart").iterdir()
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"train/acc/gpt2-char", "train/lr/llama-bpe", "eval/acc/gpt2-char"} <= set(tags)
    assert [e.step for e in events.Scalars("train/acc/gpt2-char")] == [1, 2]
