"""Validation helpers of the config dataclasses: type coercion and range checks with naming messages.

Every config dataclass calls :func:`coerce_fields` and :func:`require` from its ``__post_init__``, so a bad
value is caught however the object is made (``from_dict``, the constructor, ``dataclasses.replace``) and the
message names the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from workbench.config.frozen import FrozenMap
from workbench.config.trl import suggestion

__all__ = [
    "NAME_PATTERN",
    "ConfigError",
    "build",
    "coerce",
    "coerce_fields",
    "reject_unknown",
    "require",
    "require_name",
    "unknown_key_problems",
]

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
"""Names that become directory names or metric-key segments: letters, digits and ``_.+-``."""
_TYPE_NAMES = {FrozenMap: "a mapping"}
_FLOAT_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


class ConfigError(ValueError):
    """A config key, value or path is wrong; the message names it and what is allowed.

    Args:
        message: The paragraph shown to the user.
        key: The dotted key at fault (``train.lr``), when one is (lets `workbench.config.problems` report
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
    (`workbench.config.trl.suggestion`)."""
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
