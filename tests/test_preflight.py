"""Pre-flight: every bad input named (field, value, what is allowed) before any model loads."""

from __future__ import annotations

import json
import logging

import pytest

from workbench.agents.models import loading, zoo
from workbench.config.checks import ConfigError
from workbench.config.loading import load_experiment
from workbench.core.env import PROJECT_ROOT
from workbench.train import preflight
from workbench.train.preflight import check_experiment, experiment_problems

QUICKSTART = PROJECT_ROOT / "experiments" / "quickstart.yaml"
DATA = PROJECT_ROOT / "tests" / "data"


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    """Pre-flight must never build or load a model: any attempt fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("pre-flight loaded a model")

    monkeypatch.setattr(loading, "build_agent", refuse)
    monkeypatch.setattr(loading, "tiny_source", refuse)
    monkeypatch.setattr(loading, "warm_source", refuse)
    monkeypatch.setattr(zoo, "build_tiny", refuse)


def _cfg(*overrides: str):
    return load_experiment(QUICKSTART, list(overrides))


def test_the_quickstart_is_clean():
    check_experiment(_cfg())


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["agents.0.model=tiny:gpt3"],
            r"agents\[0\]\.model = 'tiny:gpt3' is not allowed: tiny presets are \[",
        ),
        (["agents.1.model=./no/such/dir"], r"agents\[1\]\.model = './no/such/dir' does not exist"),
        (["agents.0.model=smollm3"], r"agents\[0\]\.model = 'smollm3' is not allowed: an embedded model"),
        (
            ["agents.0.model=someone/no-such-model"],
            r"neither an existing directory nor a hub id in the local",
        ),
        (
            ["task.source=gym:no_such_generator"],
            r"task\.source = 'gym:no_such_generator': unknown reasoning-gym",
        ),
        (
            ["task.source=gym:basic_arithmetic", "task.knobs.min_terms=5", "task.knobs.max_terms=2"],
            r"with task\.knobs = \{'min_terms': 5, 'max_terms': 2\}: the generator refused these options "
            r"\(AssertionError: max_terms must be >= min_terms\)",
        ),
        (["task.knobs.foo=1"], r"task\.knobs = .* is not allowed for task\.source = 'embedded': \['foo'\]"),
        (
            ["task.knobs.regime=nope"],
            r"regime = 'nope' is not allowed: one of \['addsub', 'addsub2', 'mixed'\]",
        ),
        (["task.source=file:missing.jsonl"], r"task\.source = 'file:missing\.jsonl': no task file at"),
        ([f"task.source=file:{DATA / 'bad_json.jsonl'}"], r"bad_json\.jsonl:3: invalid JSON"),
        (
            [f"task.source=file:{DATA / 'missing_answer.jsonl'}"],
            r"missing_answer\.jsonl:2: no answer; looked",
        ),
        (
            ["task.eval_source=math500"],
            r"task\.eval_source = 'math500': benchmark 'math500' \(test\): no local",
        ),
        (["task.eval_sources=[embedded, nope]"], r"task\.eval_sources\[1\] = 'nope': unknown task source"),
        (["agents.0.device=cuda"], r"agents\[0\]\.device = 'cuda' is not allowed on this machine"),
        (
            [f"task.source=file:{DATA / 'gsm8k.jsonl'}", "task.knobs.holdout=none"],
            r"holdout.*with no task\.eval_source evaluates on training questions",
        ),
        (
            [
                f"task.source=file:{DATA / 'gsm8k.jsonl'}",
                "task.knobs.holdout=none",
                f"task.eval_source=file:{DATA / 'gsm8k.jsonl'}",
                "task.eval_knobs.holdout=none",
            ],
            r"task\.eval_source = .*: 3 of 3 held-out questions are also training questions",
        ),
    ],
)
def test_bad_input_is_named(overrides, expected, monkeypatch):
    if "cuda" in " ".join(overrides):
        monkeypatch.setattr(preflight.torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=expected) as info:
        check_experiment(_cfg(*overrides))
    assert "found before any model loaded" in str(info.value)


def test_every_problem_in_one_message():
    problems = experiment_problems(_cfg("agents.0.model=tiny:gpt3", "task.source=gym:no_such_generator"))
    assert len(problems) == 2, problems
    assert problems[0].startswith("agents[0].model") and problems[1].startswith("task.source")


def test_tracking_sink_not_installed(monkeypatch):
    real = preflight.importlib.util.find_spec  # the tracking module uses the same importlib
    monkeypatch.setattr(
        "workbench.train.tracking.importlib.util.find_spec", lambda n: None if n == "wandb" else real(n)
    )
    (problem,) = experiment_problems(_cfg("output.report_to=[wandb]"))
    assert problem == (
        "output.report_to = ['wandb']: 'wandb' is not installed (pip install wandb); install it or remove it "
        "from output.report_to"
    )


def test_config_errors_name_field_value_and_allowed():
    with pytest.raises(ConfigError, match=r"output\.report_to = \['neptune'\] is not allowed: a list of \["):
        _cfg("output.report_to=[neptune]")
    with pytest.raises(ConfigError, match=r"task\.reward = 'exact' is not allowed: one of \['math_verify'"):
        _cfg("task.reward=exact")


def test_a_source_override_drops_the_old_sources_knobs(caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="workbench.config.loading")
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps({"question": f"{i}+{i}", "answer": str(2 * i)}) for i in range(50)))
    cfg = _cfg(f"task.source=file:{path}")
    assert dict(cfg.task.knobs) == {}
    assert "dropping its task.knobs {'regime': 'addsub'}" in caplog.text
    check_experiment(cfg)  # the file is split by hash: train and held-out are disjoint
    kept = _cfg(f"task.source=file:{path}", "task.knobs.holdout=hash")  # given with the override: kept
    assert dict(kept.task.knobs) == {"holdout": "hash"}
    same = _cfg("task.source=embedded")  # not a change: the YAML's knobs stay
    assert dict(same.task.knobs) == {"regime": "addsub"}
