"""Calling one reward function of ``task.rewards``: import it by name, pass what it asks for, check its value.

Shared by the trainer's process (the config check, the built-in functions) and the bounded worker processes
that run your own functions (`workbench.tasks.verifier`), so both call a function the same way:

- ``import_function("package.module:function")`` imports it (the project root is tried too, so a module
  beside the notebooks' parent folder is found from a kernel running in ``notebooks/``);
- `call_term` calls it with the completion first and, as keyword arguments, every column of the item it
  accepts (all of them when it takes ``**kwargs``, as TRL's reward functions do);
- `term_value` turns what it returned into a float, or None (not applicable, as in TRL); anything else (a
  string, NaN, infinity) raises `TermValueError` naming what came back.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import numbers
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from workbench.core.env import PROJECT_ROOT

__all__ = ["CUSTOM_FUNCTION", "TermValueError", "call_term", "import_function", "import_module", "term_value"]

CUSTOM_FUNCTION = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
"""A function named as ``package.module:function``."""


class TermValueError(ValueError):
    """A reward function returned something that is not a number, a bool or None (or a non-finite number)."""


def import_module(name: str) -> Any:
    """Import ``name``; on failure retry with the project root on ``sys.path`` (a notebook's kernel runs in
    ``notebooks/``, where a module of the project root is not importable)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name.split(".")[0] or str(PROJECT_ROOT) in sys.path:
            raise
        sys.path.append(str(PROJECT_ROOT))
        return importlib.import_module(name)


@functools.cache
def import_function(spec: str, field: str = "task.rewards[i].fn") -> Callable[..., Any]:
    """The function named by ``package.module:function``.

    Raises:
        ValueError: Not such a name, a module that does not import, or no such function (names ``field``).
    """
    if not isinstance(spec, str) or not CUSTOM_FUNCTION.match(spec):
        raise ValueError(f"{field} = {spec!r} is not allowed: 'package.module:function'")
    module_name, attr = spec.split(":")
    try:
        module = import_module(module_name)
    except Exception as exc:  # any import-time failure of the user's module is a config error
        raise ValueError(
            f"{field} = {spec!r}: module {module_name!r} does not import ({type(exc).__name__}: {exc}); "
            "it must be importable from the working directory, the project root or an installed package"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        found = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise ValueError(
            f"{field} = {spec!r}: {module_name} has no function {attr!r}; its functions: {found}"
        )
    return fn


@functools.cache
def _accepted(fn: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword arguments ``fn`` takes besides its first; None when it takes ``**kwargs`` (all of them)."""
    params = list(inspect.signature(fn).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params[1:] if p.kind is not inspect.Parameter.VAR_POSITIONAL)


def call_term(fn: Callable[..., Any], completion: str, columns: Mapping[str, Any]) -> float | None:
    """``fn(completion, **columns it accepts)`` as a float or None (`term_value`).

    Raises:
        TermValueError: It returned something else.
        Exception: Whatever ``fn`` raised.
    """
    accepted = _accepted(fn)
    kwargs = dict(columns) if accepted is None else {k: v for k, v in columns.items() if k in accepted}
    return term_value(fn(completion, **kwargs))


def term_value(value: Any) -> float | None:
    """A reward function's value: None stays None (not applicable), a bool or real number becomes a float.

    Raises:
        TermValueError: Anything else, or NaN / infinity (named, with its type).
    """
    if value is None:
        return None
    if isinstance(value, bool | numbers.Real):
        number = float(value)
        if not math.isfinite(number):
            raise TermValueError(f"returned {value!r}: rewards must be finite (or None: not applicable)")
        return number
    raise TermValueError(
        f"returned {value!r} ({type(value).__name__}): a reward is a float, an int, a bool, or None "
        "(not applicable)"
    )
