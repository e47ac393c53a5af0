"""Experiment configs: defaults, overrides, base chains, and bad input named before any model loads."""

from pathlib import Path

import pytest
import yaml

from workbench.config.experiment import ALGORITHMS, ConfigError, from_dict
from workbench.config.loading import load_experiment, parse_overrides

ROOT = Path(__file__).resolve().parents[1]
AGENTS = [{"name": "a", "model": "tiny:x"}, {"name": "b", "model": "tiny:y"}]


def _cfg(**top):
    data = {"experiment": "t", "agents": AGENTS} | top
    return from_dict(data)


def test_defaults_follow_the_paper():
    cfg = _cfg()
    h = cfg.hacpo
    assert (h.alpha, h.delta, h.delta_step, h.window) == (1.0, 0.2, 0.025, 5)
    assert (h.eps_low, h.eps_high, h.min_ratio, h.max_ratio) == (3e-4, 4e-4, 0.1, 10.0)
    assert cfg.train.kl_coef == 0.001 and cfg.train.grad_clip == 1.0
    assert cfg.algo is ALGORITHMS["hacpo"]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"trian": {}}, r"unknown key 'trian'; valid top-level keys"),
        ({"train": {"lr_rate": 1}}, r"unknown key train.lr_rate; valid keys of 'train'"),
        ({"hacpo": {"delta": 1.0}}, r"hacpo.delta = 1.0 is not allowed: in \[0, 1\)"),
        ({"hacpo": {"window": 0}}, r"hacpo.window = 0 is not allowed: >= 1"),
        ({"train": {"group_size": 1}}, r"train.group_size = 1 is not allowed: >= 2"),
        (
            {"train": {"prompts_per_step": 16, "minibatch_prompts": 5}},
            r"must divide train.prompts_per_step = 16",
        ),
        ({"algorithm": "ppo"}, r"algorithm = 'ppo' is not allowed: one of \['grpo', 'gspo', 'gspo_x2'"),
        ({"agents": [{"model": "tiny:x"}]}, r"hacpo shares rollouts: >= 2 agents"),
        ({"train": {"lr": "fast"}}, r"train.lr: expected float, got str 'fast'"),
        ({"hacpo": {"alpha": -1}}, r"hacpo.alpha = -1.0 is not allowed: >= 0"),
        ({"agents": [{"name": "a", "model": "x"}, {"name": "a", "model": "y"}]}, r"names must be unique"),
        ({"agents": [{"lora": None}]}, r"agents\[0\]: expected a model name or a mapping with a 'model' key"),
    ],
)
def test_bad_values_name_key_value_and_allowed(data, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(**data)


def test_single_agent_allowed_for_non_sharing_algorithms():
    cfg = _cfg(agents=["tiny:x"], algorithm="gspo")
    assert cfg.agent_names == ["x"]


def test_overrides_and_base_chain(tmp_path):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({"experiment": "base", "agents": AGENTS, "seed": 3}))
    (tmp_path / "child.yaml").write_text(yaml.safe_dump({"base": "base.yaml", "hacpo": {"alpha": 2.0}}))
    cfg = load_experiment(tmp_path / "child.yaml", ["train.steps=7", "agents.1.name=c"])
    assert cfg.experiment == "child" and cfg.seed == 3 and cfg.hacpo.alpha == 2.0
    assert cfg.train.steps == 7 and cfg.agent_names == ["a", "c"]
    assert parse_overrides(["hacpo.delta_step=0", "output.run_id=r1"]) == {
        "hacpo.delta_step": 0,
        "output.run_id": "r1",
    }
    # PyYAML reads 1e-3 (no dot) as a string; float fields accept it.
    assert load_experiment(tmp_path / "child.yaml", ["train.lr=1e-3"]).train.lr == 1e-3
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_overrides(["train.steps"])


def test_missing_file_lists_available(tmp_path):
    (tmp_path / "one.yaml").write_text("experiment: one\n")
    with pytest.raises(ConfigError, match=r"not found; available in .*\['one.yaml'\]"):
        load_experiment(tmp_path / "two.yaml")


def test_resolved_config_round_trips():
    cfg = _cfg(train={"steps": 3})
    again = from_dict(cfg.to_dict())
    assert again == cfg


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").rglob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_experiment_validates(path):
    cfg = load_experiment(path)
    assert cfg.agents and cfg.experiment == path.stem
