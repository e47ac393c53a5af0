"""The fields of peft's ``LoraConfig``, read from peft's own source, so that an agent's ``lora:`` mapping is
checked against the dataclass of the installed peft without importing it (peft imports torch; reading a
config never does, ``tests/test_import_boundaries.py``).

`lora_fields` parses ``peft/tuners/lora/config.py`` with ``ast`` (the package is located, not imported) and
returns each field's annotation; `value_problem` checks a YAML value against it: ``bool``, ``int``,
``float``, ``str``, ``list[...]``, ``dict``, ``Optional``, ``Union``, ``X | Y`` and ``Literal[...]``. A
field typed by one of peft's own config classes (``EvaConfig``...) takes a mapping; peft's ``__post_init__``
checks the rest when the agent's ``LoraConfig`` is built, before any model loads
(`workbench.train.preflight`).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["SET_BY_WORKBENCH", "lora_fields", "value_problem"]

SET_BY_WORKBENCH = {
    "lora_alpha": "it is lora.alpha here",
    "lora_dropout": "it is lora.dropout here",
    "task_type": "the workbench trains causal LMs (CAUSAL_LM)",
    "peft_type": "the workbench sets it (LORA)",
    "inference_mode": "the workbench trains the adapters",
    "base_model_name_or_path": "the agent's model sets it",
    "revision": "the agent's model sets it",
    "auto_mapping": "peft sets it",
    "peft_version": "peft sets it",
}
"""peft fields an agent's ``lora:`` mapping may not set, and why."""


def _source() -> Path | None:
    spec = importlib.util.find_spec("peft")  # locates the package without importing it
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "tuners" / "lora" / "config.py"
    return path if path.is_file() else None


@functools.cache
def lora_fields() -> dict[str, ast.expr] | None:
    """``{field: annotation}`` of peft's ``LoraConfig`` (its own fields, not ``PeftConfig``'s); None when
    peft is not installed or its source does not hold the class."""
    path = _source()
    if path is None:
        return None
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "LoraConfig":
            return {
                n.target.id: n.annotation
                for n in node.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            }
    return None


_SCALARS = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}


def _matches(value: Any, node: ast.expr) -> bool:
    """Whether ``value`` (YAML data: lists are tuples here) fits the annotation ``node``; an annotation this
    does not know (one of peft's config classes) takes a mapping or null."""
    if isinstance(node, ast.Constant) and node.value is None:
        return value is None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _matches(value, node.left) or _matches(value, node.right)
    if isinstance(node, ast.Name):
        if node.id in _SCALARS:
            kinds = _SCALARS[node.id]
            return isinstance(value, kinds) and (node.id == "bool" or not isinstance(value, bool))
        if node.id in ("list", "tuple"):
            return isinstance(value, list | tuple)
        if node.id == "dict":
            return isinstance(value, Mapping)
        return value is None or isinstance(value, Mapping)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        outer = node.value.id
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if outer == "Optional":
            return value is None or _matches(value, args[0])
        if outer == "Union":
            return any(_matches(value, a) for a in args)
        if outer == "Literal":
            return any(_literal(value, a) for a in args)
        if outer in ("list", "tuple"):
            item = args[0]
            return isinstance(value, list | tuple) and (
                outer == "tuple" or all(_matches(v, item) for v in value)
            )
        if outer == "dict":
            return isinstance(value, Mapping)
    return True


def _literal(value: Any, node: ast.expr) -> bool:
    """``value`` equals the literal; a literal with a ``[placeholder]`` (``pissa_niter_[number of iters]``)
    takes any string with the text before it."""
    if not isinstance(node, ast.Constant):
        return False
    if isinstance(node.value, str) and "[" in node.value and isinstance(value, str):
        return value.startswith(node.value.split("[", 1)[0])
    return value == node.value and type(value) is type(node.value)


def value_problem(key: str, value: Any, annotation: ast.expr) -> str | None:
    """``"<key> = <value> is not allowed: <annotation> (peft LoraConfig.<field>)"``, or None when it fits."""
    if _matches(value, annotation):
        return None
    field = key.rsplit(".", 1)[-1]
    return f"{key} = {value!r} is not allowed: {ast.unparse(annotation)} (peft LoraConfig.{field})"
