"""Every mistake of an experiment config in one pass, instead of one per attempt.

The config dataclasses stop at their first bad value (`workbench.config.checks.require`). When a config fails,
`config_problems` looks again, part by part: the unknown keys of every level (each with its "did you mean",
`workbench.config.trl`), then each section, each agent and its ``lora`` mapping, and the top-level keys, on
their own. Within a part, the field an error names (`ConfigError.key`) is set back to its default and the part
is built again, until it builds: so three bad values of ``train`` give three messages. `from_dict` raises them
together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

from workbench.config.agent_spec import AgentSpec, lora_problems
from workbench.config.checks import ConfigError, unknown_key_problems

__all__ = ["config_problems", "part_problems"]

_PLACEHOLDER_AGENTS = [{"model": "tiny:a", "name": "a"}, {"model": "tiny:b", "name": "b"}]
"""Stand-in agents while the real ones have mistakes of their own (the top-level keys are checked alone)."""


def _field(key: str | None, prefixes: tuple[str, ...]) -> str | None:
    """The field of a part an error's key names: ``train.lr`` → ``lr``, ``task.rewards[i].fn`` → ``rewards``,
    ``lora.r`` (in an agent) → ``lora``."""
    if not key:
        return None
    parts = key.split(".")
    if parts[0] in prefixes and len(parts) > 1:
        parts = parts[1:]
    return parts[0].split("[", 1)[0]


def part_problems(
    build: Callable[..., Any], data: Mapping[str, Any], prefixes: tuple[str, ...] = (), label: str = ""
) -> tuple[list[str], dict[str, Any]]:
    """Every error of ``build(**data)``, each field at fault set back to its default in turn; returns the
    messages (each after ``label``) and the data that builds."""
    data, problems = dict(data), []
    while True:
        try:
            build(**data)
            return problems, data
        except ConfigError as exc:
            problems.append(label + str(exc))
            field = _field(exc.key, prefixes)
            if field not in data:
                return problems, {}
            del data[field]


def _section_problems(data: Mapping[str, Any], sections: Mapping[str, type]) -> tuple[list[str], dict]:
    problems, clean = [], {}
    for name, cls in sections.items():
        section = data.get(name)
        if section is None or not isinstance(section, Mapping):
            if section is not None:
                problems.append(f"{name}: expected a mapping of settings, got {section!r}")
            continue
        problems += unknown_key_problems(section, cls, name)
        known = {k: v for k, v in section.items() if k in {f.name for f in fields(cls)}}
        found, built = part_problems(cls, known, (name,))
        problems += found
        if not found:
            clean[name] = built
    return problems, clean


def _agent_problems(i: int, agent: Any) -> list[str]:
    if isinstance(agent, str):
        agent = {"model": agent}
    if not isinstance(agent, Mapping) or "model" not in agent:
        return [f"agents[{i}]: expected a model name or a mapping with a 'model' key, got {agent!r}"]
    label = f"agents[{i}] ({agent.get('name') or agent['model']}): "
    problems = [label + p for p in unknown_key_problems(agent, AgentSpec, "agent")]
    known = {k: v for k, v in agent.items() if k in {f.name for f in fields(AgentSpec)}}
    lora = known.get("lora")
    if isinstance(lora, dict) and (found := lora_problems(lora)):
        problems += [label + p for p in found]
        del known["lora"]
    return problems + part_problems(AgentSpec, known, label=label)[0]


def config_problems(data: Mapping[str, Any], top: type, sections: Mapping[str, type]) -> list[str]:
    """Every mistake of the experiment config ``data`` (``top``: its dataclass, ``sections``: name → section
    dataclass), each a paragraph naming the key, the value and what is allowed; empty when it builds."""
    problems = unknown_key_problems(data, top)
    problems += [f"missing required key {key!r}" for key in ("experiment", "agents") if key not in data]
    found, clean = _section_problems(data, sections)
    problems += found
    agents = data.get("agents")
    agent_found: list[str] = []
    if isinstance(agents, list | tuple) and agents:
        for i, agent in enumerate(agents):
            agent_found += _agent_problems(i, agent)
    elif "agents" in data:
        agent_found.append(f"agents: expected a non-empty list of agent specs, got {agents!r}")
    problems += agent_found
    names = {f.name for f in fields(top)}
    scalars = {k: v for k, v in data.items() if k in names and k not in sections and k != "agents"}
    agents_used = list(agents) if isinstance(agents, list | tuple) and agents and not agent_found else None
    problems += part_problems(
        lambda **kw: top(
            **{"experiment": "experiment", **kw}, agents=agents_used or _PLACEHOLDER_AGENTS, **clean
        ),
        scalars,
    )[0]
    return list(dict.fromkeys(problems))
