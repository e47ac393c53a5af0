"""Experiment YAML files: the ``base:`` chain, ``--set`` overrides, `load_experiment`; and a run directory's
resolved ``config.yaml`` (`read_run_config`) with the hash that decides which runs hold the same config
(`config_hash`)."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import yaml

from workbench.config.checks import ConfigError
from workbench.config.experiment import ExperimentConfig, TaskConfig, from_dict
from workbench.core.io import to_plain

log = logging.getLogger(__name__)


def parse_overrides(overrides: list[str] | dict[str, Any] | None) -> dict[str, Any]:
    """Turn ``["train.lr=1e-3", "hacpo.alpha=2"]`` into ``{"train.lr": 0.001, ...}`` (YAML values)."""
    if overrides is None:
        return {}
    if isinstance(overrides, dict):
        return dict(overrides)
    parsed = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. hacpo.alpha=2.0")
        key, raw = item.split("=", 1)
        parsed[key.strip()] = yaml.safe_load(raw)
    return parsed


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set dotted keys (``train.lr``, ``agents.0.lora.r``) in a copy of ``data``."""
    data = copy.deepcopy(data)
    for dotted, value in overrides.items():
        node: Any = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            if isinstance(node, list):
                node = node[int(part)]
            else:
                node = node.setdefault(part, {})
        last = parts[-1]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return data


def drop_stale_knobs(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A ``task.source`` (``task.eval_source``) override drops the file's ``task.knobs`` (``eval_knobs``):
    they belong to the old source. Knobs given as overrides too (``task.knobs.min_terms=2``) are applied
    afterwards, so they are kept (and checked against the new source)."""
    for source, knobs in (("source", "knobs"), ("eval_source", "eval_knobs")):
        task = data.get("task")
        if not isinstance(task, dict) or not task.get(knobs) or f"task.{source}" not in overrides:
            continue
        new, old = overrides[f"task.{source}"], task.get(source, getattr(TaskConfig, source))
        if new == old:
            continue
        log.info("task.%s = %r replaces %r: dropping its task.%s %s", source, new, old, knobs, task[knobs])
        data = copy.deepcopy(data)
        del data["task"][knobs]
    return data


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge mappings (``update`` wins; lists are replaced, not concatenated)."""
    out = dict(base)
    for key, value in update.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def _read_yaml_with_base(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    """Read an experiment YAML; a ``base: other.yaml`` key (relative to the file) is merged underneath."""
    if not path.is_file():
        available = sorted(p.name for p in path.parent.glob("*.yaml")) if path.parent.is_dir() else []
        raise ConfigError(f"experiment file {str(path)!r} not found; available in {path.parent}: {available}")
    if path.resolve() in seen:
        raise ConfigError(f"{path}: 'base' chain loops: {[str(p) for p in seen]}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: an experiment config must be a mapping, got {type(data).__name__}")
    base = data.pop("base", None)
    if base is None:
        return data
    parent = _read_yaml_with_base(path.parent / str(base), (*seen, path.resolve()))
    parent.pop("experiment", None)  # the derived file is its own experiment (named after the file)
    return _merge(parent, data)


def load_experiment(
    path: str | Path, overrides: list[str] | dict[str, Any] | None = None
) -> ExperimentConfig:
    """Read an experiment YAML (and its ``base:`` chain), apply ``--set``-style overrides, validate.

    Args:
        path: YAML file (``experiments/quickstart.yaml``).
        overrides: ``["train.steps=5"]`` or ``{"train.steps": 5}``.

    Returns:
        The validated config.

    Raises:
        ConfigError: the file is missing or malformed, or a key/value is invalid (the message names it).
    """
    path = Path(path)
    data = _read_yaml_with_base(path, seen=())
    data.setdefault("experiment", path.stem)
    overrides = parse_overrides(overrides)
    try:
        return from_dict(apply_overrides(drop_stale_knobs(data, overrides), overrides))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


PLACEMENT_KEYS = ("executor", "ray")
"""Top-level config keys that say where a run computes, not what it computes: left out of `config_hash`, so
a run resumes under either executor (they give the same results, ``tests/test_executors.py``) and configs
written before these keys existed hash as they did."""


ADDED_DEFAULTS: dict[tuple[str, str], Any] = {
    ("hacpo", "own_advantage"): "joint",
    ("hacpo", "batch_order"): "own_first",
    ("task", "rewards"): [],
    ("train", "lr_schedule"): "constant",
    ("train", "warmup_steps"): 0,
    ("train", "warmup_ratio"): 0.0,
    ("train", "mask_truncated"): False,
    ("train", "engine"): "hf",
    ("train", "engine_eager"): False,
    ("train", "engine_kv_gib"): 1.0,
    ("train", "engine_is_cap"): None,
}
"""Section keys added after runs were committed, with the value that reproduces those runs: left out of
`config_hash` at that value, so a config written before the key existed hashes as it did."""
ADDED_AGENT_DEFAULTS: dict[str, Any] = {
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "stop_strings": [],
    "lr": None,
    "lr_schedule": None,
}
"""The same for the keys of each agent (the peft fields of ``lora`` are written only when set)."""


def config_hash(cfg: dict[str, Any]) -> str:
    """A stable 12-hex-digit hash of a resolved config (key order, tuples vs lists and paths vs strings
    do not matter; `PLACEMENT_KEYS`, ``output.root`` and `ADDED_DEFAULTS` at their value are left out), used
    to decide whether a run directory holds "the same config": a finished run moved to another results
    folder is still found there."""
    plain = to_plain(cfg)
    if isinstance(plain, dict):
        plain = {k: v for k, v in plain.items() if k not in PLACEMENT_KEYS}
        if isinstance(plain.get("output"), dict):
            plain["output"] = {k: v for k, v in plain["output"].items() if k != "root"}
        for (section, key), value in ADDED_DEFAULTS.items():
            if isinstance(plain.get(section), dict) and plain[section].get(key, value) == value:
                plain[section] = {k: v for k, v in plain[section].items() if k != key}
        if isinstance(plain.get("agents"), list):
            plain["agents"] = [_without_added(agent) for agent in plain["agents"]]
    text = json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _without_added(agent: Any) -> Any:
    """An agent's plain data without the keys of `ADDED_AGENT_DEFAULTS` at their default."""
    if not isinstance(agent, dict):
        return agent
    return {k: v for k, v in agent.items() if k not in ADDED_AGENT_DEFAULTS or v != ADDED_AGENT_DEFAULTS[k]}


def read_run_config(run_dir: Path | str) -> dict[str, Any]:
    """A run directory's resolved ``config.yaml`` as plain data.

    Raises:
        OSError: It cannot be read.
        ValueError: It does not hold a mapping (``yaml.YAMLError`` for text that is not YAML).
    """
    path = Path(run_dir) / "config.yaml"
    cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a mapping, got {type(cfg).__name__}")
    return cfg
