"""An agent's model config and its longest prompt, without loading its weights (``python -m workbench plan``).

`model_config` reads a tiny preset's or a directory's ``config.json``, a hub id's from the hub or the local
cache, else the shape in `workbench.agents.plan.shapes.REFERENCE_CONFIGS`; `prompt_tokens` measures prompts
with the agent's own tokenizer and prompt format when the tokenizer is here.
"""

from __future__ import annotations

from typing import Any

from workbench.agents.plan.shapes import REFERENCE_CONFIGS
from workbench.config.agent_spec import AgentSpec

__all__ = ["model_config", "prompt_tokens"]


def model_config(spec: AgentSpec) -> tuple[dict[str, Any], str]:
    """``(config.json as a dict, where it came from)`` of an agent's model, without loading weights.

    Tiny presets and directories are read locally (a preset is built on first use, as training would); a hub
    id's config comes from the local cache, else from `REFERENCE_CONFIGS`, else from the hub; embedded models
    use `REFERENCE_CONFIGS` when they have an entry (no conversion needed).

    Raises:
        ValueError: No config can be found (the message names the model and what to pass instead).
    """
    from transformers import AutoConfig

    from workbench.agents.models.loading import resolve_model_source

    if spec.model in REFERENCE_CONFIGS and not spec.model.count("/"):
        return dict(REFERENCE_CONFIGS[spec.model]), "reference shape"
    source = resolve_model_source(spec.model)
    # Local files first, then the reference shape, and only then the hub: planning offline never waits on
    # the hub's retries for a model whose shape is known.
    try:
        config = AutoConfig.from_pretrained(
            source, trust_remote_code=spec.trust_remote_code, local_files_only=True
        )
        return config.to_dict(), source
    except (OSError, ValueError):
        if spec.model in REFERENCE_CONFIGS:
            return dict(REFERENCE_CONFIGS[spec.model]), "reference shape (no local config.json)"
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=spec.trust_remote_code)
        return config.to_dict(), source
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"model {spec.model!r}: no config.json reachable here ({exc}); pass a directory holding its "
            "config.json, or run where the hub or the model's cache is"
        ) from exc


def prompt_tokens(spec: AgentSpec, prompts: list[str]) -> tuple[int, str]:
    """The longest of ``prompts`` in the agent's own prompt format and tokens when its tokenizer is here; else
    an estimate (3 characters per token, plus 32 tokens of chat template)."""
    import torch
    from transformers import AutoTokenizer

    from workbench.agents.forward.agent import Agent
    from workbench.agents.models.loading import resolve_model_source

    try:
        source = resolve_model_source(spec.tokenizer or spec.model)
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    except Exception:  # any failure means "no local tokenizer": estimate instead
        return max(len(p) for p in prompts) // 3 + 32, "estimated: no local tokenizer"
    agent = Agent(spec.display_name, spec, None, tokenizer, torch.device("cpu"), 0, 0, (0,), 1)
    return max(len(agent.encode_prompt(p)) for p in prompts), "measured"
