"""The configuration reference, rendered from the config dataclasses' field docstrings (``docs/config.md``).

Every config field carries a one-line docstring right below it. Python does not keep
those strings at run time, so `field_docs` reads them from the class source with ``ast``; `render_reference`
turns every section into a Markdown table (key, default, meaning) in YAML spelling. ``tests/test_docs.py``
checks that ``docs/config.md`` is what this renders, so the reference cannot drift from the code::

    python -c "from workbench.config.reference import write_reference; write_reference()"
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import re
import textwrap
from pathlib import Path
from typing import Any

from workbench.config.agent_spec import AgentSpec, LoraSpec
from workbench.config.checks import TRL_NAMES
from workbench.config.experiment import ExperimentConfig
from workbench.config.reward_spec import RewardSpec
from workbench.config.sections import HacpoConfig, OutputConfig, RayConfig, TaskConfig, TrainConfig
from workbench.core.env import PROJECT_ROOT

__all__ = ["SECTIONS", "field_docs", "render_reference", "write_reference"]

SECTIONS: tuple[tuple[str, type], ...] = (
    ("(top level)", ExperimentConfig),
    ("agents[i]", AgentSpec),
    ("agents[i].lora", LoraSpec),
    ("task", TaskConfig),
    ("task.rewards[i]", RewardSpec),
    ("train", TrainConfig),
    ("hacpo", HacpoConfig),
    ("output", OutputConfig),
    ("ray", RayConfig),
)
"""Where each dataclass sits in an experiment YAML, in the order of the reference."""
REFERENCE = PROJECT_ROOT / "docs" / "config.md"
_KEY_LABELS = {(LoraSpec, "extra"): "(any other field of peft's `LoraConfig`)"}
"""Rows whose key is not written as such: `LoraSpec.extra` holds the peft fields written beside the four."""


def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` of a dataclass, from the string literal under each annotated field."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # the class statement's body
    docs = {}
    for node, after in itertools.pairwise(body):
        named = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        if named and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            docs[node.target.id] = inspect.cleandoc(str(after.value.value))
    return docs


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict) or hasattr(value, "items"):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return str(value) if value != "" else '""'


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return f"`{_yaml(f.default)}`"
    if f.default_factory is not dataclasses.MISSING:
        made = f.default_factory()
        return "(section)" if dataclasses.is_dataclass(made) else f"`{_yaml(made)}`"
    return "required"


_ROLE = re.compile(r":(func|class|meth|data|mod):`")


def _cell(text: str) -> str:
    """One Markdown table cell: one line, reST literals as Markdown code, pipes escaped."""
    return _ROLE.sub("`", " ".join(text.split())).replace("``", "`").replace("|", "\\|")


def render_reference() -> str:
    """Markdown: one table per section of an experiment YAML, every field with its default and meaning."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from the field docstrings of `workbench/config/` by `workbench.config.reference`",
        "(do not edit by hand; `tests/test_docs.py` checks it is current). An experiment YAML sets only what",
        "differs from these defaults; `python -m workbench run EXPERIMENT.yaml --dry-run` prints the",
        "resolved config.",
        "",
    ]
    for where, cls in SECTIONS:
        docs = field_docs(cls)
        lines += [f"## `{where}`", "", _cell(inspect.getdoc(cls) or "").split(". ")[0].rstrip(".") + ".", ""]
        lines += ["| key | default | meaning |", "|---|---|---|"]
        for f in dataclasses.fields(cls):
            doc = docs.get(f.name) or (f"The `{f.name}` section below." if _default(f) == "(section)" else "")
            key = _KEY_LABELS.get((cls, f.name), f"`{f.name}`")
            default = "`{}`" if (cls, f.name) in _KEY_LABELS else _default(f)
            lines.append(f"| {key} | {default} | {_cell(doc)} |")
        lines.append("")
    return "\n".join(lines + _trl_table())


def _trl_table() -> list[str]:
    """The "Coming from TRL" section: each ``GRPOConfig`` name and the key that does the same here
    (`workbench.config.checks.TRL_NAMES`, the table the "did you mean" of an unknown key reads)."""
    lines = [
        "## Coming from TRL",
        "",
        "Where each `GRPOConfig` setting (and peft's LoRA names) lives here; an unknown key that is one of",
        "these names is answered with the key that does the same (`workbench.config.checks`).",
        "",
        "| TRL | here | note |",
        "|---|---|---|",
    ]
    for name, (target, note) in TRL_NAMES.items():
        lines.append(f"| `{name}` | {f'`{target}`' if target else '—'} | {_cell(note)} |")
    lines.append("")
    return lines


def write_reference(path: str | Path = REFERENCE) -> Path:
    """Write `render_reference` to ``docs/config.md`` (or ``path``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_reference(), encoding="utf-8")
    return path
