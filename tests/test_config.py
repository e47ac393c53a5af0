"""Experiment configs: defaults, overrides, base chains, and bad input named before any model loads."""

import dataclasses
import pickle
import re
from pathlib import Path

import pytest
import yaml

from workbench.config import AgentSpec, FrozenMap, LoraSpec
from workbench.config.experiment import ConfigError, expand_seeds, from_dict
from workbench.config.loading import load_experiment, parse_overrides
from workbench.config.methods import ALGORITHMS, METHODS

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
        ({"hacpo": {"window": 0}}, r"hacpo.window = 0 is not allowed: an integer >= 1"),
        (
            {"hacpo": {"uniform_group_guard": False}},
            r"hacpo.uniform_group_guard = False is not allowed: false only with hacpo.normalize_by_std: f",
        ),
        ({"hacpo": {"naive_symmetric": True}}, r"hacpo.naive_symmetric = True is not allowed: only with"),
        ({"train": {"group_size": 1}}, r"train.group_size = 1 is not allowed: >= 2"),
        (
            {"train": {"prompts_per_step": 16, "minibatch_prompts": 5}},
            r"must divide train.prompts_per_step = 16",
        ),
        ({"algorithm": "ppo"}, r"algorithm = 'ppo' is not allowed: one of \['grpo', 'gspo', 'gspo_x2'"),
        ({"agents": [{"model": "tiny:x"}]}, r"hacpo shares rollouts: >= 2 agents"),
        ({"train": {"lr": "fast"}}, r"train.lr: expected float, got str 'fast'"),
        (
            {"train": {"eval_max_new_tokens": 0}},
            r"train.eval_max_new_tokens = 0 is not allowed: >= 1 or null",
        ),
        ({"task": {"reward": "exact"}}, r"task.reward = 'exact' is not allowed: one of \['math_verify'"),
        ({"task": {"knobs": [1, 2]}}, r"task.knobs: expected a mapping, got list \[1, 2\]"),
        ({"task": {"eval_knobs": "x"}}, r"task.eval_knobs: expected a mapping or null, got str 'x'"),
        ({"output": {"run_id": "a/b"}}, r"output.run_id = 'a/b' is not allowed: letters, digits"),
        ({"experiment": "my run"}, r"experiment = 'my run' is not allowed: letters, digits"),
        (
            {"agents": [{"name": "a b", "model": "x"}]},
            r"agents\[0\].name = 'a b' is not allowed: .*metric keys",
        ),
        ({"agents": [{"model": "x", "quantization": "2bit"}]}, r"agents\[0\] \(x\): quantization = '2bit'"),
        ({"agents": "tiny:x"}, r"agents: expected a non-empty list of agent specs"),
        ({"hacpo": {"alpha": -1}}, r"hacpo.alpha = -1.0 is not allowed: >= 0"),
        ({"agents": [{"name": "a", "model": "x"}, {"name": "a", "model": "y"}]}, r"names must be unique"),
        ({"agents": [{"lora": None}]}, r"agents\[0\]: expected a model name or a mapping with a 'model' key"),
        ({"seeds": []}, r"seeds = \[\] is not allowed: a non-empty list of unique ints >= 0, or null"),
        ({"seeds": [0, 1, 1]}, r"seeds = \[0, 1, 1\] is not allowed: a non-empty list of unique ints"),
        ({"seeds": [0, -1]}, r"seeds = \[0, -1\] is not allowed"),
        ({"seeds": [0, "1"]}, r"seeds\[1\]: expected int, got str '1'"),
        ({"seeds": [True]}, r"seeds\[0\]: expected int, got bool True"),
        ({"seeds": 3}, r"seeds: expected a list or null, got int 3"),
        ({"seed": -2}, r"seed = -2 is not allowed: >= 0"),
        ({"task": {"eval_seed": -1}}, r"task.eval_seed = -1 is not allowed: >= 0 or null"),
        (
            {"train": {"eval_samples": -1}},
            r"train.eval_samples = -1 is not allowed: >= 0 \(0 = greedy only\)",
        ),
        ({"train": {"eval_temperature": 0}}, r"train.eval_temperature = 0.0 is not allowed: > 0"),
        ({"train": {"adam_beta1": 1}}, r"train.adam_beta1 = 1.0 is not allowed: in \[0, 1\)"),
        ({"train": {"adam_beta2": -0.1}}, r"train.adam_beta2 = -0.1 is not allowed: in \[0, 1\)"),
        ({"train": {"skip_uniform_groups": 1}}, r"train.skip_uniform_groups: expected bool, got int 1"),
        ({"train": {"micro_batch_tokens": 0}}, r"train.micro_batch_tokens = 0 is not allowed: >= 1 or null"),
        (
            {"hacpo": {"ratio_normalization": "chars"}},
            r"hacpo.ratio_normalization = 'chars' is not allowed: one of \('tokens', 'bytes'\)",
        ),
    ],
)
def test_bad_values_name_key_value_and_allowed(data, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(**data)


def test_single_agent_allowed_for_non_sharing_algorithms():
    cfg = _cfg(agents=["tiny:x"], algorithm="gspo")
    assert cfg.agent_names == ["x"]
    with pytest.raises(ConfigError, match=r"agents = \['x'\] is not allowed: naive shares rollouts: >= 2"):
        dataclasses.replace(cfg, algorithm="naive")


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


@pytest.mark.parametrize(
    ("section", "changes", "match"),
    [
        ("train", {"lr": -1}, r"train.lr = -1.0 is not allowed: > 0"),
        ("train", {"steps": 2.5}, r"train.steps: expected int, got float 2.5"),
        ("train", {"minibatch_prompts": 5}, r"train.minibatch_prompts = 5 is not allowed: must divide"),
        ("hacpo", {"delta": 1.0}, r"hacpo.delta = 1.0 is not allowed: in \[0, 1\)"),
        ("hacpo", {"clip_cross": "no"}, r"hacpo.clip_cross: expected bool, got str 'no'"),
        ("task", {"train_size": 0}, r"task.train_size = 0 is not allowed: >= 1"),
        ("task", {"knobs": {"n_ops": {1, 2}}}, r"task.knobs: n_ops = \{1, 2\} is not allowed: a str, number"),
        ("output", {"root": ""}, r"output.root = '' is not allowed: a non-empty directory"),
    ],
)
def test_replace_validates_every_section(section, changes, match):
    cfg = _cfg()
    with pytest.raises(ConfigError, match=match):
        dataclasses.replace(getattr(cfg, section), **changes)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"algorithm": "ppo"}, r"algorithm = 'ppo' is not allowed: one of \['grpo'"),
        ({"seed": "0"}, r"seed: expected int, got str '0'"),
        (
            {"train": {"prompts_per_step": 6, "minibatch_prompts": 3}, "algorithm": "gspo_x2"},
            r"divisible by 2",
        ),
        ({"task": {"sorce": "x"}}, r"unknown key task.sorce; valid keys of 'task'"),
    ],
)
def test_replace_validates_across_fields(changes, match):
    with pytest.raises(ConfigError, match=match):
        dataclasses.replace(_cfg(), **changes)


def test_post_init_coerces_losslessly():
    cfg = _cfg()
    assert dataclasses.replace(cfg.train, lr="1e-4").lr == 1e-4
    alpha = dataclasses.replace(cfg.hacpo, alpha=2).alpha
    assert alpha == 2.0 and type(alpha) is float
    assert dataclasses.replace(cfg, train={"steps": 3}).train.steps == 3


@pytest.mark.parametrize("name", [n for n, m in METHODS.items() if not m.is_algorithm])
def test_a_known_label_must_match_its_switches(name):
    method = METHODS[name]
    with pytest.raises(
        ConfigError, match=rf"label = '{name}' is not allowed with hacpo\.\w+ = .*{re.escape(method.label)}"
    ):
        _cfg(label=name, algorithm=method.algorithm)
    cfg = _cfg(label=name, algorithm=method.algorithm, hacpo=dict(method.switches))
    assert cfg.method == name
    other = "hacpo" if method.algorithm == "naive" else "naive"
    with pytest.raises(ConfigError, match=rf"label = '{name}' is not allowed with algorithm = '{other}'"):
        dataclasses.replace(cfg, algorithm=other)


def test_algorithm_labels_and_unknown_labels():
    with pytest.raises(ConfigError, match=r"label = 'gspo' is not allowed with algorithm = 'hacpo'"):
        _cfg(label="gspo")
    assert _cfg(label="gspo", algorithm="gspo").method == "gspo"
    assert _cfg(label="my-variant", hacpo={"alpha": 0.5}).method == "my-variant"


def test_agents_are_specs_built_once():
    cfg = _cfg(agents=["tiny:x", {"model": "org/model-7b", "lora": {"r": 4, "target_modules": ["q", "v"]}}])
    assert all(isinstance(a, AgentSpec) for a in cfg.agents)
    assert cfg.agent_names == ["x", "model-7b"]
    assert cfg.agents[1].lora == LoraSpec(r=4, target_modules=("q", "v"))
    assert dataclasses.replace(cfg, seed=1).agents == cfg.agents
    again = _cfg(agents=list(cfg.agents))
    assert again.agents == cfg.agents


def test_to_dict_is_plain_yaml_that_reads_back_equal():
    cfg = _cfg(
        agents=[
            "tiny:x",
            {"name": "q", "model": "org/m", "lora": {"target_modules": ["q"]}, "quantization": "4bit"},
        ],
        task={"knobs": {"n_ops": [1, 3], "nested": {"k": [True, None]}}, "eval_knobs": {}},
        label="hacpo-adv",
        hacpo={"capability_baseline": False},
    )
    text = yaml.safe_dump(cfg.to_dict())  # safe_dump refuses tuples and custom classes
    assert from_dict(yaml.safe_load(text)) == cfg
    assert cfg.to_dict()["task"]["knobs"] == {"n_ops": [1, 3], "nested": {"k": [True, None]}}


def test_knobs_are_immutable_hashable_and_picklable():
    cfg = _cfg(task={"knobs": {"n_ops": [1, 3], "max_operand": 9}})
    knobs = cfg.task.knobs
    assert isinstance(knobs, FrozenMap) and knobs == {"n_ops": (1, 3), "max_operand": 9}
    assert dict(**knobs) == {"n_ops": (1, 3), "max_operand": 9}
    with pytest.raises(TypeError):
        knobs["n_ops"] = (2, 2)
    with pytest.raises(AttributeError):
        knobs._items = {}
    assert hash(cfg) == hash(pickle.loads(pickle.dumps(cfg)))
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert cfg.task.eval_knobs is None and _cfg().task.knobs == {}


def test_issue9_fields_defaults():
    cfg = _cfg()
    assert (cfg.task.eval_size, cfg.task.eval_seed) == (1000, 0)
    t = cfg.train
    assert (t.eval_samples, t.eval_temperature, t.adam_beta1, t.adam_beta2) == (4, 1.0, 0.9, 0.999)
    assert t.skip_uniform_groups is False and cfg.hacpo.ratio_normalization == "tokens"
    assert cfg.seeds is None and _cfg(task={"eval_seed": None}).task.eval_seed is None


def test_seeds_expand_to_one_config_each():
    cfg = _cfg(seeds=[2, 0, 5], seed=7)
    assert cfg.seeds == (2, 0, 5) and hash(cfg) == hash(from_dict(cfg.to_dict()))
    assert (
        cfg.to_dict()["seeds"] == [2, 0, 5]
        and from_dict(yaml.safe_load(yaml.safe_dump(cfg.to_dict()))) == cfg
    )
    each = expand_seeds(cfg)
    assert [c.seed for c in each] == [2, 0, 5] and all(c.seeds is None for c in each)
    assert len({yaml.safe_dump(c.to_dict()) for c in each}) == 3  # each seed its own config (hash, run dir)
    assert dataclasses.replace(each[0], seeds=None) == each[0]
    plain = _cfg(seed=3)
    assert expand_seeds(plain) == [plain]


def test_seeds_from_yaml_and_override(tmp_path):
    (tmp_path / "e.yaml").write_text(yaml.safe_dump({"experiment": "e", "agents": AGENTS, "seeds": [0, 1]}))
    assert load_experiment(tmp_path / "e.yaml").seeds == (0, 1)
    assert load_experiment(tmp_path / "e.yaml", ["seeds=[3, 4, 5]"]).seeds == (3, 4, 5)
    assert load_experiment(tmp_path / "e.yaml", ["seeds=null"]).seeds is None


def test_agent_spec_system_turn_and_chat_template_kwargs(smollm2_dir):
    """A system turn replaces the template's default one; chat_template_kwargs reach apply_chat_template."""
    from workbench.agents.models.loading import load_agent
    from workbench.config.agent_spec import AgentSpec, AgentSpecError

    spec = AgentSpec.from_dict(
        {"model": str(smollm2_dir), "system": "Be brief.", "chat_template_kwargs": {"unused_flag": True}}
    )
    assert spec.to_dict()["chat_template_kwargs"] == {"unused_flag": True}
    assert hash(spec)  # still a frozen, hashable spec
    agent = load_agent(spec)
    default = load_agent(AgentSpec(model=str(smollm2_dir)))
    text = agent.format_prompt("2+2")
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert "SmolLM" in default.format_prompt("2+2") and "SmolLM" not in text
    with pytest.raises(AgentSpecError, match="chat_template_kwargs"):
        AgentSpec(model="x", chat_template_kwargs={"add_generation_prompt": False})
    with pytest.raises(AgentSpecError, match="system"):
        AgentSpec(model="x", system=3)
