"""Model shapes without weights: the configs of the recipes' models, and parameter counts of any config.

`REFERENCE_CONFIGS` holds the ``config.json`` numbers of the models the recipes in ``experiments/gpu/`` name
and of the embedded SmolLM2 (``python -m workbench plan`` uses them where a model's own config is not
reachable; `bench/gpu_check.py` builds its random-weight Qwen3-1.7B stand-in from them). `Inventory` counts
the parameters of a config instantiated on the ``meta`` device.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "REFERENCE_CONFIGS",
    "Inventory",
    "checkpoint_bytes",
    "config_dict",
    "first_of",
]

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


def config_dict(config: Any) -> dict[str, Any]:
    """A config (``PretrainedConfig`` or mapping) as a flat dict; a nested ``text_config`` is merged in."""
    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    text = data.get("text_config")
    return {**data, **text} if isinstance(text, Mapping) else data


def first_of(data: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    """The first of ``keys`` that ``data`` holds (configs name the same number differently), else
    ``default``; neither raises a `ValueError` naming the keys."""
    for key in keys:
        if data.get(key) is not None:
            return data[key]
    if default is not None:
        return default
    raise ValueError(f"model config has none of {list(keys)}: cannot plan its memory")


@dataclass(frozen=True)
class Inventory:
    """Parameter counts of a model config, instantiated on the ``meta`` device (`from_config`)."""

    params: int
    """Every parameter, tied ones once."""
    head: int
    """Parameters of the LM head when it is not tied to the input embeddings (else 0)."""
    linears: tuple[tuple[str, int, int, bool], ...]
    """``(name, in, out, is nn.Linear)`` of every projection but the LM head (GPT-2's are ``Conv1D``)."""

    @classmethod
    def from_config(cls, config: Any) -> Inventory:
        """Counts the parameters of ``config`` (a ``PretrainedConfig`` or mapping with ``model_type``)."""
        data = config_dict(config)
        data.pop("quantization_config", None)
        return _inventory(json.dumps(data, sort_keys=True, default=str))

    def matching(self, targets: str | tuple[str, ...]) -> list[tuple[str, int, int, bool]]:
        """The projections a peft ``target_modules`` selects (``all-linear``, names, or a regex string)."""
        import re

        if targets == "all-linear":
            return list(self.linears)
        if isinstance(targets, str):
            return [lin for lin in self.linears if re.fullmatch(targets, lin[0])]
        return [lin for lin in self.linears if any(lin[0] == t or lin[0].endswith(f".{t}") for t in targets)]

    @property
    def quantizable(self) -> int:
        """Weights bitsandbytes quantizes: every ``nn.Linear`` but the LM head."""
        return sum(i * o for _, i, o, linear in self.linears if linear)

    @property
    def largest_linear(self) -> int:
        return max((i * o for _, i, o, _ in self.linears), default=0)


@functools.lru_cache(maxsize=16)
def _inventory(config_json: str) -> Inventory:
    from transformers import AutoConfig, AutoModelForCausalLM

    data = json.loads(config_json)
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    head = model.get_output_embeddings()
    embedding = model.get_input_embeddings()
    tied = head is not None and embedding is not None and head.weight is embedding.weight
    linears = []
    for name, module in model.named_modules():
        if module is head:
            continue
        if isinstance(module, torch.nn.Linear):
            linears.append((name, module.in_features, module.out_features, True))
        elif type(module).__name__ == "Conv1D":  # transformers' GPT-2 projection, weight (in, out)
            linears.append((name, module.weight.shape[0], module.weight.shape[1], False))
    return Inventory(
        params=sum(p.numel() for p in model.parameters()),
        head=0 if tied or head is None else head.weight.numel(),
        linears=tuple(linears),
    )


def checkpoint_bytes(config: Any) -> int:
    """Bytes per parameter of a model's checkpoint file, from its config's ``dtype`` (4 when unstated)."""
    name = config_dict(config).get("dtype") or config_dict(config).get("torch_dtype") or "float32"
    return {"float32": 4, "bfloat16": 2, "float16": 2}.get(str(name).removeprefix("torch."), 4)
