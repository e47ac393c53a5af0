"""The precision policy: every dtype of an agent from its spec and its device type alone, and the device.

`precision_policy` decides without loading anything, so the memory plan (`workbench.agents.plan.memory`) sizes
an agent by the dtypes it will have and a CPU test can apply the CUDA policy to a tiny model
(`workbench.agents.forward.agent.precision` is the context every forward pass of an agent runs in). The table
of what it decides is in `workbench.agents.models.hf`, which loads agents with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.config.agent_spec import AgentSpec, AgentSpecError

__all__ = ["Precision", "autocast_dtype", "precision_policy", "resolve_device", "resolve_dtype"]


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
