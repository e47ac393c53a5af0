"""The command line in a TRL user's first hour: ``--set`` on either side of the path, what each run will do
said before it starts, the held-out table at the end, a summary beside the runs that never replaces a
committed one, the step line and progress bars (quiet under pytest and papermill)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from fake_runs import write_run

from workbench.__main__ import main
from workbench.core import env
from workbench.core.env import PROJECT_ROOT
from workbench.core.progress import bar
from workbench.jobs.commands import committed_files, split_experiment
from workbench.jobs.runner import _quiet_kernel, smoke_overrides
from workbench.train.run import step_line

Q = "experiments/quickstart.yaml"


@pytest.fixture
def cli(caplog):
    caplog.set_level(logging.INFO)

    def call(*argv: str) -> tuple[int, str]:
        caplog.clear()
        code = main(list(argv))
        return code, "\n".join(caplog.messages)

    return call


def test_set_before_or_after_the_path():
    assert split_experiment(None, ["train.steps=3", Q]) == (Q, ["train.steps=3"])
    assert split_experiment(Q, ["train.steps=3", "train.lr=0.1"]) == (Q, ["train.steps=3", "train.lr=0.1"])
    with pytest.raises(Exception, match="one experiment YAML, before or after --set"):
        split_experiment(None, ["train.steps=3", Q, "other.yaml"])


def test_the_dry_run_says_where_each_run_writes_and_what_it_does(cli, tmp_path):
    code, out = cli(
        "run", "--set", "train.steps=3", f"output.root={tmp_path}", Q, "--dry-run", "--seeds", "0,1"
    )
    assert code == 0, out
    assert "steps: 3" in out
    assert f"# seed 0: start a new run in {tmp_path / 'quickstart'}/" in out
    assert f"# seed 1: start a new run in {tmp_path / 'quickstart'}/" in out


def test_a_run_says_start_then_skip_and_ends_with_its_held_out_table(cli, tmp_path):
    sets = [f"{k}={v}" for k, v in smoke_overrides().items()] + [f"output.root={tmp_path}"]
    code, out = cli("run", Q, "--set", *sets)
    assert code == 0, out
    (run_dir,) = (tmp_path / "quickstart").iterdir()
    assert f"seed 0: start a new run in {tmp_path / 'quickstart'}/" in out
    table = out[out.index("held-out accuracy:") :]
    assert "| agent | benchmark | metric | step 0 | step 2 |" in table
    assert (
        "| gpt2-char | embedded | greedy_acc |" in table and "| llama-bpe | embedded | greedy_acc |" in table
    )
    assert "step 2/2: rollout" in out and "update" in out  # the step line: each phase's time
    code, out = cli("run", Q, "--dry-run", "--set", *sets)
    assert f"# seed 0: skip {run_dir} (finished with this config" in out
    (run_dir / "DONE").unlink()
    code, out = cli("run", Q, "--dry-run", "--set", *sets)
    assert f"# seed 0: resume {run_dir} from step 2" in out


def test_summarize_writes_beside_the_runs_and_prints_the_table(cli, tmp_path):
    for algorithm in ("hacpo", "gspo"):
        write_run(tmp_path / "runs", algorithm=algorithm)
    code, out = cli("summarize", str(tmp_path / "runs"))
    assert code == 0, out
    assert (tmp_path / "runs" / "summary" / "comparison.md").is_file()
    assert "| agent |" in out  # the comparison table, printed


def test_summarize_refuses_to_replace_a_committed_summary_without_force(cli, tmp_path):
    committed = PROJECT_ROOT / "results" / "summary"
    tracked = committed_files(committed)
    if not tracked:
        pytest.skip("no git checkout with a committed results/summary here")
    code, out = cli("summarize", str(tmp_path), "--out", str(committed))
    assert code == 2 and "holds no run directory" in out  # nothing written either way
    write_run(tmp_path / "runs")
    code, out = cli("summarize", str(tmp_path / "runs"), "--out", str(committed))
    assert code == 2 and "it holds a committed summary" in out and "--force" in out
    assert committed_files(tmp_path) == []


def test_the_step_line_says_which_phase_took_how_long():
    metrics = {
        "time/rollout_s": 12.14, "time/generate_s": 10.2, "time/score_s": 1.9, "time/update_s": 20.3,
        "time/step_s": 32.5, "time/eval_s": 4.0, "train/acc/a": 0.5, "eval/acc/a": 0.25, "train/acc/b": 0.75,
    }  # fmt: skip
    assert step_line(3, 40, metrics, ["a", "b"]) == (
        "step 3/40: rollout 12.1 s (generate 10.2, score 1.9 agent-s), update 20.3 s, eval 4.0 s, "
        "step 36.5 s; a 0.50 (eval 0.250), b 0.75"
    )
    assert (
        step_line(0, 40, {"eval/acc/a": 0.25, "time/eval_s": 1.0}, ["a"])
        == "step 0/40: eval 1.0 s; a eval 0.250"
    )


def test_progress_bars_are_quiet_in_tests_and_papermill_and_shown_on_request(monkeypatch, capsys):
    assert not env.progress_enabled()  # pytest runs this test
    with bar(3, "quiet") as progress:
        assert progress.disable
    monkeypatch.setenv("HACPO_PROGRESS", "1")
    with bar(3, "shown") as progress:
        progress.update(3)
    assert "shown" in capsys.readouterr().err
    monkeypatch.delenv("HACPO_PROGRESS")
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    assert env.progress_enabled()  # a terminal or a JupyterLab kernel
    with _quiet_kernel():
        assert (
            os.environ["HACPO_PROGRESS"] == "0" and not env.progress_enabled()
        )  # what papermill's kernel sees
    assert "HACPO_PROGRESS" not in os.environ


def test_a_terminal_run_draws_bars_inside_a_step(tmp_path):
    sets = [f"{k}={v}" for k, v in smoke_overrides().items()] + [f"output.root={tmp_path}"]
    environ = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    out = subprocess.run(
        [sys.executable, "-m", "workbench", "run", Q, "--set", *sets],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600, env=environ,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    for phase in ("gpt2-char generate", "llama-bpe score", "gpt2-char update", "eval embedded greedy"):
        assert phase in out.stderr, phase


def test_the_command_line_writes_runs_where_the_notebooks_do():
    from workbench.config.sections import OutputConfig

    assert OutputConfig().root == "results/runs"  # the runner's and 05_figures' root (workbench.jobs.runner)
