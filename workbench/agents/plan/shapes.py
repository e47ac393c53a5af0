"""Models without weights: their shapes (configs, parameter counts) and their dtypes (the precision policy).

`REFERENCE_CONFIGS` holds the ``config.json`` numbers of the models the recipes in ``experiments/gpu/`` name
and of the embedded SmolLM2 (``python -m workbench plan`` uses them where a model's own config is not
reachable; `bench/gpu_check.py` builds its random-weight Qwen3-1.7B stand-in from them). `Inventory` counts
the parameters of a config instantiated on the ``meta`` device.

`precision_policy` decides every dtype of an agent from its spec and its device type alone, without loading
anything, so the memory plan (`workbench.agents.plan.memory`) sizes an agent by the dtypes it will have and a
CPU test can apply the CUDA policy to a tiny model (`workbench.agents.forward.agent.precision` is the context
every forward pass of an agent runs in). The table of what it decides is in `workbench.agents.models.hf`,
which loads agents with it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from workbench.config.agent_spec import AgentSpec, AgentSpecError

__all__ = [
    "REFERENCE_CONFIGS",
    "Inventory",
    "Precision",
    "autocast_dtype",
    "checkpoint_bytes",
    "config_dict",
    "first_of",
    "precision_policy",
    "resolve_device",
    "resolve_dtype",
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


# -------------------- from workbench.agents.plan.shapes --------------------


@dataclass(frozen=True)
class Precision:
    """The dtypes of one agent (`precision_policy`)."""

    weights: torch.dtype
    """Unquantized weights as loaded: embeddings, norms, LM head, and every layer when not quantized."""
    compute: torch.dtype
    """bitsandbytes compute dtype of the quantized linear layers."""
    autocast: torch.dtype | None
    """Autocast dtype of every forward pass (`precision`); None = none."""
    reference: torch.dtype
    """Weights of the frozen KL reference of a full fine-tune."""
    adapters: torch.dtype = torch.float32
    """LoRA adapters (peft upcasts them to fp32 on a bf16 base)."""

    @property
    def activations(self) -> torch.dtype:
        """The dtype of hidden states, KV cache and logits (the planner's per-token sizes)."""
        return self.autocast or self.weights


def precision_policy(spec: AgentSpec, device_type: str) -> Precision:
    """The precision of an agent as a pure function of its spec and the device type (``cpu``, ``cuda``).

    See the module docstring for the table; an explicit ``dtype`` / ``compute_dtype`` is honoured.
    """
    device = torch.device(device_type)
    full_finetune = spec.lora is None
    weights = resolve_dtype(spec.dtype, device, full_finetune=full_finetune)
    autocast = autocast_dtype(spec, device)
    return Precision(
        weights=weights,
        compute=resolve_dtype(spec.compute_dtype, device),
        autocast=autocast,
        reference=torch.bfloat16 if autocast is not None else weights,
    )


def resolve_device(device: str) -> Any:
    """``auto`` -> ``cuda`` when available, else ``cpu``; returns a ``torch.device``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise AgentSpecError(f"device = {device!r} is not available here (no CUDA); use device: cpu or auto")
    return torch.device(device)


def resolve_dtype(dtype: str, device: Any, *, full_finetune: bool = False) -> Any:
    """Weight (or compute) dtype of ``auto``: float32 on CPU; on CUDA bfloat16, except float32 master weights
    when every weight is trained (``full_finetune``; the forward then runs under bf16 autocast)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" and not full_finetune else torch.float32
    return getattr(torch, dtype)


def autocast_dtype(spec: AgentSpec, device: Any) -> Any:
    """bfloat16 for a fully fine-tuned agent on CUDA with ``dtype: auto`` (fp32 master weights), else None."""
    if device.type == "cuda" and spec.lora is None and spec.dtype == "auto":
        return torch.bfloat16
    return None
