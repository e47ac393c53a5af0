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

from workbench.config.checks import (
    ConfigError,
    FrozenMap,
    freeze,
    reject_unknown,
    suggestion,
    thaw,
    unknown_key_problems,
)
from workbench.config.peft_fields import SET_BY_WORKBENCH, lora_fields, value_problem
from workbench.config.sections import LR_SCHEDULES

QUANTIZATIONS = ("none", "4bit", "8bit")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEFAULT_PROMPT_TEMPLATE = "Q: {content}\nA: "
"""Plain prompt format for tokenizers without a chat template (all tiny agents use it)."""


NO_EXTRA = FrozenMap()
"""No peft field besides the four of `LoraSpec`."""


class AgentSpecError(ConfigError):
    """A bad agent spec: the message names the field, the value and what is allowed (``key``: the field)."""


def _bad(key: str, value: Any, allowed: str) -> AgentSpecError:
    return AgentSpecError(f"{key} = {value!r} is not allowed: {allowed}", key=key)


@dataclass(frozen=True)
class LoraSpec:
    """LoRA adapter settings (peft ``LoraConfig``): the four below and any other field of ``LoraConfig``."""

    r: int = 16
    """Adapter rank (>= 1)."""
    alpha: float = 32.0
    """Scaling numerator: the update is scaled by ``alpha / r`` (``alpha / sqrt(r)`` with ``use_rslora``)."""
    dropout: float = 0.0
    """Adapter dropout. The workbench scores and trains in eval mode (see
    `workbench.agents.generation.rollout`), so this only matters with gradient checkpointing; keep 0 for exact
    on-policy ratios."""
    target_modules: tuple[str, ...] | str = "all-linear"
    """Module names to adapt, or ``"all-linear"`` (every linear layer but the output head)."""
    extra: FrozenMap = NO_EXTRA
    """Any other field of peft's ``LoraConfig``, written beside the four above under its peft name
    (``use_rslora: true``, ``use_dora: true``, ``modules_to_save: [lm_head]``, ``layers_to_transform: [0]``,
    ``bias: lora_only``, ``init_lora_weights: gaussian``...): checked against peft's dataclass when the
    config loads (`workbench.config.peft_fields`) and by peft itself before any model loads. Not
    ``lora_alpha`` / ``lora_dropout`` (they are ``alpha`` / ``dropout``) nor ``task_type``."""

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, list):  # YAML lists: a tuple keeps the spec hashable
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
        if not isinstance(self.extra, FrozenMap):
            object.__setattr__(self, "extra", freeze(dict(self.extra)))
        self.validate()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoraSpec:
        """Builds and validates a LoRA spec from a mapping (YAML): the four fields, and every other key as a
        peft ``LoraConfig`` field (`lora_problems`).

        Raises:
            AgentSpecError: The first problem of `lora_problems`, or a bad value.
        """
        if not isinstance(data, dict):
            raise AgentSpecError(f"lora: expected a mapping of LoRA settings or null, got {data!r}")
        problems = lora_problems(data)
        if problems:
            raise AgentSpecError(problems[0], key="lora")
        own = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        extra = {k: v for k, v in data.items() if k not in own}
        return cls(**{k: v for k, v in data.items() if k in own}, extra=FrozenMap(extra))

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form: the four fields, then the peft fields of ``extra`` beside them."""
        targets = self.target_modules
        data = {"r": self.r, "alpha": self.alpha, "dropout": self.dropout}
        data["target_modules"] = targets if isinstance(targets, str) else list(targets)
        return data | thaw(self.extra)

    def validate(self) -> None:
        """Raises `AgentSpecError` on an out-of-range value."""
        if not isinstance(self.r, int) or isinstance(self.r, bool) or self.r < 1:
            raise _bad("lora.r", self.r, "an integer >= 1")
        if not isinstance(self.alpha, int | float) or self.alpha <= 0:
            raise _bad("lora.alpha", self.alpha, "a number > 0")
        if not isinstance(self.dropout, int | float) or not 0.0 <= self.dropout < 1.0:
            raise _bad("lora.dropout", self.dropout, "a number in [0, 1)")
        targets = self.target_modules
        if not (isinstance(targets, str) or (targets and all(isinstance(t, str) for t in targets))):
            raise _bad("lora.target_modules", targets, "'all-linear' or a non-empty list of names")
        problems = lora_problems(dict(self.extra), extra_only=True)
        if problems:
            raise AgentSpecError(problems[0], key="lora")


def lora_problems(data: dict[str, Any], *, extra_only: bool = False) -> list[str]:
    """Every key of a ``lora:`` mapping that is neither a `LoraSpec` field nor a field of peft's
    ``LoraConfig`` (with a "did you mean"), every peft field the workbench sets itself, and every value that
    does not fit its peft annotation; ``extra_only``: ``data`` holds only the peft fields."""
    own = [] if extra_only else [f.name for f in dataclasses.fields(LoraSpec) if f.name != "extra"]
    fields = lora_fields()
    problems = []
    for key, value in data.items():
        if key in own:
            continue
        if key in SET_BY_WORKBENCH:
            hint = suggestion(key, own, "lora")
            problems.append(
                f"lora.{key} is not allowed: {SET_BY_WORKBENCH[key]}" + (f"; {hint}" if hint else "")
            )
        elif fields is None:
            continue  # peft's source is not readable here: peft checks the field when the agent loads
        elif key not in fields:
            valid = own + sorted(set(fields) - set(SET_BY_WORKBENCH) - set(own))
            problems += unknown_key_problems({key: value}, valid, "lora")
        elif problem := value_problem(f"lora.{key}", thaw(value), fields[key]):
            problems.append(problem)
    return problems


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
    bf16 autocast for full fine-tuning (`workbench.agents.plan.shapes.resolve_dtype`)."""
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
    top_k: int = 0
    """Sample among the k most likely tokens only (training rollouts and the sampled evaluation); 0 = off."""
    min_p: float = 0.0
    """Sample only tokens at least ``min_p`` times as likely as the most likely one, in [0, 1); 0 = off."""
    repetition_penalty: float = 1.0
    """Logits of tokens already in the prompt or the response are divided by it (multiplied when negative),
    as transformers' ``RepetitionPenaltyLogitsProcessor``, greedy decoding included; 1 = off. Like top-p,
    top-k and min-p it shapes what is sampled only: importance ratios are of softmax(logits / T)."""
    stop_strings: tuple[str, ...] = ()
    """A response ends at the first of these texts (finish reason ``stop``); its text and its trained token
    ids both end before the token in which it begins, so what is graded is exactly what is trained on."""
    lr: float | None = None
    """This agent's AdamW learning rate; None = ``train.lr``."""
    lr_schedule: str | None = None
    """This agent's learning-rate schedule (`LR_SCHEDULES`); None = ``train.lr_schedule``."""
    seed: int = 0
    """Seed of LoRA initialization (a tiny preset's build uses the preset's own seed)."""
    trust_remote_code: bool = False
    """Passed to ``from_pretrained`` for hub models with custom code."""

    def __post_init__(self) -> None:
        if isinstance(self.lora, dict):
            object.__setattr__(self, "lora", LoraSpec.from_dict(self.lora))
        if isinstance(self.stop_strings, list):
            object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
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
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["lora"] = self.lora.to_dict() if self.lora is not None else None
        data["stop_strings"] = list(self.stop_strings)
        if self.chat_template_kwargs is not None:
            data["chat_template_kwargs"] = thaw(self.chat_template_kwargs)
        return data

    def validate(self) -> None:
        """Raises `AgentSpecError` naming the field, the value and what is allowed (``key``: the field)."""
        if not isinstance(self.model, str) or not self.model.strip():
            raise _bad("model", self.model, "a non-empty model name or path")
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise _bad("name", self.name, "a non-empty string or null")
        choice("quantization", self.quantization, QUANTIZATIONS)
        choice("dtype", self.dtype, DTYPES)
        choice("compute_dtype", self.compute_dtype, DTYPES)
        if self.lora is not None:
            if not isinstance(self.lora, LoraSpec):
                raise _bad("lora", self.lora, "a LoraSpec, a mapping or null")
            self.lora.validate()
        if self.quantization != "none" and self.lora is None:
            raise AgentSpecError(
                f"quantization = {self.quantization!r} needs lora: quantized weights cannot be fully "
                "fine-tuned; add a 'lora' mapping or set quantization: none",
                key="quantization",
            )
        if not _number(self.temperature) or self.temperature < 0:
            raise _bad("temperature", self.temperature, "a number >= 0")
        if not _number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise _bad("top_p", self.top_p, "a number in (0, 1]")
        mnt = self.max_new_tokens
        if mnt is not None and (not isinstance(mnt, int) or isinstance(mnt, bool) or mnt < 1):
            raise _bad("max_new_tokens", mnt, "an integer >= 1 or null")
        self._validate_prompting()
        self._validate_sampling()
        if not isinstance(self.device, str) or not (
            self.device in ("auto", "cpu", "cuda", "mps") or self.device.startswith("cuda:")
        ):
            raise _bad("device", self.device, "auto, cpu, cuda, cuda:N or mps")

    def _validate_prompting(self) -> None:
        if not isinstance(self.prompt_template, str) or "{content}" not in self.prompt_template:
            raise _bad("prompt_template", self.prompt_template, "a string containing '{content}'")
        if self.system is not None and not isinstance(self.system, str):
            raise _bad("system", self.system, "a string or null")
        kwargs = self.chat_template_kwargs
        if kwargs is not None and not (
            isinstance(kwargs, FrozenMap) and "add_generation_prompt" not in kwargs
        ):
            raise _bad(
                "chat_template_kwargs",
                kwargs,
                "a mapping of apply_chat_template keywords (add_generation_prompt is always true) or null",
            )
        if self.chat_template not in (None, True, False):
            raise _bad("chat_template", self.chat_template, "true, false or null")

    def _validate_sampling(self) -> None:
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise _bad("top_k", self.top_k, "an integer >= 0 (0 = off)")
        if not _number(self.min_p) or not 0.0 <= self.min_p < 1.0:
            raise _bad("min_p", self.min_p, "a number in [0, 1) (0 = off)")
        if not _number(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise _bad("repetition_penalty", self.repetition_penalty, "a number > 0 (1 = off)")
        stops = self.stop_strings
        if not isinstance(stops, tuple) or not all(isinstance(t, str) and t for t in stops):
            raise _bad("stop_strings", stops, "a list of non-empty strings")
        if len(set(stops)) != len(stops):
            raise _bad("stop_strings", list(stops), "each string once")
        if self.lr is not None and (not _number(self.lr) or self.lr <= 0):
            raise _bad("lr", self.lr, "a number > 0, or null (train.lr)")
        if self.lr_schedule is not None and self.lr_schedule not in LR_SCHEDULES:
            raise _bad(
                "lr_schedule", self.lr_schedule, f"one of {list(LR_SCHEDULES)}, or null (train.lr_schedule)"
            )

    @property
    def display_name(self) -> str:
        """``name``, or the last part of ``model`` (``tiny:gpt2-char`` -> ``gpt2-char``)."""
        return self.name or self.model.rstrip("/").split(":")[-1].split("/")[-1]


def choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    """Raises `AgentSpecError` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise _bad(key, value, f"one of {list(allowed)}")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def as_spec(spec: AgentSpec | dict[str, Any] | str, name: str | None = None) -> AgentSpec:
    """Normalizes a spec, a mapping of its fields or a bare model string to an `AgentSpec`."""
    if isinstance(spec, str):
        spec = AgentSpec(model=spec)
    elif isinstance(spec, dict):
        spec = AgentSpec.from_dict(spec)
    elif not isinstance(spec, AgentSpec):
        raise AgentSpecError(f"agent spec: expected an AgentSpec, a mapping or a model string, got {spec!r}")
    return dataclasses.replace(spec, name=name) if name is not None else spec
