"""An agent's current policy as plain weights: LoRA folded in aside, written where a serving engine loads it.

`merged_state_dict` leaves the model untouched (training goes on), unlike peft's ``merge_and_unload`` (what
`workbench.agents.models.export` uses for a finished run); `write_policy` writes it as a Hugging Face folder
(`workbench.agents.generation.vllm_engine` loads and reloads it). A 4-bit (QLoRA) agent's base is the
trainer's own nf4 weights dequantized, so the engine and the trainer differ only by their kernels.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors.torch import save_file

from workbench.agents.forward.agent import Agent

__all__ = ["merged_state_dict", "write_policy"]


def merged_state_dict(agent: Agent) -> dict[str, torch.Tensor]:
    """The agent's current weights with its LoRA adapters folded in, keyed as its base checkpoint is.

    Unlike ``merged=True`` in `export_agent`, the model is left untouched (training goes on): each LoRA
    layer's weight is ``W + ΔW`` (peft's ``get_delta_weight`` of its active adapters), computed aside.

    A 4-bit agent's quantized weights are dequantized (bitsandbytes' own ``dequantize_4bit``, what its forward
    multiplies by) in its compute dtype, and ``W`` is that.

    Raises:
        ValueError: An 8-bit agent (its int8 weights and outlier split have no single full-precision ``W``)
            or a DoRA adapter (whose merge is not ``W + ΔW``).
    """
    if agent.spec.quantization == "8bit":
        raise ValueError(
            f"agent {agent.name!r}: quantization = '8bit' has no single full-precision weight to merge into; "
            "use quantization: none or 4bit for an engine that loads merged weights"
        )
    if not agent.is_lora:
        return {key: value.detach().clone() for key, value in agent.model.state_dict().items()}
    from peft.tuners.lora import LoraLayer

    base = agent.model.get_base_model()
    dequantized = _dequantized_4bit(base)
    deltas = {}
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        active = [a for a in module.active_adapters if a in module.lora_A]
        if any(module.use_dora.get(a) for a in active):
            raise ValueError(f"agent {agent.name!r}: a DoRA adapter ({name}) cannot be merged as W + ΔW")
        if active:
            deltas[f"{name}.weight"] = sum(module.get_delta_weight(a) for a in active)
    merged = {}
    for key, value in base.state_dict().items():
        if "lora_" in key or ".original_module." in key:
            continue
        if any(key.startswith(f"{weight}.") for weight in dequantized):
            continue  # a 4-bit weight's quantization state (absmax, quant_map, ...)
        if key in dequantized:
            value = dequantized[key]
        for adapter in agent.model.peft_config:  # modules_to_save: the trained copy replaces the original
            key = key.replace(f".modules_to_save.{adapter}.", ".")
        key = key.replace(".base_layer.", ".")
        tensor = value.detach()
        if key in deltas:
            tensor = tensor + deltas[key].to(tensor.dtype)
        merged[key] = tensor.clone().contiguous()
    return merged


def _dequantized_4bit(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each bitsandbytes 4-bit layer's weight, dequantized in its compute dtype, keyed as in
    ``model.state_dict()``; empty for a model without one."""
    modules = [(n, m) for n, m in model.named_modules() if type(m).__name__ == "Linear4bit"]
    if not modules:
        return {}
    import bitsandbytes as bnb

    out = {}
    for name, module in modules:
        weight = module.weight
        dtype = getattr(module, "compute_dtype", None) or torch.float32
        out[f"{name}.weight"] = bnb.functional.dequantize_4bit(weight.data, weight.quant_state).to(dtype)
    return out


def write_policy(agent: Agent, out_dir: str | Path, *, config: bool = True) -> Path:
    """Write `merged_state_dict` as ``model.safetensors`` (with ``config.json`` and the tokenizer when
    ``config``): the folder a serving engine loads, or reloads in place."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if config:
        model = agent.model.get_base_model() if agent.is_lora else agent.model
        plain = copy.deepcopy(model.config)  # the weights written are full precision
        if hasattr(plain, "quantization_config"):
            del plain.quantization_config
        plain.save_pretrained(str(out_dir))
        agent.tokenizer.save_pretrained(str(out_dir))
    weights = {key: value.to("cpu") for key, value in merged_state_dict(agent).items()}
    tmp = out_dir / "model.safetensors.tmp"
    save_file(weights, str(tmp), metadata={"format": "pt"})
    tmp.replace(out_dir / "model.safetensors")
    return out_dir
