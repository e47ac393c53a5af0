"""An agent's current policy as plain weights: LoRA folded in aside, written where a serving engine loads it.

`merged_state_dict` leaves the model untouched (training goes on), unlike peft's ``merge_and_unload`` (what
`workbench.agents.models.export` uses for a finished run); `write_policy` writes it as a Hugging Face folder
(`workbench.agents.generation.vllm_engine` loads and reloads it).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from workbench.agents.forward.agent import Agent

__all__ = ["merged_state_dict", "write_policy"]


def merged_state_dict(agent: Agent) -> dict[str, torch.Tensor]:
    """The agent's current weights with its LoRA adapters folded in, keyed as its base checkpoint is.

    Unlike ``merged=True`` in `export_agent`, the model is left untouched (training goes on): each LoRA
    layer's weight is ``W + ΔW`` (peft's ``get_delta_weight`` of its active adapters), computed aside.

    Raises:
        ValueError: A quantized agent (its base holds 4/8-bit weights) or a DoRA adapter (whose merge is not
            ``W + ΔW``).
    """
    if agent.spec.quantization != "none":
        raise ValueError(
            f"agent {agent.name!r}: quantization = {agent.spec.quantization!r} has no full-precision weights "
            "to merge into; use quantization: none for an engine that loads merged weights"
        )
    if not agent.is_lora:
        return {key: value.detach().clone() for key, value in agent.model.state_dict().items()}
    from peft.tuners.lora import LoraLayer

    base = agent.model.get_base_model()
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
        for adapter in agent.model.peft_config:  # modules_to_save: the trained copy replaces the original
            key = key.replace(f".modules_to_save.{adapter}.", ".")
        key = key.replace(".base_layer.", ".")
        tensor = value.detach()
        if key in deltas:
            tensor = tensor + deltas[key].to(tensor.dtype)
        merged[key] = tensor.clone().contiguous()
    return merged


def write_policy(agent: Agent, out_dir: str | Path, *, config: bool = True) -> Path:
    """Write `merged_state_dict` as ``model.safetensors`` (with ``config.json`` and the tokenizer when
    ``config``): the folder a serving engine loads, or reloads in place."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if config:
        model = agent.model.get_base_model() if agent.is_lora else agent.model
        model.config.save_pretrained(str(out_dir))
        agent.tokenizer.save_pretrained(str(out_dir))
    weights = {key: value.to("cpu") for key, value in merged_state_dict(agent).items()}
    tmp = out_dir / "model.safetensors.tmp"
    save_file(weights, str(tmp), metadata={"format": "pt"})
    tmp.replace(out_dir / "model.safetensors")
    return out_dir
