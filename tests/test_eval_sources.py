"""Further held-out sources (issue 13): ``task.eval_sources`` are loaded once and evaluated at every
evaluation, each under its own metric prefix, next to the unchanged main held-out keys."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from workbench.config.experiment import ConfigError, from_dict
from workbench.train.data import held_out_sets, source_key
from workbench.train.run import train

DATA = Path(__file__).resolve().parent / "data"
GSM8K = f"file:{DATA / 'gsm8k.jsonl'}"  # its hash split holds out 2 of 4 questions
AGENTS = ["tiny:gpt2-char", "tiny:llama-bpe"]
NAMES = ("gpt2-char", "llama-bpe")


def _config(root: Path, eval_sources: list[str], **train):
    return from_dict(
        {
            "experiment": "t",
            "agents": AGENTS,
            "output": {"root": str(root)},
            "task": {"train_size": 20, "eval_size": 2, "eval_sources": eval_sources},
            "train": {
                "steps": 1,
                "prompts_per_step": 2,
                "group_size": 2,
                "minibatch_prompts": 2,
                "max_new_tokens": 6,
                "eval_samples": 2,
                **train,
            },
        }
    )


@pytest.mark.parametrize(
    ("source", "key"),
    [
        ("math500", "math500"),
        ("gym:basic_arithmetic", "gym_basic_arithmetic"),
        ("file:data/my set.jsonl", "my_set"),
        ("file:/abs/gsm8k.jsonl", "gsm8k"),
    ],
)
def test_source_key_is_one_metric_key_segment(source, key):
    assert source_key(source) == key


def test_held_out_sets_keep_the_main_set_first_and_give_every_source_its_own_prefix(tmp_path):
    for folder in ("a", "b"):  # two files with one stem
        (tmp_path / folder).mkdir()
        shutil.copy(DATA / "gsm8k.jsonl", tmp_path / folder / "acc.jsonl")
    sources = [f"file:{tmp_path / 'a' / 'acc.jsonl'}", f"file:{tmp_path / 'b' / 'acc.jsonl'}", "embedded"]
    cfg = _config(tmp_path, sources)
    sets = held_out_sets(cfg)
    assert [s.prefix for s in sets] == ["eval", "eval/acc_2", "eval/acc_3", "eval/embedded"]
    assert [s.benchmark for s in sets] == ["embedded", *sources]
    assert [len(s.items) for s in sets] == [2, 2, 2, 2]
    assert held_out_sets(dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, eval_size=0))) == []
    with pytest.raises(
        ConfigError, match=r"task.eval_sources = \['embedded', 'embedded'\] .* each source once"
    ):
        _config(tmp_path, ["embedded", "embedded"])


def test_a_run_logs_every_agent_on_each_further_held_out_source(tmp_path):
    run_dir = train(_config(tmp_path, [GSM8K]))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1]
    for row in rows:  # step 0 and the last step both evaluate
        for name in NAMES:
            for key in (f"eval/acc/{name}", f"eval/avg@2/{name}"):  # the main keys, unchanged
                assert 0.0 <= row[key] <= 1.0
            for key in (f"eval/gsm8k/acc/{name}", f"eval/gsm8k/avg@2/{name}"):
                assert 0.0 <= row[key] <= 1.0
    evals = pd.read_csv(run_dir / "evals.csv")
    extra = evals[evals["benchmark"] == GSM8K]
    assert set(extra["agent"]) == set(NAMES) and set(extra["step"]) == {0, 1}
    assert {"greedy_acc", "avg@2"} <= set(extra["metric"])
    assert set(evals["benchmark"]) == {"embedded", GSM8K}
