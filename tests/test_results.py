"""Run directories, RunWriter and the loaders (workbench.train.rundir and workbench.lab.frames)."""

from __future__ import annotations

import json
import math
import os
import re
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from workbench.config.loading import config_hash
from workbench.core import evalcsv
from workbench.lab import frames
from workbench.train import rundir as results
from workbench.train.rundir import RunWriter, create_run_dir, find_run

AGENTS = ("char-gpt2", "bpe-llama")


def _cfg(algorithm: str = "hacpo", seed: int = 0, experiment: str = "exp") -> dict:
    return {
        "experiment": experiment,
        "algorithm": algorithm,
        "seed": seed,
        "agents": [{"name": a, "lr": 1e-4} for a in AGENTS],
        "hacpo": {"alpha": 1.0, "delta": (0.8, 1.0), "window": 4},
    }


def _write_run(root: Path, algorithm: str, seed: int, steps: int = 4) -> Path:
    """A small run as the trainer writes it: evals (and 3 items per agent) at steps 0 and 2, logged in a
    separate call."""
    run_dir = create_run_dir(root, "exp")
    w = RunWriter(run_dir)
    w.write_config(_cfg(algorithm, seed))
    w.write_environment()
    for step in range(steps):
        if step % 2 == 0:
            w.log_metrics(step, {f"eval/acc/{a}": 0.1 * step + i + seed for i, a in enumerate(AGENTS)})
            w.append_evals(
                step, [{"agent": a, "benchmark": "arith", "metric": "avg@4", "value": 0.5} for a in AGENTS]
            )
            w.append_eval_items(
                step,
                [
                    {"agent": a, "benchmark": "arith", "item": f"q{i}", "greedy": i % 2, "sampled": 2, "k": 4}
                    for a in AGENTS
                    for i in range(3)
                ],
            )
        if step == 0:
            continue  # the initial evaluation is step 0, before any update
        metrics = {f"train/acc/{a}": step / 10 for a in AGENTS}
        metrics[f"omega/{AGENTS[0]}/{AGENTS[1]}"] = np.float64(0.5 * step)
        metrics[f"is/{AGENTS[0]}/{AGENTS[1]}/ratio_mean"] = torch.tensor(0.9)
        metrics[f"is/{AGENTS[0]}/{AGENTS[0]}/clip_frac"] = 0.0
        metrics[f"cost/{AGENTS[1]}/generated_tokens"] = 100 * step
        metrics["time/step_s"] = 1.5
        w.log_metrics(step, metrics)
        w.write_samples(step, [{"prompt": "1+1", "text": "2", "author": 0, "ratio": torch.tensor(1.0)}])
    return run_dir


# ---------------------------------------------------------------- run directories


def test_create_run_dir_default_and_explicit(tmp_path):
    run_dir = create_run_dir(tmp_path, "exp")
    assert run_dir.parent == tmp_path / "exp" and run_dir.is_dir()
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{4}", run_dir.name)
    assert create_run_dir(tmp_path, "exp", run_id="seed0") == tmp_path / "exp" / "seed0"
    with pytest.raises(FileExistsError, match=r"seed0.*resume"):
        create_run_dir(tmp_path, "exp", run_id="seed0")
    with pytest.raises(ValueError, match=re.escape("experiment='../x'")):
        create_run_dir(tmp_path, "../x")


def test_create_run_dir_retries_on_identical_name(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "_utc_stamp", lambda: "20260101T000000Z")
    suffixes = iter(["abcd", "abcd", "abcd", "ef01"])
    monkeypatch.setattr(results.secrets, "token_hex", lambda n: next(suffixes))
    first = create_run_dir(tmp_path, "exp")
    second = create_run_dir(tmp_path, "exp")
    assert first.name == "20260101T000000Z-abcd"
    assert second.name == "20260101T000000Z-ef01"


def test_concurrent_create_run_dir_never_shares(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "_utc_stamp", lambda: "20260101T000000Z")
    got: list[Path] = []
    lock = threading.Lock()

    def make() -> None:
        for _ in range(10):
            path = create_run_dir(tmp_path, "exp")
            with lock:
                got.append(path)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 80 and len(set(got)) == 80


def test_config_hash_is_stable_and_survives_yaml(tmp_path):
    cfg = _cfg()
    reordered = dict(reversed(list(cfg.items())))
    assert config_hash(cfg) == config_hash(reordered)
    assert config_hash(cfg) != config_hash(_cfg(seed=1))
    # A run moved to another results folder is the same config; another run id is not.
    placed = {**cfg, "output": {"root": "results", "run_id": None}}
    assert config_hash({**placed, "output": {"root": "elsewhere", "run_id": None}}) == config_hash(placed)
    assert config_hash({**placed, "output": {"root": "results", "run_id": "x"}}) != config_hash(placed)
    run_dir = create_run_dir(tmp_path, "exp")
    RunWriter(run_dir).write_config(cfg)  # tuple -> list on the way through YAML
    assert config_hash(yaml.safe_load((run_dir / "config.yaml").read_text())) == config_hash(cfg)


def test_find_run_returns_newest_matching(tmp_path):
    dirs = []
    for seed in (0, 0, 1):
        run_dir = create_run_dir(tmp_path, "exp")
        RunWriter(run_dir).write_config(_cfg(seed=seed))
        dirs.append(run_dir)
    os.utime(dirs[0] / "config.yaml", (2e9, 2e9))  # the first one is the newest
    assert find_run(tmp_path, "exp", config_hash(_cfg(seed=0))) == dirs[0]
    assert find_run(tmp_path, "exp", config_hash(_cfg(seed=1))) == dirs[2]
    assert find_run(tmp_path, "exp", config_hash(_cfg(seed=2))) is None
    assert find_run(tmp_path, "other", config_hash(_cfg())) is None


# ---------------------------------------------------------------- RunWriter


def test_config_must_come_first_and_cannot_change(tmp_path):
    w = RunWriter(create_run_dir(tmp_path, "exp"))
    with pytest.raises(RuntimeError, match="write_config"):
        w.log_metrics(0, {"a/b": 1.0})
    w.write_config(_cfg())
    w.write_config(_cfg())  # same config again (resume): fine
    with pytest.raises(ValueError, match=r"\['seed'\]"):
        w.write_config(_cfg(seed=3))
    with pytest.raises(FileNotFoundError):
        RunWriter(tmp_path / "nope")


def test_write_environment_records_versions_and_resumes(tmp_path):
    w = RunWriter(create_run_dir(tmp_path, "exp"))
    w.write_config(_cfg())
    w.write_environment({"note": "first"})
    env = json.loads(w.environment_path.read_text())
    assert env["packages"]["torch"] == torch.__version__
    assert env["python"].startswith("3.") and env["device"] == "cpu" and env["note"] == "first"
    assert "git_commit" in env and "start_time" in env
    w.write_environment({"note": "resumed"})
    env = json.loads(w.environment_path.read_text())
    assert env["note"] == "first" and [r["note"] for r in env["resumes"]] == ["resumed"]


def test_environment_records_cpu_threads_and_each_starts_weights(tmp_path, monkeypatch):
    w = RunWriter(create_run_dir(tmp_path, "exp"))
    w.write_config(_cfg())
    with pytest.raises(RuntimeError, match="write_environment"):
        w.record_start({"start_weights": {"a": "1"}})
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    env = w.write_environment()
    assert env["torch_threads"] == torch.get_num_threads()
    assert env["torch_interop_threads"] == torch.get_num_interop_threads()
    assert env["thread_variables"]["OMP_NUM_THREADS"] == "3" and "OMP_WAIT_POLICY" in env["thread_variables"]
    assert {"numpy", "peft", "bitsandbytes", "tokenizers", "transformers"} <= set(env["packages"])
    assert set(env["cpu"]) == {"model", "logical_cores", "simd"}
    w.record_start({"start_weights": {"a": "11", "b": "22"}})
    w.write_environment()
    w.record_start({"start_weights": {"a": "11", "b": "33"}})
    doc = json.loads(w.environment_path.read_text())
    assert doc["start_weights"] == {"a": "11", "b": "22"}
    assert doc["resumes"][0]["start_weights"] == {"a": "11", "b": "33"}


def test_cpu_info_reads_x86_and_arm_cpuinfo():
    from workbench.core.machine import cpu_info

    x86 = "processor\t: 0\nmodel name\t: Xeon X\nflags\t\t: fpu sse4_2 avx2 fma avx512f amx_bf16\n\n"
    x86 += "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n"
    info = cpu_info(x86)
    assert info["model"] == "Xeon X" and info["simd"] == ["sse4_2", "avx2", "fma", "avx512f", "amx_bf16"]
    arm = "processor\t: 0\nFeatures\t: fp asimd asimdhp sve bf16\nCPU implementer\t: 0x41\n"
    assert cpu_info(arm)["simd"] == ["asimd", "asimdhp", "bf16", "sve"] and cpu_info(arm)["model"] is None
    assert cpu_info(None)["simd"] is None  # no /proc/cpuinfo: flags unknown


def test_log_metrics_converts_and_validates(tmp_path):
    w = RunWriter(create_run_dir(tmp_path, "exp"))
    w.write_config(_cfg())
    w.log_metrics(1, {"a/x": np.float32(0.5), "a/y": torch.tensor(2), "a/z": True, "a/n": math.nan})
    line = w.metrics_path.read_text().strip()
    row = json.loads(line)
    assert row["step"] == 1 and row["a/x"] == 0.5 and row["a/y"] == 2.0 and row["a/z"] == 1.0
    assert math.isnan(row["a/n"])
    with pytest.raises(TypeError, match="metric keys must be str"):
        w.log_metrics(2, {3: 1.0})
    with pytest.raises(TypeError, match="a/v"):
        w.log_metrics(2, {"a/v": [1.0, 2.0]})
    with pytest.raises(ValueError, match="reserved"):
        w.log_metrics(2, {"step": 2})
    with pytest.raises(ValueError, match="rollback_to"):
        RunWriter(w.run_dir).log_metrics(0, {"a/x": 1.0})  # a fresh writer reads the last step back
    assert len(w.metrics_path.read_text().splitlines()) == 1


def test_append_evals_validates_rows(tmp_path):
    w = RunWriter(create_run_dir(tmp_path, "exp"))
    w.write_config(_cfg())
    with pytest.raises(ValueError, match=r"row 0 lacks \['value'\]"):
        w.append_evals(0, [{"agent": "a", "benchmark": "b", "metric": "greedy_acc"}])
    with pytest.raises(ValueError, match="metric='avg@0'"):
        w.append_evals(0, [{"agent": "a", "benchmark": "b", "metric": "avg@0", "value": 1}])
    with pytest.raises(ValueError, match="step=3"):
        w.append_evals(2, [{"step": 3, "agent": "a", "benchmark": "b", "metric": "pass@8", "value": 1}])
    assert not w.evals_path.exists()


def test_append_eval_items_writes_plain_rows_and_validates(tmp_path):
    w = RunWriter(create_run_dir(tmp_path, "exp"))
    w.write_config(_cfg())
    row = {"agent": "a", "benchmark": "b", "item": "q,1", "greedy": 1, "sampled": 3, "k": 4}
    w.append_eval_items(0, [row, {**row, "item": "q2", "greedy": None, "sampled": None, "k": 0}])
    w.append_eval_items(5, [{**row, "greedy": 0, "sampled": 0}])
    assert w.items_path.read_text().splitlines() == [
        "step,agent,benchmark,item,greedy,sampled,k",
        '0,a,b,"q,1",1,3,4',
        "0,a,b,q2,,,0",
        '5,a,b,"q,1",0,0,4',
    ]
    for bad, match in (
        ({"greedy": 2}, "greedy=2"),
        ({"sampled": 5}, r"sampled=5; allowed: an int in \[0, 4\]"),
        ({"sampled": None}, "None exactly when k=0"),
        ({"k": -1}, "k=-1"),
        ({"greedy": True}, "greedy=True"),
    ):
        with pytest.raises(ValueError, match=match):
            w.append_eval_items(6, [row, {**row, **bad}])
    missing = {k: v for k, v in row.items() if k != "item"}
    with pytest.raises(ValueError, match=r"row 0 lacks \['item'\]"):
        w.append_eval_items(6, [missing])
    assert set(pd.read_csv(w.items_path)["step"]) == {0, 5}  # refused rows wrote nothing


def test_mark_done_and_rollback(tmp_path):
    run_dir = _write_run(tmp_path, "hacpo", 0, steps=6)
    w = RunWriter(run_dir)
    w.mark_done({"steps": 6})
    assert w.is_done() and json.loads(w.done_path.read_text())["steps"] == 6
    dropped = w.rollback_to(2)
    # metrics: lines 3, 4 (x2), 5; evals and items (3 per agent) of step 4
    assert dropped == {"metrics": 4, "evals": 2, "eval_items": 6, "samples": 3}
    assert not w.is_done()
    df = frames.load_runs([run_dir])
    assert df["step"].tolist() == [0, 1, 2]
    assert sorted(p.name for p in w.samples_dir.iterdir()) == ["step_000001.jsonl", "step_000002.jsonl"]
    assert set(frames.load_evals([run_dir])["step"]) == {0, 2}
    other = RunWriter(run_dir)  # a second writer object of the same run sees the rollback too
    with pytest.raises(ValueError, match="last logged step 2"):
        other.log_metrics(1, {"train/acc/char-gpt2": 0.9})
    w.log_metrics(3, {"train/acc/char-gpt2": 0.9})  # logging resumes after the rollback
    assert frames.load_runs([run_dir])["step"].tolist() == [0, 1, 2, 3]
    assert set(pd.read_csv(w.items_path)["step"]) == {0, 2}
    # killed before any checkpoint
    assert w.rollback_to(-1) == {"metrics": 5, "evals": 4, "eval_items": 12, "samples": 2}
    assert w.items_path.read_text() == "step,agent,benchmark,item,greedy,sampled,k\n"
    assert len(frames.load_runs([run_dir])) == 0 and len(frames.load_evals([run_dir])) == 0
    w.log_metrics(0, {"eval/acc/char-gpt2": 0.1})
    with pytest.raises(ValueError, match=">= -1"):
        w.rollback_to(-2)


def test_samples_file(tmp_path):
    run_dir = _write_run(tmp_path, "hacpo", 0, steps=2)
    rows = [json.loads(x) for x in (run_dir / "samples" / "step_000001.jsonl").read_text().splitlines()]
    assert rows == [{"prompt": "1+1", "text": "2", "author": 0, "ratio": 1.0}]


# ---------------------------------------------------------------- loaders


@pytest.fixture
def two_runs(tmp_path) -> tuple[Path, Path, Path]:
    return tmp_path, _write_run(tmp_path, "hacpo", 0), _write_run(tmp_path, "gspo", 1)


def test_load_runs_wide(two_runs):
    root, hacpo_dir, gspo_dir = two_runs
    df = frames.load_runs([hacpo_dir, gspo_dir])
    assert list(df.columns[:6]) == ["run", "experiment", "algorithm", "seed", "run_dir", "step"]
    assert len(df) == 8 and df["step"].dtype == "int64"
    assert df.groupby("run")["step"].apply(list).tolist() == [[0, 1, 2, 3]] * 2
    assert set(df["algorithm"]) == {"hacpo", "gspo"} and set(df["experiment"]) == {"exp"}
    hacpo = df[df["algorithm"] == "hacpo"].set_index("step")
    # step 2 was logged in two calls (eval, then train): both merged into one row
    assert hacpo.loc[2, "eval/acc/bpe-llama"] == pytest.approx(1.2)
    assert hacpo.loc[2, "train/acc/bpe-llama"] == pytest.approx(0.2)
    assert math.isnan(hacpo.loc[1, "eval/acc/bpe-llama"]) and math.isnan(hacpo.loc[0, "time/step_s"])
    assert hacpo.loc[3, "cost/bpe-llama/generated_tokens"] == 300.0
    assert df.equals(frames.load_runs(root))  # a directory of runs is searched recursively


def test_load_runs_edge_cases(tmp_path):
    run_dir = create_run_dir(tmp_path, "exp")
    RunWriter(run_dir).write_config(_cfg())
    empty = frames.load_runs([run_dir])
    assert len(empty) == 0 and {"run", "step"} <= set(empty.columns)
    with pytest.raises(FileNotFoundError, match="missing-dir"):
        frames.load_runs([tmp_path / "missing-dir"])
    assert len(frames.load_evals(run_dir)) == 0


def test_load_evals(two_runs):
    root, *_ = two_runs
    ev = frames.load_evals(root)
    assert list(ev.columns) == [*frames.ID_COLUMNS, *evalcsv.EVAL_COLUMNS, "items"]
    assert len(ev) == 8 and set(ev["metric"]) == {"avg@4"} and (ev["value"] == 0.5).all()
    assert ev["items"].isna().all()  # the configs name no task.eval_size: standard errors unknown


def test_load_eval_items_final_step_and_scores(two_runs):
    from workbench.lab.items import final_items, item_scores, load_eval_items

    root, hacpo_dir, _ = two_runs
    RunWriter(hacpo_dir).append_eval_items(
        4, [{"agent": "x", "benchmark": "arith", "item": "NA", "greedy": None, "sampled": None, "k": 0}]
    )
    items = load_eval_items(root)
    assert list(items.columns) == [*frames.ID_COLUMNS, *evalcsv.ITEM_COLUMNS]
    assert len(items) == 2 * 2 * 2 * 3 + 1 and items["seed"].dtype == "Int64"
    final = final_items(items)
    assert sorted(set(zip(final["algorithm"], final["step"]))) == [("gspo", 2), ("hacpo", 4)]
    assert final.loc[final["algorithm"] == "hacpo", "item"].tolist() == ["NA"]  # an id, not a missing value
    assert item_scores(final, "greedy_acc")["algorithm"].tolist() == ["gspo"] * 6
    scores = item_scores(items[items["step"] == 2], "avg@4")
    assert scores["value"].tolist() == [0.5] * 12  # 2 of 4 samples right on every item
    assert item_scores(items[items["step"] == 2], "greedy_acc")["value"].tolist() == [0.0, 1.0, 0.0] * 4
    with pytest.raises(ValueError, match="pass@2"):
        item_scores(items, "pass@2")


@pytest.mark.parametrize(
    ("prefix", "named", "n_rows"),
    [
        ("eval/acc", ["agent"], 2 * 2 * 2),
        ("omega", ["learner", "source"], 2 * 3),
        ("is", ["learner", "source", "stat"], 2 * 3 * 2),
        ("is/char-gpt2", ["source", "stat"], 2 * 3 * 2),
        ("cost", ["agent", "stat"], 2 * 3),
        ("time", ["key"], 2 * 3),
        ("train/acc/", ["agent"], 2 * 3 * 2),
    ],
)
def test_melt_metric(two_runs, prefix, named, n_rows):
    _, hacpo_dir, gspo_dir = two_runs
    long = frames.melt_metric(frames.load_runs([hacpo_dir, gspo_dir]), prefix)
    assert list(long.columns) == [*frames.ID_COLUMNS, "step", *named, "value"]
    assert len(long) == n_rows and long["value"].notna().all()


def test_melt_metric_values_and_errors(two_runs):
    _, hacpo_dir, _ = two_runs
    df = frames.load_runs([hacpo_dir])
    ratio = frames.melt_metric(df, "is")
    row = ratio[(ratio["step"] == 3) & (ratio["stat"] == "ratio_mean")].iloc[0]
    assert (row["learner"], row["source"], row["value"]) == ("char-gpt2", "bpe-llama", pytest.approx(0.9))
    acc = frames.melt_metric(df, "eval/acc")
    assert acc.set_index(["step", "agent"]).loc[(2, "char-gpt2"), "value"] == pytest.approx(0.2)
    with pytest.raises(
        ValueError,
        match=r"under 'nope'; families present: \['cost', 'eval', 'is', 'omega', 'time', 'train'\]",
    ):
        frames.melt_metric(df, "nope")
    mixed = pd.DataFrame({"step": [0], "is/a/b/c": [1.0], "is/a/b": [2.0]})
    assert list(frames.melt_metric(mixed, "is").columns) == ["step", "key", "value"]
