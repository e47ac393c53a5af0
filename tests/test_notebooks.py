"""Notebooks: the thin-notebook contract (by parsing), and every notebook executed headless in smoke mode.

The execution tests read the files the notebooks wrote (tables, figures, index), not the notebooks' outputs.
"""

import ast
import json
import sys
from pathlib import Path

import nbformat
import pandas as pd
import papermill
import pytest
import yaml

from workbench.jobs import runner

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ALLOWED_IMPORTS = {"workbench", "IPython", *sys.stdlib_module_names}


def _code_cells(path: Path) -> list:
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def test_every_issue_notebook_exists():
    names = {p.stem.split("_")[0] for p in NOTEBOOKS}
    assert {"01", "02", "03", "04", "05"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_thin_notebook_contract(path):
    cells = _code_cells(path)
    params = [c for c in cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "exactly one cell tagged 'parameters'"
    # The parameters cell: only `name: type = literal  # help` statements (papermill --help-notebook lists
    # them with their type and help).
    lines = params[0].source.splitlines()
    for node in ast.parse(params[0].source).body:
        assert isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name), ast.dump(node)
        assert node.value is not None, f"parameter {node.target.id} has no default"
        ast.literal_eval(node.value)  # a literal, never derived from another parameter
        last = lines[node.end_lineno - 1]
        assert "  # " in last, f"parameter without a trailing help comment: {last!r}"
    for cell in cells:
        assert not cell.outputs and cell.execution_count is None, "commit notebooks with outputs stripped"
        for node in ast.walk(ast.parse(cell.source)):
            assert not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda)
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                assert module.split(".")[0] in ALLOWED_IMPORTS, f"{path.name} imports {module}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_help_notebook_documents_every_parameter(path):
    params = papermill.inspect_notebook(str(path))
    assert params and all(p["help"] for p in params.values()), params
    assert all(p["inferred_type_name"] != "None" for p in params.values()), params  # typed
    assert "smoke" in params and "overrides" in params


def test_quickstart_smoke_writes_table_and_figures(tmp_path):
    out = runner.run_quickstart(smoke=True, out_dir=tmp_path / "quickstart", results_root=tmp_path / "runs")
    table = pd.read_csv(tmp_path / "quickstart" / "accuracy.csv", index_col="agent")
    greedy = table[table["metric"] == "greedy_acc"]  # a row per agent and metric, mean/std/n/se columns
    assert list(greedy.index) == ["gpt2-char", "llama-bpe"]
    means = ["initial_mean", "hacpo_mean", "gspo_mean"]
    assert set(means) <= set(table.columns)
    assert greedy[means].apply(lambda c: c.between(0, 1)).all().all()
    assert (tmp_path / "quickstart" / "accuracy.tex").read_text().count("\\\\") >= 2
    for figure in ("train_acc", "capability", "ratios"):
        for suffix in ("png", "svg", "html"):
            assert (tmp_path / "quickstart" / f"{figure}.{suffix}").stat().st_size > 500
    assert (tmp_path / "quickstart" / "01_quickstart.ipynb").is_file()
    assert out["table"].equals(table)


def test_notebook_parameters_set_the_schedule_and_the_rewards_of_every_run(tmp_path):
    rewards = [{"fn": "math_verify", "weight": 1.0}, {"fn": "format_boxed", "weight": 0.2}]
    assert runner.run_overrides(False, None, {"train.steps": 3}, lr_schedule="cosine", rewards=rewards) == {
        "train.steps": 3,
        "train.lr_schedule": "cosine",
        "task.rewards": rewards,
    }
    runner.execute_notebook(
        "01_quickstart.ipynb",
        tmp_path / "out",
        {
            "smoke": True,
            "algorithms": ["hacpo"],
            "results_root": str(tmp_path / "runs"),
            "lr_schedule": "cosine",
            "warmup_ratio": 0.5,
            "rewards": rewards,
        },
    )
    (config_path,) = (tmp_path / "runs").rglob("config.yaml")
    config = yaml.safe_load(config_path.read_text())
    assert config["train"]["lr_schedule"] == "cosine" and config["train"]["warmup_ratio"] == 0.5
    assert [(term["fn"], term["weight"]) for term in config["task"]["rewards"]] == [
        (term["fn"], term["weight"]) for term in rewards
    ]
    lines = (config_path.parent / "metrics.jsonl").read_text().splitlines()
    keys = set().union(*(json.loads(line) for line in lines))
    assert {"reward/gpt2-char/math_verify/mean", "reward/llama-bpe/format_boxed/std"} <= keys
    rates = [
        json.loads(line)["train/lr/gpt2-char"] for line in lines if "train/lr/gpt2-char" in json.loads(line)
    ]
    assert rates[0] < max(rates)  # warm-up: the first step's rate is below the peak


def test_reproduce_smoke_runs_every_job_and_indexes_it(tmp_path):
    index = runner.reproduce(smoke=True, results_root=tmp_path)
    root = tmp_path / "smoke"
    assert index == root / "index.md"
    text = index.read_text()
    for job in runner.JOBS:
        assert f"## {job}" in text
        assert (root / job / runner.JOBS[job].notebook).is_file()
    table1 = pd.read_csv(root / "benchmarks" / "table1.csv")
    methods = " ".join(table1.iloc[:, :2].astype(str).agg(" ".join, axis=1))
    for method in ("GRPO", "GSPO", "Naive", "HACPO"):
        assert method in methods, methods
    assert "AVG_mean" in table1.columns
    assert (root / "benchmarks" / "figure3.svg").stat().st_size > 500
    ablations = root / "ablations"
    assert {"comparison.csv", "verdicts.csv", "per_seed.csv", "comparison.md"} <= {
        p.name for p in ablations.iterdir()
    }
    claims = set(pd.read_csv(ablations / "verdicts.csv")["claim"])
    assert {"HACPO ≥ HACPO − Adv", "HACPO ≥ no Clip", "HACPO ≥ Naive (sym.)"} <= claims
    assert (ablations / "paper" / "table4.csv").is_file()
    assert (ablations / "paper" / "figure4.png").stat().st_size > 500
    assert (root / "regime" / "regime.csv").is_file()
    # Table 1 from the benchmarks' experiment alone, beside the regime's runs of other experiments.
    assert (root / "figures" / "table1.csv").is_file()
    assert (root / "figures" / "table2_3.csv").is_file()
    # Re-running skips finished runs: no new run directory appears.
    before = sorted(p for p in (root / "runs").rglob("config.yaml"))
    runner.reproduce(smoke=True, only=["benchmarks"], results_root=tmp_path)
    assert sorted(p for p in (root / "runs").rglob("config.yaml")) == before


def test_reproduce_rejects_unknown_job():
    with pytest.raises(ValueError, match="unknown job 'tables'; valid names"):
        runner.reproduce(smoke=True, only=["tables"])


def test_tune_notebook_executes_headless(tmp_path):
    target = runner.execute_notebook(
        "02_tune_hacpo.ipynb",
        tmp_path,
        {"smoke": True, "out_dir": str(tmp_path), "results_root": str(tmp_path / "runs")},
    )
    executed = json.loads(target.read_text())
    errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert (tmp_path / "cross_weight.csv").is_file()


@pytest.mark.parametrize("cwd", ["notebooks", "."], ids=["jupyterlab", "papermill"])
def test_diagnostics_notebook_reads_the_committed_real_pair_runs(tmp_path, cwd):
    from workbench.lab.diagnostics import run_label

    hacpo_seed_1 = [
        str(p.parent.relative_to(ROOT))
        for p in sorted((ROOT / "results" / "real_pair" / "real_pair").glob("*/config.yaml"))
        if run_label(p.parent) == "HACPO, seed 1"
    ]
    assert len(hacpo_seed_1) == 1, hacpo_seed_1
    runner.execute_notebook(
        "07_diagnostics.ipynb",
        tmp_path,
        {"runs": hacpo_seed_1, "agent": "gemma3", "out_dir": str(tmp_path), "smoke": True},
        cwd=ROOT / cwd,
    )
    arms = pd.read_csv(tmp_path / "arms.csv")
    assert list(arms["label"]) == ["HACPO, seed 1"]
    assert arms["greedy 2"].iloc[0] < arms["greedy 1"].iloc[0]  # the collapse: 2-op items fell
    assert (tmp_path / "diagnostics.svg").stat().st_size > 500


def test_project_paths_resolve_from_any_working_directory(tmp_path, monkeypatch):
    from workbench.core.env import PROJECT_ROOT, project_path

    monkeypatch.chdir(ROOT / "notebooks")  # where a JupyterLab kernel starts
    assert project_path("experiments/quickstart.yaml") == PROJECT_ROOT / "experiments" / "quickstart.yaml"
    assert project_path("results/runs") == PROJECT_ROOT / "results" / "runs"
    monkeypatch.chdir(tmp_path)  # a user's own file next to where they typed the command wins
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "quickstart.yaml").write_text("{}")
    assert project_path("experiments/quickstart.yaml") == tmp_path / "experiments" / "quickstart.yaml"
    assert project_path(tmp_path / "x") == tmp_path / "x"
    assert runner.run_overrides(False, "results/runs") == {
        "output.root": str(PROJECT_ROOT / "results" / "runs")
    }


def test_notebooks_name_the_project_kernel_and_run_in_their_folder(monkeypatch, tmp_path):
    for path in NOTEBOOKS:
        assert nbformat.read(path, as_version=4).metadata.kernelspec.name == runner.KERNEL
    seen = {}
    monkeypatch.setattr(
        papermill, "execute_notebook", lambda src, out, **kw: seen.update(kw) or Path(out).touch()
    )
    runner.execute_notebook("05_figures.ipynb", tmp_path)
    assert seen["cwd"] == str(ROOT / "notebooks")  # as in JupyterLab: the executions above ran there
    assert seen["kernel_name"] in (runner.KERNEL, "python3")


def test_trained_notebooks_take_seeds_and_the_runner_passes_them(monkeypatch, tmp_path):
    for name in ("01_quickstart", "03_benchmarks", "04_ablations", "06_regime"):
        params = papermill.inspect_notebook(str(ROOT / "notebooks" / f"{name}.ipynb"))
        assert "seeds" in params and params["seeds"]["help"], params
    assert (
        papermill.inspect_notebook(str(ROOT / "notebooks" / "01_quickstart.ipynb"))["seeds"]["default"]
        == "[0]"
    )
    calls = []
    monkeypatch.setattr(runner, "execute_notebook", lambda nb, out, params, **kw: calls.append((nb, params)))
    monkeypatch.setattr(runner, "write_index", lambda root: root / "index.md")
    runner.reproduce(smoke=True, results_root=tmp_path, seeds=[3, 4])
    assert [p.get("seeds") for _, p in calls] == [[3, 4], [3, 4], [3, 4], None]
    with pytest.raises(ValueError, match="distinct integers"):
        runner.reproduce(smoke=True, results_root=tmp_path, seeds=[1, 1])
