"""An agent's model config without its weights, and the longest prompt in its own tokens.

`model_config` is what ``python -m workbench plan`` plans from: a tiny preset's or a directory's
``config.json``, a hub id's from the hub or the local cache, else the shape in `REFERENCE_CONFIGS` (the
models the recipes in ``experiments/gpu/`` name, and the embedded SmolLM2); `bench/gpu_check.py` builds its
random-weight Qwen3-1.7B stand-in from the same table.
"""

from __future__ import annotations

from typing import Any

from workbench.config.agent_spec import AgentSpec

__all__ = ["REFERENCE_CONFIGS", "model_config", "prompt_tokens"]

_QWEN3 = {
    "model_type": "qwen3", "head_dim": 128, "num_key_value_heads": 8, "vocab_size": 151936,
    "tie_word_embeddings": True, "max_position_embeddings": 32768, "dtype": "bfloat16",
}  # fmt: skip
_QWEN3_1_7B = _QWEN3 | {
    "num_hidden_layers": 28, "hidden_size": 2048, "num_attention_heads": 16, "intermediate_size": 6144,
}  # fmt: skip
_QWEN3_4B = _QWEN3 | {
    "num_hidden_layers": 36, "hidden_size": 2560, "num_attention_heads": 32, "intermediate_size": 9728,
}  # fmt: skip
REFERENCE_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-1.7B-Base": _QWEN3_1_7B,
    "Qwen/Qwen3-1.7B": _QWEN3_1_7B,
    "Qwen/Qwen3-4B-Base": _QWEN3_4B,
    "Qwen/Qwen3-4B": _QWEN3_4B,
    "Qwen/Qwen3-4B-Instruct-2507": _QWEN3_4B | {"max_position_embeddings": 262144},
    "meta-llama/Llama-3.2-3B-Instruct": {
        "model_type": "llama", "num_hidden_layers": 28, "hidden_size": 3072, "num_attention_heads": 24,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "vocab_size": 128256,
        "tie_word_embeddings": True, "max_position_embeddings": 131072, "dtype": "bfloat16",
    },
    "smollm2-135m-instruct": {
        "model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
        "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
        "max_position_embeddings": 8192,
    },
}  # fmt: skip
"""The shapes (from their ``config.json``) of the models the recipes name, used by ``plan`` when a model's
own config cannot be read here (no hub, not in the cache); random-weight stand-ins are built from them too."""


def model_config(spec: AgentSpec) -> tuple[dict[str, Any], str]:
    """``(config.json as a dict, where it came from)`` of an agent's model, without loading weights.

    Tiny presets and directories are read locally (a preset is built on first use, as training would); a hub
    id's config comes from the hub or the local cache, else from `REFERENCE_CONFIGS`; embedded models use
    `REFERENCE_CONFIGS` when they have an entry (no conversion needed).

    Raises:
        ValueError: No config can be found (the message names the model and what to pass instead).
    """
    from transformers import AutoConfig

    from workbench.agents.loading import resolve_model_source

    if spec.model in REFERENCE_CONFIGS and not spec.model.count("/"):
        return dict(REFERENCE_CONFIGS[spec.model]), "reference shape"
    source = resolve_model_source(spec.model)
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=spec.trust_remote_code)
        return config.to_dict(), source
    except (OSError, ValueError) as exc:
        if spec.model in REFERENCE_CONFIGS:
            return dict(
                REFERENCE_CONFIGS[spec.model]
            ), "reference shape (its config.json is not reachable here)"
        raise ValueError(
            f"model {spec.model!r}: no config.json reachable here ({exc}); pass a directory holding its "
            "config.json, or run where the hub or the model's cache is"
        ) from exc


def prompt_tokens(spec: AgentSpec, prompts: list[str]) -> tuple[int, str]:
    """The longest of ``prompts`` in the agent's own prompt format and tokens when its tokenizer is here; else
    an estimate (3 characters per token, plus 32 tokens of chat template)."""
    import torch
    from transformers import AutoTokenizer

    from workbench.agents.agent import Agent
    from workbench.agents.loading import resolve_model_source

    try:
        source = resolve_model_source(spec.tokenizer or spec.model)
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    except Exception:  # any failure means "no local tokenizer": estimate instead
        return max(len(p) for p in prompts) // 3 + 32, "estimated (no local tokenizer)"
    agent = Agent(spec.display_name, spec, None, tokenizer, torch.device("cpu"), 0, 0, (0,), 1)
    return max(len(agent.encode_prompt(p)) for p in prompts), "measured"
