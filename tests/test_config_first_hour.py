"""A TRL user's first config: every mistake in one pass, "did you mean" for near names and TRL's names, the
new keys (schedules, rewards, generation options, peft fields) checked at load, hashed as before."""

import math
from pathlib import Path

import pytest
import yaml

from workbench.config.checks import TRL_NAMES
from workbench.config.experiment import ConfigError, from_dict
from workbench.config.loading import config_hash, load_experiment
from workbench.core.env import PROJECT_ROOT

BASE = {"experiment": "x", "agents": ["tiny:gpt2-char", "tiny:llama-bpe"]}


def _error(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        from_dict(data)
    return str(info.value)


def test_several_mistakes_are_reported_in_one_pass():
    message = _error(
        {
            **BASE,
            "num_generations": 8,
            "train": {
                "learning_rate": 1e-5,
                "steps": 0,
                "group_size": 1,
                "lr_schedule": "cosine_with_restarts",
            },
            "task": {"reward_funcs": ["x"], "rewards": [{"fn": "format_boxd"}]},
            "agents": [
                {"model": "tiny:gpt2-char", "temperature": -1, "lora": {"lora_alpha": 8, "use_rsloar": 1}}
            ],
            "seed": -1,
        }
    )
    assert message.startswith("11 mistakes, all of them:")
    for expected in (
        "unknown key 'num_generations'",
        "did you mean train.group_size (TRL's num_generations",
        "unknown key train.learning_rate",
        "did you mean train.lr (TRL's learning_rate",
        "train.steps = 0 is not allowed",
        "train.group_size = 1 is not allowed",
        "train.lr_schedule = 'cosine_with_restarts' is not allowed: one of ('constant', 'linear', 'cosine')",
        "did you mean task.rewards (TRL's reward_funcs",
        "task.rewards[i].fn = 'format_boxd' is not allowed",
        "did you mean format_boxed?",
        "agents[0] (tiny:gpt2-char): lora.lora_alpha is not allowed: it is lora.alpha here",
        "did you mean lora.use_rslora?",
        "agents[0] (tiny:gpt2-char): temperature = -1 is not allowed",
        "seed = -1 is not allowed",
    ):
        assert expected in message, expected


def test_one_mistake_keeps_its_own_message():
    message = _error({**BASE, "train": {"stepz": 1}})
    assert message.startswith("unknown key train.stepz; valid keys of 'train'")
    assert message.endswith("did you mean train.steps?")


@pytest.mark.parametrize("trl_name", sorted(TRL_NAMES))
def test_every_trl_name_points_at_a_key_that_exists_or_says_why_not(trl_name):
    target, note = TRL_NAMES[trl_name]
    if not target:
        assert note, trl_name
        return
    section, _, key = target.replace("agents[i].", "agent.").partition(".")
    if section == "algorithm":
        return
    reference = (PROJECT_ROOT / "docs" / "config.md").read_text()
    assert f"`{(key or section).split('.')[-1]}`" in reference, target
    message = _error(
        {**BASE, "train": {trl_name: 1}}
        if trl_name not in ("warmup_steps", "warmup_ratio")
        else {**BASE, trl_name: 1}
    )
    assert f"did you mean {target}" in message or "no counterpart" in message


def test_the_new_keys_are_checked_when_the_config_loads():
    assert "warmup_ratio = 0.1 is not allowed: 0 when train.warmup_steps is set" in _error(
        {**BASE, "train": {"warmup_steps": 2, "warmup_ratio": 0.1}}
    )
    assert "train.warmup_steps = 99 is not allowed: in [0, steps]" in _error(
        {**BASE, "train": {"warmup_steps": 99}}
    )
    bad_agent = {
        "model": "tiny:gpt2-char",
        "top_k": -1,
        "min_p": 1.5,
        "repetition_penalty": 0,
        "stop_strings": [""],
    }
    message = _error({**BASE, "agents": [bad_agent, "tiny:llama-bpe"]})
    for field in ("top_k = -1", "min_p = 1.5", "repetition_penalty = 0", "stop_strings = ('',)"):
        assert field in message, field
    assert "lr_schedule = 'step' is not allowed" in _error(
        {**BASE, "agents": [{"model": "tiny:gpt2-char", "lr_schedule": "step"}, "tiny:llama-bpe"]}
    )
    assert "task.rewards[i].weight = nan" in _error(
        {**BASE, "task": {"rewards": [{"fn": "numeric", "weight": math.nan}]}}
    )
    assert "one name per function" in _error({**BASE, "task": {"rewards": ["numeric", "numeric"]}})
    assert "not 'total'" in _error({**BASE, "task": {"rewards": [{"fn": "numeric", "name": "total"}]}})


def test_warmup_ratio_counts_steps_as_transformers_does():
    cfg = from_dict({**BASE, "train": {"steps": 10, "warmup_ratio": 0.25}})
    assert cfg.train.warmup == 3  # ceil(2.5)


def test_the_new_keys_round_trip_and_leave_old_configs_hashing_as_before(tmp_path):
    data = {
        **BASE,
        "agents": [
            {"model": "tiny:gpt2-char", "lora": {"r": 4, "use_rslora": True, "layers_to_transform": [0]}},
            {
                "model": "tiny:llama-bpe",
                "top_k": 5,
                "stop_strings": ["\n\n"],
                "lr": 2e-4,
                "lr_schedule": "linear",
            },
        ],
        "task": {"rewards": [{"fn": "math_verify"}, {"fn": "format_boxed", "weight": 0.2}]},
        "train": {"lr_schedule": "cosine", "warmup_steps": 2, "mask_truncated": True},
    }
    cfg = from_dict(data)
    plain = cfg.to_dict()
    assert plain["agents"][0]["lora"]["use_rslora"] is True and plain["agents"][0]["lora"][
        "layers_to_transform"
    ] == [0]
    assert from_dict(yaml.safe_load(yaml.safe_dump(plain))) == cfg
    assert config_hash(plain) != config_hash(from_dict(BASE).to_dict())
    # A config written before these keys existed hashes as it did: the committed runs are still found.
    committed = sorted((PROJECT_ROOT / "results").rglob("config.yaml"))
    for path in committed:
        raw = yaml.safe_load(path.read_text())
        assert config_hash(from_dict(raw).to_dict()) == config_hash(raw), path
    old = from_dict(BASE).to_dict()
    for key in ("lr_schedule", "warmup_steps", "warmup_ratio", "mask_truncated"):
        del old["train"][key]
    del old["task"]["rewards"]
    for agent in old["agents"]:
        for key in ("top_k", "min_p", "repetition_penalty", "stop_strings", "lr", "lr_schedule"):
            del agent[key]
    assert config_hash(old) == config_hash(from_dict(BASE).to_dict())


def test_set_overrides_report_every_mistake_with_the_file(tmp_path: Path):
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(BASE))
    with pytest.raises(ConfigError) as info:
        load_experiment(path, ["train.learning_rate=1e-5", "train.num_generations=4"])
    message = str(info.value)
    assert (
        message.startswith(f"{path}: 2 mistakes") and "train.lr" in message and "train.group_size" in message
    )
