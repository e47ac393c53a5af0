"""Agent specs and their translation to peft / bitsandbytes configs (pure functions, no model loading).

An agent spec is a frozen dataclass, also written as a YAML mapping in an experiment file:

```yaml
agents:
  - name: smol
    model: smollm2-135m-instruct      # embedded name, tiny:<preset>, local directory or hub id
    lora: {r: 16, alpha: 32, target_modules: [q_proj, k_proj, v_proj, o_proj]}
    quantization: 4bit                # none | 4bit | 8bit (bitsandbytes; needs lora)
    temperature: 1.0
    max_new_tokens: 256
```

`lora_config` and `bnb_config` turn a spec into the peft / transformers objects; they import those
libraries lazily so that reading a spec stays cheap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workbench.config.checks import reject_unknown
from workbench.config.frozen import FrozenMap, freeze, thaw

QUANTIZATIONS = ("none", "4bit", "8bit")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEFAULT_PROMPT_TEMPLATE = "Q: {content}\nA: "
"""Plain prompt format for tokenizers without a chat template (all tiny agents use it)."""


class AgentSpecError(ValueError):
    """A bad agent spec: the message names the field, the value and what is allowed."""


@dataclass(frozen=True)
class LoraSpec:
    """LoRA adapter settings (peft ``LoraConfig``)."""

    r: int = 16
    """Adapter rank (>= 1)."""
    alpha: float = 32.0
    """Scaling numerator: the update is scaled by ``alpha / r``."""
    dropout: float = 0.0
    """Adapter dropout. The workbench scores and trains in eval mode (see `workbench.agents.rollout`), so
    this only matters with gradient checkpointing; keep 0 for exact on-policy ratios."""
    target_modules: tuple[str, ...] | str = "all-linear"
    """Module names to adapt, or ``"all-linear"`` (every linear layer but the output head)."""

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, list):  # YAML lists: a tuple keeps the spec hashable
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
        self.validate()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoraSpec:
        """Builds and validates a LoRA spec from a mapping (YAML); unknown keys raise `AgentSpecError`."""
        if not isinstance(data, dict):
            raise AgentSpecError(f"lora: expected a mapping of LoRA settings or null, got {data!r}")
        reject_unknown(data, cls, "lora", AgentSpecError)
        return cls(**data)

    def validate(self) -> None:
        """Raises `AgentSpecError` on an out-of-range value."""
        if not isinstance(self.r, int) or isinstance(self.r, bool) or self.r < 1:
            raise AgentSpecError(f"lora.r = {self.r!r} is not allowed: an integer >= 1")
        if not isinstance(self.alpha, int | float) or self.alpha <= 0:
            raise AgentSpecError(f"lora.alpha = {self.alpha!r} is not allowed: a number > 0")
        if not isinstance(self.dropout, int | float) or not 0.0 <= self.dropout < 1.0:
            raise AgentSpecError(f"lora.dropout = {self.dropout!r} is not allowed: a number in [0, 1)")
        targets = self.target_modules
        if not (isinstance(targets, str) or (targets and all(isinstance(t, str) for t in targets))):
            raise AgentSpecError(
                f"lora.target_modules = {targets!r} is not allowed: 'all-linear' or a non-empty list of names"
            )


@dataclass(frozen=True)
class AgentSpec:
    """One agent: which model, how it is adapted and quantized, how it prompts and samples."""

    model: str
    """Embedded name (``smollm2-135m-instruct``), ``tiny:<preset>``, a local directory or a hub id."""
    name: str | None = None
    """Display name and metric key; None = derived from ``model``."""
    tokenizer: str | None = None
    """Tokenizer path or hub id; None = the model's own."""
    lora: LoraSpec | None = None
    """LoRA settings; None = full fine-tuning."""
    quantization: str = "none"
    """``none``, ``4bit`` (nf4, double quant) or ``8bit``, through bitsandbytes; needs ``lora``."""
    compute_dtype: str = "auto"
    """bitsandbytes compute dtype; ``auto`` = float32 on CPU (bf16 is ~20x slower there), bfloat16 on CUDA."""
    dtype: str = "auto"
    """Weight dtype; ``auto`` = float32 on CPU; on CUDA bfloat16 for a LoRA base, float32 master weights under
    bf16 autocast for full fine-tuning (`workbench.agents.hf.resolve_dtype`)."""
    device: str = "auto"
    """``cpu``, ``cuda``, ``cuda:1``...; ``auto`` = ``cuda`` when available, else ``cpu``."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% more time)."""
    chat_template: bool | None = None
    """Use the tokenizer's chat template; None = when it has one, False = always the plain template."""
    system: str | None = None
    """System turn put before the user message when the chat template is used; None = the template's own
    default (SmolLM2's names the model; Qwen3's has none). Ignored by the plain template."""
    chat_template_kwargs: FrozenMap | None = None
    """Extra keywords of ``apply_chat_template`` (e.g. ``{enable_thinking: false}`` for Qwen3)."""
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE
    """Plain prompt format (must contain ``{content}``), used when no chat template applies."""
    temperature: float = 1.0
    """Sampling temperature when the agent generates on its own (0 = greedy); training runs use
    ``train.temperature`` and ``train.eval_temperature``."""
    top_p: float = 1.0
    """Nucleus sampling threshold in (0, 1]; training rollouts use ``train.top_p``, the sampled held-out
    evaluation this value."""
    max_new_tokens: int | None = None
    """Response cap; None = the model's generation config (tiny presets: 48), else 512. Training rollouts use
    ``train.max_new_tokens``; a shared response this agent re-encodes is cut at twice this cap."""
    seed: int = 0
    """Seed of LoRA initialization (a tiny preset's build uses the preset's own seed)."""
    trust_remote_code: bool = False
    """Passed to ``from_pretrained`` for hub models with custom code."""

    def __post_init__(self) -> None:
        if isinstance(self.lora, dict):
            object.__setattr__(self, "lora", LoraSpec.from_dict(self.lora))
        if isinstance(self.chat_template_kwargs, Mapping) and not isinstance(
            self.chat_template_kwargs, FrozenMap
        ):
            try:
                object.__setattr__(self, "chat_template_kwargs", freeze(dict(self.chat_template_kwargs)))
            except TypeError as exc:
                raise AgentSpecError(f"chat_template_kwargs: {exc}") from None
        self.validate()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentSpec:
        """Builds a spec from a mapping (one YAML ``agents`` entry).

        Raises:
            AgentSpecError: An unknown key (the message lists the valid keys) or a bad value.
        """
        if not isinstance(data, dict):
            raise AgentSpecError(f"agent spec: expected a mapping with a 'model' key, got {data!r}")
        reject_unknown(data, cls, "agent", AgentSpecError)
        if "model" not in data:
            raise AgentSpecError(f"agent spec {data!r} has no 'model': name a model to load")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (YAML-writable)."""
        data = dataclasses.asdict(self)
        if self.lora is not None and not isinstance(self.lora.target_modules, str):
            data["lora"]["target_modules"] = list(self.lora.target_modules)
        if self.chat_template_kwargs is not None:
            data["chat_template_kwargs"] = thaw(self.chat_template_kwargs)
        return data

    def validate(self) -> None:
        """Raises `AgentSpecError` naming the field, the value and what is allowed."""
        if not isinstance(self.model, str) or not self.model.strip():
            raise AgentSpecError(f"model = {self.model!r} is not allowed: a non-empty model name or path")
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise AgentSpecError(f"name = {self.name!r} is not allowed: a non-empty string or null")
        choice("quantization", self.quantization, QUANTIZATIONS)
        choice("dtype", self.dtype, DTYPES)
        choice("compute_dtype", self.compute_dtype, DTYPES)
        if self.lora is not None:
            if not isinstance(self.lora, LoraSpec):
                raise AgentSpecError(f"lora = {self.lora!r} is not allowed: a LoraSpec, a mapping or null")
            self.lora.validate()
        if self.quantization != "none" and self.lora is None:
            raise AgentSpecError(
                f"quantization = {self.quantization!r} needs lora: quantized weights cannot be fully "
                "fine-tuned; add a 'lora' mapping or set quantization: none"
            )
        if not isinstance(self.temperature, int | float) or self.temperature < 0:
            raise AgentSpecError(f"temperature = {self.temperature!r} is not allowed: a number >= 0")
        if not isinstance(self.top_p, int | float) or not 0.0 < self.top_p <= 1.0:
            raise AgentSpecError(f"top_p = {self.top_p!r} is not allowed: a number in (0, 1]")
        mnt = self.max_new_tokens
        if mnt is not None and (not isinstance(mnt, int) or isinstance(mnt, bool) or mnt < 1):
            raise AgentSpecError(f"max_new_tokens = {mnt!r} is not allowed: an integer >= 1 or null")
        if not isinstance(self.prompt_template, str) or "{content}" not in self.prompt_template:
            raise AgentSpecError(
                f"prompt_template = {self.prompt_template!r} is not allowed: "
                "a string containing '{content}'"
            )
        if self.system is not None and not isinstance(self.system, str):
            raise AgentSpecError(f"system = {self.system!r} is not allowed: a string or null")
        kwargs = self.chat_template_kwargs
        if kwargs is not None and not (
            isinstance(kwargs, FrozenMap) and "add_generation_prompt" not in kwargs
        ):
            raise AgentSpecError(
                f"chat_template_kwargs = {kwargs!r} is not allowed: a mapping of apply_chat_template "
                "keywords "
                "(add_generation_prompt is always true) or null"
            )
        if self.chat_template not in (None, True, False):
            raise AgentSpecError(
                f"chat_template = {self.chat_template!r} is not allowed: true, false or null"
            )
        if not isinstance(self.device, str) or not (
            self.device in ("auto", "cpu", "cuda", "mps") or self.device.startswith("cuda:")
        ):
            raise AgentSpecError(f"device = {self.device!r} is not allowed: auto, cpu, cuda, cuda:N or mps")

    @property
    def display_name(self) -> str:
        """``name``, or the last part of ``model`` (``tiny:gpt2-char`` -> ``gpt2-char``)."""
        return self.name or self.model.rstrip("/").split(":")[-1].split("/")[-1]


def choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise AgentSpecError(f"{key} = {value!r} is not allowed: one of {list(allowed)}")


def as_spec(spec: AgentSpec | dict[str, Any] | str, name: str | None = None) -> AgentSpec:
    """Normalizes a spec, a mapping of its fields or a bare model string to an `AgentSpec`."""
    if isinstance(spec, str):
        spec = AgentSpec(model=spec)
    elif isinstance(spec, dict):
        spec = AgentSpec.from_dict(spec)
    elif not isinstance(spec, AgentSpec):
        raise AgentSpecError(f"agent spec: expected an AgentSpec, a mapping or a model string, got {spec!r}")
    return dataclasses.replace(spec, name=name) if name is not None else spec
