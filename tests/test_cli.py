"""The command line: resolved config without training, exit code 2 with a named bad input, and the research
loop a person runs (train, evaluate the trained agents, export them, summarize) end to end on tiny agents."""

from __future__ import annotations

import importlib.util
import logging

import pandas as pd
import pytest
import yaml
from fake_runs import write_run

from workbench.__main__ import _seeds, main
from workbench.agents.models.loading import load_agent
from workbench.jobs.runner import smoke_overrides

Q = "experiments/quickstart.yaml"


@pytest.fixture
def cli(caplog):
    """``main(argv)`` in this process; returns (exit code, everything it logged)."""
    caplog.set_level(logging.INFO)

    def call(*argv: str) -> tuple[int, str]:
        caplog.clear()
        code = main(list(argv))
        return code, "\n".join(caplog.messages)

    return call


def test_dry_run_prints_the_resolved_config_with_several_overrides(cli):
    code, out = cli("run", Q, "--dry-run", "--set", "train.steps=3", "train.lr=0.002", "--seeds", "0,1")
    assert code == 0
    resolved = yaml.safe_load(out[out.index("experiment: quickstart") :].split("# checked")[0])
    assert (
        resolved["train"]["steps"] == 3 and resolved["train"]["lr"] == 0.002 and resolved["seeds"] == [0, 1]
    )
    assert "# checked: no bad input; would train 2 run(s), seeds [0, 1]" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--set", "agents.0.model=tiny:gpt3"],
            "agents[0].model = 'tiny:gpt3' is not allowed: tiny presets are",
        ),
        (["--set", "task.reward=exact"], "task.reward = 'exact' is not allowed: one of ['math_verify'"),
        (["--set", "task.source=file:nope.jsonl"], "task.source = 'file:nope.jsonl': no task file at"),
        (["--set", "train.stepz=3"], "unknown key train.stepz; valid keys of 'train': ['steps'"),
        (["--set", "foo"], "override 'foo': expected key=value"),
    ],
)
def test_a_bad_input_exits_2_naming_it(cli, argv, message):
    code, out = cli("run", Q, "--dry-run", *argv)
    assert code == 2 and message in out and "Traceback" not in out


def test_bad_targets_of_eval_export_and_summarize_exit_2(cli, tmp_path):
    assert cli("eval", "tiny:gpt2-char", "--source", "nope")[1].count("unknown task source 'nope'") == 1
    code, out = cli("export", str(tmp_path))
    assert code == 2 and "is not allowed: a run directory holding config.yaml" in out
    code, out = cli("summarize", str(tmp_path))
    assert code == 2 and "it holds no run directory" in out


def test_summarize_checks_a_rerun_against_a_committed_comparison(cli, tmp_path):
    """``--check-against``: a table and "N of M cells agree within 2 SE" (exit 0), rerun_check.csv next to
    the summary; a missing file, or the file this summary would overwrite, exits 2 before anything is
    written. Fake run directories, no training."""
    runs = tmp_path / "runs"
    for algorithm, final in (("hacpo", (0.5, 0.7)), ("gspo", (0.4, 0.6))):
        write_run(runs, algorithm=algorithm, final=final)
    assert cli("summarize", str(runs), "--out", str(tmp_path / "committed"))[0] == 0
    committed = tmp_path / "committed" / "comparison.csv"
    code, out = cli(
        "summarize", str(runs), "--out", str(tmp_path / "rerun"), "--check-against", str(committed)
    )
    assert code == 0, out
    assert "| model | hacpo | a | greedy | 0.500 | 0.500 | +0.000 |" in out
    assert "6 of 6 cells agree within 2 SE" in out  # greedy of 2 methods x 2 agents, initial greedy of 2
    check = pd.read_csv(tmp_path / "rerun" / "rerun_check.csv")
    assert len(check) == 6 and check["agrees"].all()

    missing = tmp_path / "nope" / "comparison.csv"
    code, out = cli(
        "summarize", str(runs), "--out", str(tmp_path / "unwritten"), "--check-against", str(missing)
    )
    assert code == 2 and f"--check-against = '{missing}' is not allowed: no such file" in out
    assert not (tmp_path / "unwritten").exists()
    code, out = cli(
        "summarize", str(runs), "--out", str(tmp_path / "committed"), "--check-against", str(committed)
    )
    assert code == 2 and "it is the comparison.csv this summary would overwrite" in out
    code, out = cli("summarize", str(runs), "--out", str(tmp_path / "rerun"))  # no check: none left stale
    assert code == 0 and not (tmp_path / "rerun" / "rerun_check.csv").exists()


def test_summarize_pools_the_code_versions_it_is_told_to_across_folders(cli, tmp_path):
    """Two folders of seeds made by two code versions: by default one version is averaged, with
    ``--same-code`` both (n = 3), and groups.csv says so; one version alone is refused, naming it."""
    for seed, version, folder in (
        (0, "01d000000000", "first"),
        (1, "01d000000000", "first"),
        (2, "7e3000000000", "later"),
    ):
        write_run(tmp_path / folder, algorithm="hacpo", seed=seed, version=version)
    roots = [str(tmp_path / "first"), str(tmp_path / "later")]
    assert cli("summarize", *roots, "--out", str(tmp_path / "apart"))[0] == 0
    assert pd.read_csv(tmp_path / "apart" / "comparison.csv")["n"].max() == 1  # the newest version alone
    code, out = cli(
        "summarize", *roots, "--out", str(tmp_path / "pooled"), "--same-code", "01d000000000,7e3000000000"
    )
    assert code == 0, out
    assert set(pd.read_csv(tmp_path / "pooled" / "comparison.csv")["n"]) == {3}
    group = pd.read_csv(tmp_path / "pooled" / "groups.csv").iloc[0]
    assert group["code_version"] == "01d000000000+7e3000000000" and group["seeds"] == "0 1 2"
    assert "pooled by the user" in group["chosen_because"]
    markdown = (tmp_path / "pooled" / "comparison.md").read_text(encoding="utf-8")
    assert (
        "Averaged across code versions" in markdown
        and "seeds 0 1 2 of code versions 01d000000000, 7e3" in markdown
    )
    code, out = cli("summarize", *roots, "--out", str(tmp_path / "one"), "--same-code", "01d000000000")
    assert code == 2 and "same_code = ['01d000000000'] is not allowed: name two code versions" in out


def test_seeds_are_distinct_non_negative_integers():
    assert _seeds("0,1,2") == (0, 1, 2)
    for bad in ("0,0", "-1", "a", ""):
        with pytest.raises(Exception, match="distinct integers >= 0"):
            _seeds(bad)


def test_train_evaluate_export_and_summarize_from_the_command_line(cli, tmp_path):
    sets = [f"{k}={v}" for k, v in smoke_overrides().items()] + [f"output.root={tmp_path / 'runs'}"]
    tensorboard = importlib.util.find_spec("tensorboard") is not None
    sets += ["output.report_to=[tensorboard]"] if tensorboard else []
    code, out = cli("run", Q, "--set", *sets)
    assert code == 0, out
    (run_dir,) = sorted((tmp_path / "runs" / "quickstart").iterdir())
    assert (run_dir / "DONE").is_file()
    assert not tensorboard or any((run_dir / "tensorboard").iterdir())

    code, out = cli(
        "eval", str(run_dir), "--source", "embedded", "--n", "6", "--k", "2", "--out", str(tmp_path / "ev")
    )
    assert code == 0, out
    evals = pd.read_csv(tmp_path / "ev" / "evals.csv")
    assert set(evals["agent"]) == {"gpt2-char", "llama-bpe"} and set(evals["step"]) == {2}
    assert {"greedy_acc", "avg@2", "pass@1", "pass@2", "best@2"} <= set(evals["metric"])
    assert evals["value"].between(0, 1).all() and (evals["items"] == 6).all()
    assert "avg@2 per agent and benchmark (Table-1 layout, one run each)" in out
    table = pd.read_csv(tmp_path / "ev" / "table1.csv")  # the Table-1 layout: mean, std, n, se per column
    assert list(table.columns[:6]) == [
        "agent",
        "model",
        "embedded_mean",
        "embedded_std",
        "embedded_n",
        "embedded_se",
    ]
    assert set(table["model"]) == {"gpt2-char (HACPO)", "llama-bpe (HACPO)"} and (table["AVG_n"] == 1).all()
    assert (tmp_path / "ev" / "table1.tex").is_file() and (tmp_path / "ev" / "samples.jsonl").is_file()

    code, out = cli("export", str(run_dir), "--agent", "llama-bpe", "--out", str(tmp_path / "hf"))
    assert code == 0, out
    exported = load_agent(str(tmp_path / "hf" / "llama-bpe" / "model"))
    assert exported.model.config.model_type == "llama"

    code, out = cli("summarize", str(tmp_path / "runs"), "--out", str(tmp_path / "summary"))
    assert code == 0, out
    assert (tmp_path / "summary" / "comparison.md").is_file()
