"""The ``executor`` field and the ``ray`` section (issue 12): validated, loaded from YAML, passed to the
trainer's Ray options, and left out of a run's identity (the config hash that matches runs for resume)."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import yaml

from workbench.__main__ import main
from workbench.config import RayConfig
from workbench.config.experiment import EXECUTORS, ConfigError, from_dict
from workbench.config.loading import config_hash, load_experiment
from workbench.train import executors

AGENTS = [{"name": "a", "model": "tiny:x"}, {"name": "b", "model": "tiny:y"}]


def _cfg(**top):
    return from_dict({"experiment": "t", "agents": AGENTS} | top)


def test_default_is_local_with_default_ray_options():
    cfg = _cfg()
    assert cfg.executor == "local" and cfg.ray == RayConfig()
    assert executors.RayOptions.from_config(cfg.ray) == executors.RayOptions()


def test_the_config_knows_the_executors_and_ray_options_of_the_train_layer():
    assert EXECUTORS == executors.EXECUTORS
    fields = [(f.name, f.default) for f in dataclasses.fields(RayConfig)]
    assert fields == [(f.name, f.default) for f in dataclasses.fields(executors.RayOptions)]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"executor": "slurm"}, r"executor = 'slurm' is not allowed: one of \['local', 'threads', 'ray'\]"),
        (
            {"executor": "threads", "train": {"compile_decode": True}},
            r"train.compile_decode = True is not allowed: false with executor: threads",
        ),
        ({"ray": {"cpus_per_agent": 0}}, r"ray.cpus_per_agent = 0.0 is not allowed: > 0"),
        ({"ray": {"cpus_per_agent": "two"}}, r"ray.cpus_per_agent: expected float, got str 'two'"),
        ({"ray": {"gpus_per_agent": -0.5}}, r"ray.gpus_per_agent = -0.5 is not allowed: >= 0 or null"),
        ({"ray": {"address": " "}}, r"ray.address = ' ' is not allowed: a cluster address or null"),
        ({"ray": {"cpus": 2}}, r"unknown key ray.cpus; valid keys of 'ray': \['address', 'cpus_per_agent'"),
        ({"ray": 4}, r"ray: expected a mapping of settings, got 4"),
    ],
)
def test_bad_executor_or_ray_values_are_named(data, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(**data)


def test_a_yaml_with_executor_ray_and_a_ray_section_loads(tmp_path):
    path = tmp_path / "on_ray.yaml"
    data = {
        "agents": AGENTS,
        "algorithm": "hacpo",
        "executor": "ray",
        "ray": {"address": "auto", "cpus_per_agent": 2, "gpus_per_agent": 0.5},
    }
    path.write_text(yaml.safe_dump(data))
    cfg = load_experiment(path)
    assert cfg.executor == "ray"
    assert cfg.ray == RayConfig(address="auto", cpus_per_agent=2.0, gpus_per_agent=0.5)
    assert executors.RayOptions.from_config(cfg.ray) == executors.RayOptions("auto", 2.0, 0.5)
    assert from_dict(cfg.to_dict()) == cfg  # config.yaml reads back as the same config
    assert load_experiment(path, ["executor=local", "ray.cpus_per_agent=3"]).ray.cpus_per_agent == 3.0


def test_executor_and_ray_are_not_part_of_a_runs_identity():
    local = _cfg().to_dict()
    on_ray = _cfg(executor="ray", ray={"cpus_per_agent": 4}).to_dict()
    assert config_hash(local) == config_hash(on_ray)
    # a config.yaml written before the two keys existed still matches (its runs resume and are skipped)
    older = {k: v for k, v in local.items() if k not in ("executor", "ray")}
    assert config_hash(older) == config_hash(local)
    assert config_hash(_cfg(seed=1).to_dict()) != config_hash(local)


def test_cli_dry_run_accepts_executor_ray(caplog):
    caplog.set_level(logging.INFO)
    argv = ["run", "experiments/quickstart.yaml", "--set", "executor=ray", "--dry-run"]
    assert main(argv) == 0
    out = "\n".join(caplog.messages)
    resolved = yaml.safe_load(out[out.index("experiment: quickstart") :].split("# checked")[0])
    assert resolved["executor"] == "ray" and resolved["ray"]["cpus_per_agent"] == 1.0
    caplog.clear()
    assert main(["run", "experiments/quickstart.yaml", "--set", "executor=slurm", "--dry-run"]) == 2
    assert "executor = 'slurm' is not allowed" in "\n".join(caplog.messages)
