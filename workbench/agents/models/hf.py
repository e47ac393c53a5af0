"""transformers / peft / bitsandbytes: build an `Agent` from a resolved model source (directory or hub id).

The spec → ``LoraConfig`` / ``BitsAndBytesConfig`` translations are tiny pure functions; the libraries are
imported inside them, so importing this module stays cheap. `workbench.agents.models.loading.load_agent`
resolves model strings (tiny presets, embedded models, paths, hub ids) and calls `build_agent`.

Precision policy (``dtype: auto``, the default; `precision_policy` decides it from the spec and the device
type alone, so a CPU test can apply the CUDA policy to a tiny model):

| agent | weights | forward / backward | optimizer state |
|---|---|---|---|
| CPU, any | float32 | float32 (bf16 matmuls are ~20x slower on AVX2 CPUs) | float32 |
| CUDA, full fine-tuning | float32 master weights | bf16 autocast (`precision`) | float32 |
| CUDA, LoRA | bf16 base (frozen) | bf16 | float32 adapters (peft keeps adapters in fp32) |
| CUDA, 4/8-bit LoRA | quantized linear layers, bf16 embeddings, norms and LM head | bf16 | float32 adapters |

So no trained weight is ever stored in bf16: at the paper's lr 1e-6, an AdamW step on a bf16 weight is below
bf16's resolution (2^-8 relative) and would round away. An explicit ``dtype: bfloat16`` / ``float16`` for full
fine-tuning is honoured with a warning. The full fine-tuning KL reference is frozen, so on CUDA it is loaded
in bf16 (half the memory). Whoever runs an agent's forward passes (the trainer's workers) enters
`precision(agent)`.

Quantized agents are not passed through peft's ``prepare_model_for_kbit_training``: it upcasts embeddings,
norms and the LM head to fp32, so the residual stream, the KV cache and the full-vocabulary logits would run
in fp32 (TRL dropped it for the same reason). Gradient checkpointing is switched on as TRL does it:
non-reentrant checkpoints, with input gradients enabled.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from pathlib import Path
from typing import Any

import torch

from workbench.agents.forward.agent import Agent, AgentLoadError
from workbench.agents.plan.shapes import Precision, precision_policy, resolve_device
from workbench.config.agent_spec import QUANTIZATIONS, AgentSpec, AgentSpecError, LoraSpec, choice
from workbench.config.checks import thaw
from workbench.core import env

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "bnb_config",
    "build_agent",
    "build_model",
    "lora_config",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_NEW_TOKENS = 512
"""Response cap when neither the spec nor the model's generation config sets one."""


class _DropCastWarning(logging.Filter):
    """bitsandbytes' 8-bit path logs a cast warning on every matmul; the cast is intended here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "inputs will be cast from" not in record.getMessage()


def _quiet_8bit_casts() -> None:
    """Attach `_DropCastWarning` to bitsandbytes' logger once, when an 8-bit model is loaded."""
    target = logging.getLogger("bitsandbytes.autograd._functions")
    if not any(isinstance(f, _DropCastWarning) for f in target.filters):
        target.addFilter(_DropCastWarning())


def _from_pretrained(loader: Any, source: str, spec: AgentSpec, what: str, **kwargs: Any) -> Any:
    try:
        return loader.from_pretrained(source, trust_remote_code=spec.trust_remote_code, **kwargs)
    except (OSError, ValueError) as exc:
        offline = env.hub_offline()
        hint = (
            " HF_HUB_OFFLINE is set: a hub id loads only if already in the local HF cache; unset it on a "
            "machine with hub access, or download the model and pass its directory."
            if offline and not Path(source).exists()
            else ""
        )
        raise AgentLoadError(f"cannot load the {what} of {source!r}: {exc}.{hint}") from exc


def _load_tokenizer(spec: AgentSpec, tok_source: str) -> Any:
    from transformers import AutoTokenizer

    tokenizer = _from_pretrained(AutoTokenizer, tok_source, spec, "tokenizer")
    if tokenizer.eos_token_id is None:
        raise AgentLoadError(f"tokenizer of {tok_source!r} has no EOS token; set one in its tokenizer_config")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _quantized_layers(model: Any) -> int:
    return sum("Linear4bit" in type(m).__name__ or "Linear8bit" in type(m).__name__ for m in model.modules())


_LOADING = threading.Lock()
"""One model load at a time in a process: transformers' loading switches process-wide state (the default
device, whether new weights are initialized) for its duration, so two loads at once on two threads (agents
loading their reference models under ``executor: threads``) can leave a model's weights on the meta device."""


def build_model(spec: AgentSpec, source: str, device: Any, policy: Precision | None = None) -> Any:
    """Loads the model of ``spec`` from ``source`` onto ``device`` with ``policy`` (+ LoRA, + 4/8-bit), in
    eval mode; one load at a time in a process (`_LOADING`).

    Args:
        spec: The agent spec.
        source: A model directory or hub id (already resolved).
        device: A ``torch.device``.
        policy: The dtypes; None = `precision_policy` of ``device``'s type. A CPU test passes the CUDA policy
            to check the dtypes a GPU would get.
    """
    with _LOADING:
        return _build_model(spec, source, device, policy)


def _build_model(spec: AgentSpec, source: str, device: Any, policy: Precision | None) -> Any:
    from transformers import AutoModelForCausalLM

    policy = policy or precision_policy(spec, device.type)
    kwargs: dict[str, Any] = {"dtype": policy.weights}
    quant = bnb_config(spec.quantization, policy.compute)
    if quant is not None:
        if spec.quantization == "8bit":
            _quiet_8bit_casts()
        kwargs.update(quantization_config=quant, device_map={"": str(device)})
    model = _from_pretrained(AutoModelForCausalLM, source, spec, "model", **kwargs)
    if quant is None:
        model.to(device)
    if spec.quantization == "4bit":
        # On AVX512-BF16 CPUs bitsandbytes repacks 4-bit weights during the first no-grad eval forward and
        # from then on uses a kernel without autograd, which silently drops gradients through the base layers
        # (LoRA below the top layer would train on wrong gradients). Keep the differentiable layout.
        for module in model.modules():
            if hasattr(module, "support_avx512bf16_for_cpu"):
                module.support_avx512bf16_for_cpu = False
    if spec.quantization != "none" and not _quantized_layers(model):
        logger.warning(
            "quantization=%s: no layer of %s was quantized (bitsandbytes replaces linear layers only), "
            "so the model stays in full precision",
            spec.quantization, source,
        )  # fmt: skip
    if spec.lora is not None:
        model.requires_grad_(False)  # the base is frozen; peft adds the trainable adapters below
    if spec.gradient_checkpointing:
        # transformers 5's name for gradient_checkpointing_enable(gradient_checkpointing_kwargs=...)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
        # Checkpointing only acts in train mode, so train() is used for gradient passes; dropout must then be
        # off to keep the scored and trained functions identical.
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    if spec.lora is not None:
        from peft import get_peft_model

        torch.manual_seed(spec.seed)  # adapter initialization
        model = get_peft_model(model, lora_config(spec.lora))
    return model.eval()


def _stop_ids(tokenizer: Any, model: Any) -> tuple[int, ...]:
    ids = [tokenizer.eos_token_id]
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for i in extra if isinstance(extra, list | tuple) else [extra]:
        if isinstance(i, int) and i not in ids and i < len(tokenizer):
            ids.append(i)
    return tuple(ids)


def lora_config(lora: LoraSpec) -> Any:
    """The peft ``LoraConfig`` of a `LoraSpec` (causal LM task): its four fields, ``bias: none`` unless set,
    and every other peft field of ``lora.extra`` (``use_rslora``, ``use_dora``, ``modules_to_save``...).

    Raises:
        AgentSpecError: peft refuses the combination (its ``__post_init__`` checks), naming the fields.
    """
    from peft import LoraConfig

    targets = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    extra = {"bias": "none", **thaw(lora.extra)}
    try:
        return LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=targets,
            task_type="CAUSAL_LM",
            **extra,
        )
    except (TypeError, ValueError) as exc:
        raise AgentSpecError(
            f"lora = {lora.to_dict()!r} is not allowed by peft's LoraConfig: {exc}", key="lora"
        ) from None


def bnb_config(quantization: str, compute_dtype: Any) -> Any:
    """The transformers ``BitsAndBytesConfig`` for ``4bit`` (nf4, double quant) or ``8bit``; None for none."""
    choice("quantization", quantization, QUANTIZATIONS)
    if quantization == "none":
        return None
    from transformers import BitsAndBytesConfig

    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
    )


def build_agent(spec: AgentSpec, source: str, tokenizer_source: str | None = None) -> Agent:
    """Loads tokenizer and model (+ LoRA, + 4/8-bit) from ``source`` into an `Agent` on ``spec.device``.

    Args:
        spec: The agent spec.
        source: A model directory or hub id (already resolved).
        tokenizer_source: Where the tokenizer comes from; None = ``source``.

    Raises:
        AgentLoadError: An unloadable model or tokenizer (the message says how to fix it).
    """
    device = resolve_device(spec.device)
    if spec.lora is None and spec.dtype in ("bfloat16", "float16"):
        logger.warning(
            "agent %s: full fine-tuning with %s weights: AdamW updates below %s's resolution round away "
            "(at lr 1e-6 most of them); dtype: auto keeps float32 master weights with bf16 autocast on CUDA",
            spec.display_name, spec.dtype, spec.dtype,
        )  # fmt: skip
    tokenizer = _load_tokenizer(spec, tokenizer_source or source)
    policy = precision_policy(spec, device.type)
    model = build_model(spec, source, device, policy)
    # the frozen KL reference of a full fine-tune never trains: on CUDA it can hold bf16 weights
    reference = dataclasses.replace(policy, weights=policy.reference, autocast=None)
    gen_cap = getattr(getattr(model, "generation_config", None), "max_new_tokens", None)
    agent = Agent(
        name=spec.display_name,
        spec=spec,
        model=model,
        tokenizer=tokenizer,
        device=device,
        eos_token_id=int(tokenizer.eos_token_id),
        pad_token_id=int(tokenizer.pad_token_id),
        stop_token_ids=_stop_ids(tokenizer, model),
        max_new_tokens=spec.max_new_tokens or gen_cap or DEFAULT_MAX_NEW_TOKENS,
        source=source,
        reference_loader=functools.partial(build_model, spec, source, device, reference),
    )
    n_train = sum(p.numel() for p in agent.trainable_parameters())
    logger.info(
        "loaded agent %s from %s on %s (%d trainable parameters)", agent.name, source, device, n_train
    )
    return agent
