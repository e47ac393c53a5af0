"""Experiment configuration: frozen dataclasses with defaults, validated whenever one is made.

An experiment YAML in ``experiments/`` holds only what differs from the defaults below and in the sections
(``task``, ``train``, ``hacpo``, ``output``: `workbench.config.sections`, re-exported here).
Every dataclass validates in ``__post_init__`` (so ``from_dict``, the constructor and ``dataclasses.replace``
all check), before any model loads, and every message names the key, the value and what is allowed. Lossless
coercions happen there too: int → float, ``"1e-4"`` → 1e-4, task knobs → a read-only `FrozenMap`. The
resolved config (``to_dict``) is the first file written into every run directory.

Algorithms, baselines and ablations are configurations, never forked code: ``algorithm``
picks a row of ``workbench.config.methods.ALGORITHMS``, the ``hacpo`` section's switches define the
ablations, and ``label`` names the method in tables and figures (``workbench.config.methods.METHODS``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from workbench.config.agent_spec import AgentSpec, AgentSpecError, lora_problems
from workbench.config.checks import (
    ConfigError,
    build,
    coerce_fields,
    reject_unknown,
    require,
    require_name,
    thaw,
    unknown_key_problems,
)
from workbench.config.methods import ALGORITHMS, METHODS, Method, StepMethod, resolve_step_method
from workbench.config.sections import (
    LR_SCHEDULES,
    NO_KNOBS,
    RATIO_NORMALIZATIONS,
    REPORT_TO,
    HacpoConfig,
    OutputConfig,
    RayConfig,
    TaskConfig,
    TrainConfig,
)

__all__ = [
    "EXECUTORS",
    "LR_SCHEDULES",
    "NO_KNOBS",
    "RATIO_NORMALIZATIONS",
    "REPORT_TO",
    "ConfigError",
    "ExperimentConfig",
    "HacpoConfig",
    "OutputConfig",
    "RayConfig",
    "TaskConfig",
    "TrainConfig",
    "agent_specs",
    "config_problems",
    "expand_seeds",
    "from_dict",
    "part_problems",
]


EXECUTORS = ("local", "threads", "ray")
"""Valid ``executor`` values (the same as ``workbench.train.executors.EXECUTORS``, a layer above)."""


@dataclass(frozen=True)
class ExperimentConfig:
    """One experiment: agents, algorithm, task, training loop, HACPO settings, output.

    Validated on construction (also by ``dataclasses.replace``): sections may be given as mappings of their
    fields and agents as specs, mappings or model strings; both are built once, here.
    """

    experiment: str
    """Name; the run directory's parent folder."""
    agents: tuple[AgentSpec, ...]
    """Agent specs, each with a unique ``name`` (default: derived from ``model``)."""
    algorithm: str = "hacpo"
    """One of ``ALGORITHMS`` (``workbench.config.methods``)."""
    seed: int = 0
    """Seed of prompts, sampling and initialization."""
    seeds: tuple[int, ...] | None = None
    """Run the experiment once per seed, one run directory each (:func:`expand_seeds`); None = ``seed``."""
    label: str = ""
    """Method name in tables and figures (``hacpo-adv``); empty = the algorithm name. A name of
    ``workbench.config.methods.METHODS`` must agree with that method's algorithm and switches."""
    description: str = ""
    """Free text shown in tables and the results index."""
    executor: str = "local"
    """Where the agents run: ``local`` (in the trainer's process, one after another), ``threads`` (in the
    trainer's process, at once, a thread and ``torch threads // agents`` each) or ``ray`` (one Ray actor per
    agent, in parallel; the ``ray`` section). Not part of a run's identity: all give the same results at equal
    torch threads per agent, and a run started with one resumes with another."""
    task: TaskConfig = field(default_factory=TaskConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    hacpo: HacpoConfig = field(default_factory=HacpoConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    """Ray cluster and per-agent resources of ``executor: ray`` (the ``ray`` section below)."""

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            object.__setattr__(self, name, build(name, cls, getattr(self, name)))
        coerce_fields(self, "")
        object.__setattr__(self, "agents", agent_specs(self.agents))
        require_name("experiment", self.experiment, "the run directory's parent folder")
        require(self.seed >= 0, "seed", self.seed, ">= 0")
        if self.seeds is not None:
            ok = bool(self.seeds) and min(self.seeds) >= 0 and len(set(self.seeds)) == len(self.seeds)
            require(ok, "seeds", list(self.seeds), "a non-empty list of unique ints >= 0, or null")
        require(self.algorithm in ALGORITHMS, "algorithm", self.algorithm, f"one of {list(ALGORITHMS)}")
        require(self.executor in EXECUTORS, "executor", self.executor, f"one of {list(EXECUTORS)}")
        require(
            not (self.executor == "threads" and self.train.compile_decode),
            "train.compile_decode",
            True,
            "false with executor: threads (torch.compile's CUDA graphs fail on several threads of one "
            "process, pytorch/pytorch#123177); use executor: local or ray to compile the decode step",
        )
        if self.train.engine == "vllm":
            for k, agent in enumerate(self.agents):
                require(
                    agent.quantization != "8bit",
                    f"agents[{k}].quantization",
                    agent.quantization,
                    "none or 4bit with train.engine: vllm (the engine loads merged weights: a 4-bit base "
                    "dequantized, int8 has no single full-precision weight)",
                )
        if self.algo.share_rollouts:
            n = len(self.agents)
            require(n >= 2, "agents", self.agent_names, f"{self.algorithm} shares rollouts: >= 2 agents")
        m = self.algo.group_multiplier
        require(
            self.train.minibatch_prompts % m == 0,
            "train.minibatch_prompts",
            self.train.minibatch_prompts,
            f"{self.algorithm} has {m}x rollouts per prompt: must be divisible by {m}",
        )
        _check_label(self.label, self.algorithm, self.hacpo)
        if self.hacpo.naive_symmetric:
            require(
                self.algorithm == "naive",
                "hacpo.naive_symmetric",
                True,
                f"only with algorithm: naive (a variant of Naive's cross ratio), not {self.algorithm}",
            )

    @property
    def algo(self) -> Method:
        """The mechanics of ``algorithm``: its row of ``workbench.config.methods.METHODS``."""
        return ALGORITHMS[self.algorithm]

    @property
    def step_method(self) -> StepMethod:
        """What the training step does under this method and config (`StepMethod`)."""
        return resolve_step_method(self.algorithm, self.train, self.hacpo)

    @property
    def agent_names(self) -> list[str]:
        """Agent names in order."""
        return [a.name for a in self.agents]

    @property
    def method(self) -> str:
        """The label shown in tables and figures (``label`` or the algorithm)."""
        return self.label or self.algorithm

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML data (``config.yaml``); :func:`from_dict` reads it back as an equal config."""
        data: dict[str, Any] = {f.name: thaw(getattr(self, f.name)) for f in dataclasses.fields(self)}
        data["agents"] = [spec.to_dict() for spec in self.agents]
        for name in _SECTIONS:
            section = getattr(self, name)
            data[name] = {f.name: thaw(getattr(section, f.name)) for f in dataclasses.fields(section)}
        return data


_SECTIONS = {
    "task": TaskConfig,
    "train": TrainConfig,
    "hacpo": HacpoConfig,
    "output": OutputConfig,
    "ray": RayConfig,
}


def agent_specs(agents: Any) -> tuple[AgentSpec, ...]:
    """Agent specs from specs, mappings (one YAML ``agents`` entry) or model strings; names set and unique."""
    if isinstance(agents, str | Mapping) or not isinstance(agents, Sequence) or not agents:
        raise ConfigError(f"agents: expected a non-empty list of agent specs, got {agents!r}")
    specs = []
    for i, agent in enumerate(agents):
        data = {"model": agent} if isinstance(agent, str) else agent
        if not isinstance(data, AgentSpec) and not (isinstance(data, Mapping) and "model" in data):
            raise ConfigError(
                f"agents[{i}]: expected a model name or a mapping with a 'model' key, got {agent!r}"
            )
        try:
            spec = data if isinstance(data, AgentSpec) else AgentSpec.from_dict(dict(data))
        except AgentSpecError as exc:
            raise ConfigError(f"agents[{i}] ({data.get('name') or data['model']}): {exc}") from None
        if spec.name is None:
            spec = dataclasses.replace(spec, name=spec.display_name)
        require_name(
            f"agents[{i}].name", spec.name, "it becomes part of metric keys such as train/acc/<name>"
        )
        specs.append(spec)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"agents: names must be unique, got {names}; set 'name' on each agent")
    return tuple(specs)


def _check_label(label: str, algorithm: str, hacpo: HacpoConfig) -> None:
    """A label naming a known method must describe the run: that method's algorithm and ``hacpo`` switches."""
    method = METHODS.get(label)
    if method is None:
        return
    wrong = [("algorithm", algorithm)] if algorithm != method.algorithm else []
    wrong += [(f"hacpo.{k}", getattr(hacpo, k)) for k, v in method.switches.items() if getattr(hacpo, k) != v]
    if wrong:
        needs = [
            f"algorithm: {method.algorithm}",
            *(f"hacpo.{k}: {_yaml(v)}" for k, v in method.switches.items()),
        ]
        raise ConfigError(
            f"label = {label!r} is not allowed with {', '.join(f'{k} = {v!r}' for k, v in wrong)}: "
            f"the method {method.label} is {', '.join(needs)}; set those, or choose another label"
        )


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def from_dict(data: Mapping[str, Any]) -> ExperimentConfig:
    """Build and validate an :class:`ExperimentConfig` from plain data (YAML, ``to_dict``).

    Unknown keys are errors here; every other check runs on construction (``ExperimentConfig.__post_init__``).
    A config with several mistakes raises one `ConfigError` listing all of them
    (`config_problems`).
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"an experiment config must be a mapping, got {type(data).__name__}")
    try:
        reject_unknown(data, ExperimentConfig)
        for key in ("experiment", "agents"):
            if key not in data:
                raise ConfigError(f"missing required key {key!r}")
        return ExperimentConfig(**data)
    except ConfigError:
        problems = config_problems(data, ExperimentConfig, _SECTIONS)
        if len(problems) < 2:
            raise
    raise ConfigError(f"{len(problems)} mistakes, all of them:\n- " + "\n- ".join(problems))


def expand_seeds(cfg: ExperimentConfig) -> list[ExperimentConfig]:
    """One config per seed of ``cfg.seeds`` (each with ``seed=s, seeds=None``, so each has its own config hash
    and run directory); ``[cfg]`` when ``seeds`` is None."""
    if cfg.seeds is None:
        return [cfg]
    return [dataclasses.replace(cfg, seed=s, seeds=None) for s in cfg.seeds]


# Every mistake of a config in one pass, instead of one per attempt. The config dataclasses stop at their
# first bad value (`checks.require`). When a config fails, `config_problems` looks again, part
# by part: the unknown keys of every level (each with its "did you mean"), then each section, each agent and
# its ``lora`` mapping, and the top-level keys, on their own. Within a part, the field an error names
# (`ConfigError.key`) is set back to its default and the part is built again, until it builds: so three bad
# values of ``train`` give three messages. `from_dict` raises them together.

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
