"""Validation helpers of the config dataclasses: type coercion and range checks with naming messages.

Every config dataclass calls :func:`coerce_fields` and :func:`require` from its ``__post_init__``, so a bad
value is caught however the object is made (``from_dict``, the constructor, ``dataclasses.replace``) and the
message names the key, the value and what is allowed.

Coming from TRL: `TRL_NAMES` is the one table of where each `GRPOConfig` setting lives here: a TRL (or peft,
transformers ``TrainingArguments``) name, the workbench key that does the same (empty when nothing does), and
a note. `suggestion` reads it, and ``difflib`` for near names, so that an unknown key in any section names the
key meant; ``docs/config.md`` renders it as its "Coming from TRL" table (`workbench.config.reference`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "NAME_PATTERN",
    "TRL_NAMES",
    "ConfigError",
    "FrozenMap",
    "build",
    "coerce",
    "coerce_fields",
    "freeze",
    "reject_unknown",
    "require",
    "require_name",
    "suggestion",
    "thaw",
    "unknown_key_problems",
]


# An immutable mapping for config values (task knobs, the switches that define an ablation). A frozen
# dataclass is only as immutable as its fields: a ``dict`` inside it can still change after validation and
# makes the config unhashable. `FrozenMap` is a read-only ``Mapping`` (so ``**knobs`` still works) that
# hashes, pickles and compares equal to a ``dict`` with the same items. `freeze` turns plain YAML data into it
# (lists become tuples, mappings `FrozenMap`); `thaw` turns it back into plain YAML data.

_SCALARS = (str, int, float, bool, type(None))


class FrozenMap(Mapping[str, Any]):
    """A read-only, hashable, picklable mapping of str keys to frozen YAML values.

    Args:
        data: A mapping (or ``FrozenMap``) of str keys; nested lists become tuples, nested mappings
            ``FrozenMap``.

    Raises:
        TypeError: A non-str key, or a value that is not YAML data (names its key path).
    """

    __slots__ = ("_items",)

    def __init__(self, data: Mapping[str, Any] | None = None, /) -> None:
        items = {} if data is None else data
        if not isinstance(items, Mapping):
            raise TypeError(f"expected a mapping, got {type(items).__name__} {items!r}")
        object.__setattr__(self, "_items", {k: freeze(v, str(k)) for k, v in _str_keys(items).items()})

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"FrozenMap is immutable: cannot set {name!r}")

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
        return (FrozenMap, (self._items,))

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"


def _str_keys(items: Mapping[Any, Any]) -> Mapping[str, Any]:
    bad = [k for k in items if not isinstance(k, str)]
    if bad:
        raise TypeError(f"keys must be str, got {bad[0]!r} ({type(bad[0]).__name__})")
    return items


def freeze(value: Any, where: str = "value") -> Any:
    """Plain YAML data made immutable: mappings → `FrozenMap`, lists and tuples → tuples, scalars as is.

    Raises:
        TypeError: A value that YAML cannot represent (names ``where`` and the value).
    """
    if isinstance(value, (FrozenMap, *_SCALARS)):
        return value
    if isinstance(value, Mapping):
        return FrozenMap(value)
    if isinstance(value, list | tuple):
        return tuple(freeze(v, f"{where}[{i}]") for i, v in enumerate(value))
    raise TypeError(
        f"{where} = {value!r} is not allowed: a str, number, bool, null, list or mapping "
        f"(got {type(value).__name__})"
    )


def thaw(value: Any) -> Any:
    """The inverse of `freeze`: `FrozenMap` → dict, tuples → lists (what ``yaml.safe_dump`` writes); a
    dataclass instance (a ``task.rewards`` entry) becomes the mapping of its fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: thaw(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value


NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
"""Names that become directory names or metric-key segments: letters, digits and ``_.+-``."""
_TYPE_NAMES = {FrozenMap: "a mapping"}
_FLOAT_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


class ConfigError(ValueError):
    """A config key, value or path is wrong; the message names it and what is allowed.

    Args:
        message: The paragraph shown to the user.
        key: The dotted key at fault (``train.lr``), when one is (lets `workbench.config.experiment` report
            every mistake of a config in one pass).
    """

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def require(condition: bool, key: str, value: Any, allowed: str) -> None:
    """Raise :class:`ConfigError` ``"<key> = <value> is not allowed: <allowed>"`` unless ``condition``."""
    if not condition:
        raise ConfigError(f"{key} = {value!r} is not allowed: {allowed}", key=key)


def reject_unknown(
    data: Mapping[str, Any], cls: type, section: str = "", error: type[Exception] = ConfigError
) -> None:
    """Raise ``error`` naming the first key of ``data`` that is no field of the dataclass ``cls``, and the
    valid keys; ``section`` says where the keys sit (``train``, ``lora``; empty: the top level)."""
    problems = unknown_key_problems(data, cls, section)
    if problems:
        raise error(problems[0])


def unknown_key_problems(data: Mapping[str, Any], cls: type | list[str], section: str = "") -> list[str]:
    """One message per key of ``data`` that is no field of the dataclass ``cls`` (or not in a list of valid
    names): the valid keys, and a "did you mean" for a near name or a TRL name
    (`suggestion`)."""
    valid = cls if isinstance(cls, list) else [f.name for f in dataclasses.fields(cls)]
    problems = []
    for name in sorted(set(data) - set(valid), key=str):
        key = f"{section}.{name}" if section else repr(name)
        where = f"valid keys of {section!r}" if section else "valid top-level keys"
        hint = suggestion(str(name), valid, section)
        problems.append(f"unknown key {key}; {where}: {valid}" + (f"; {hint}" if hint else ""))
    return problems


def require_name(key: str, value: str, why: str) -> None:
    """``value`` must match :data:`NAME_PATTERN` (``why`` says where the name ends up)."""
    require(bool(NAME_PATTERN.fullmatch(value)), key, value, f"letters, digits and _.+- ({why})")


def coerce(where: str, value: Any, annotation: Any) -> Any:
    """``value`` as the annotated type where lossless (int → float, ``"1e-4"`` → float), else ConfigError.

    Understands ``bool``, ``int``, ``float``, ``str``, ``X | None``, ``tuple[X, ...]`` of those scalars
    (a list or tuple, each element coerced) and ``FrozenMap`` (any mapping of YAML data is frozen); other
    annotations pass the value through.
    """
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for arg in options:
            try:
                return coerce(where, value, arg)
            except ConfigError as exc:
                errors.append(exc)
        if len(options) == 1 and isinstance(value, Mapping | list | tuple):
            raise errors[0]  # a mapping or list with a bad value inside: that message names it
        names = [_type_name(a) for a in options]
        names += ["null"] if type(None) in args else []
        raise ConfigError(
            f"{where}: expected {' or '.join(names)}, got {type(value).__name__} {value!r}", key=where
        )
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis and args[0] in (int, float, str, bool):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}", key=where)
        return tuple(coerce(f"{where}[{i}]", v, args[0]) for i, v in enumerate(value))
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is float and isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip()):
        return float(value)  # PyYAML reads "1e-4" (no dot) as a string; users write it anyway
    if annotation in (int, float, str, bool):
        if type(value) is not annotation:
            raise ConfigError(
                f"{where}: expected {annotation.__name__}, got {type(value).__name__} {value!r}", key=where
            )
        return value
    if annotation is FrozenMap:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}", key=where)
        try:
            return FrozenMap(value)
        except TypeError as exc:
            raise ConfigError(f"{where}: {exc}", key=where) from None
    return value


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is tuple:
        return "a list"
    return _TYPE_NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def coerce_fields(obj: Any, section: str) -> None:
    """Coerce every field of the frozen dataclass ``obj`` to its annotation, in place (``section.field``)."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        coerced = coerce(f"{section}.{f.name}" if section else f.name, value, hints[f.name])
        if coerced is not value:
            object.__setattr__(obj, f.name, coerced)


def build(name: str, cls: type, data: Any) -> Any:
    """A section dataclass from ``data``: an instance as is, a mapping of its fields, or None (defaults).

    Raises:
        ConfigError: ``data`` is not a mapping, or holds an unknown key (the message lists the valid ones).
    """
    if data is None:
        return cls()
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{name}: expected a mapping of settings, got {data!r}")
    reject_unknown(data, cls, name)
    return cls(**data)


# Coming from TRL: where each setting lives here, and the "did you mean" of an unknown key.

TRL_NAMES: dict[str, tuple[str, str]] = {
    "learning_rate": ("train.lr", "or `agents[i].lr` for one agent"),
    "lr_scheduler_type": (
        "train.lr_schedule",
        "`constant`, `linear` or `cosine`, stepped once per training step",
    ),
    "warmup_steps": ("train.warmup_steps", "in training steps"),
    "warmup_ratio": ("train.warmup_ratio", "of `train.steps`"),
    "num_generations": ("train.group_size", "G, responses per agent per prompt"),
    "max_completion_length": ("train.max_new_tokens", ""),
    "max_steps": ("train.steps", ""),
    "num_train_epochs": ("train.steps", "steps cycle through `task.train_size` problems"),
    "per_device_train_batch_size": ("train.prompts_per_step", "prompts, not completions: G each"),
    "generation_batch_size": ("train.prompts_per_step", "prompts per step"),
    "steps_per_generation": ("train.minibatch_prompts", "optimizer steps per step = prompts / mini-batch"),
    "gradient_accumulation_steps": ("train.micro_batch_size", "micro-batches are cut to this size"),
    "max_grad_norm": ("train.grad_clip", ""),
    "beta": ("train.kl_coef", "low_var_kl on the learner's own samples"),
    "epsilon": ("hacpo.eps_low", "GSPO's sequence-level clip"),
    "epsilon_high": ("hacpo.eps_high", ""),
    "mask_truncated_completions": ("train.mask_truncated", ""),
    "scale_rewards": ("hacpo.normalize_by_std", "true = divide by the group's std"),
    "importance_sampling_level": ("algorithm", "`gspo` is sequence-level, `grpo` token-level"),
    "loss_type": ("algorithm", "losses are seq-mean-token-mean (`docs/hacpo.md`)"),
    "reward_funcs": ("task.rewards", "a list of `{fn, weight}`"),
    "reward_weights": ("task.rewards", "each entry's `weight`"),
    "generation_kwargs": ("agents[i].top_k", "and `min_p`, `repetition_penalty`, `stop_strings` per agent"),
    "top_k": ("agents[i].top_k", ""),
    "min_p": ("agents[i].min_p", ""),
    "repetition_penalty": ("agents[i].repetition_penalty", ""),
    "stop": ("agents[i].stop_strings", "vLLM's name"),
    "lora_alpha": ("agents[i].lora.alpha", "peft's name"),
    "lora_dropout": ("agents[i].lora.dropout", "peft's name"),
    "lora_r": ("agents[i].lora.r", ""),
    "lora_target_modules": ("agents[i].lora.target_modules", ""),
    "model_name_or_path": ("agents[i].model", ""),
    "gradient_checkpointing": ("agents[i].gradient_checkpointing", ""),
    "output_dir": ("output.root", ""),
    "report_to": ("output.report_to", ""),
    "save_steps": ("train.save_every", ""),
    "save_total_limit": ("train.keep_checkpoints", ""),
    "eval_steps": ("train.eval_every", ""),
    "dataset_name": ("task.source", ""),
    "num_iterations": ("", "one update pass over each step's batch (μ = 1)"),
    "use_vllm": ("train.engine", "`vllm`: a server per agent, weights reloaded each step (`docs/engine.md`)"),
    "logging_steps": ("", "every step is logged"),
}
"""TRL name -> (workbench key, note); an empty key: nothing here does the same (the note says why)."""


def suggestion(name: str, valid: Sequence[str], section: str = "") -> str:
    """ "did you mean ..." for an unknown key ``name`` of ``section`` (its ``valid`` keys), or "".

    A TRL name points at its workbench key (or says that nothing does); otherwise the nearest valid key of
    the section, when one is close (``difflib``, cutoff 0.75).
    """
    if name in TRL_NAMES:
        target, note = TRL_NAMES[name]
        if not target:
            return f"TRL's {name} has no counterpart here: {note}"
        return f"did you mean {target} (TRL's {name}{': ' + note if note else ''})?"
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.75)
    if close:
        return f"did you mean {section + '.' if section else ''}{close[0]}?"
    return ""
