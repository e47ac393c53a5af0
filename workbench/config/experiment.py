"""Experiment configuration: frozen dataclasses with defaults, YAML loading, overrides, validation.

An experiment YAML in ``experiments/`` holds only what differs from the defaults below (spec §6, §9).
Validation happens once, before any model loads, and every message names the key, the value and what is
allowed. The resolved config is the first file written into every run directory.

Algorithms and ablations are configurations, never forked code (style principle 6):

| algorithm | shares rollouts | advantage | policy loss |
|---|---|---|---|
| ``hacpo`` | yes | capability-aware (Eqs. 6-7) | HACPO (GSPO self + exp. IS, stepwise clip, ω on cross) |
| ``naive`` | yes | joint-group mean/std (ω ≡ 1) | GSPO ratio and clip on every sample |
| ``gspo`` | no | group (Eq. 5) | GSPO |
| ``gspo_x2`` | no | group over 2G rollouts | GSPO, same number of updates as HACPO |
| ``grpo`` | no | group (Eq. 5) | GRPO token-level, ε = 0.2 / 0.28 |

Ablations of ``hacpo`` are switches of the ``hacpo`` section: ``capability_baseline: false`` (−Adv),
``omega_in_loss: false`` (−ω), ``alpha`` (the α sweep), ``delta_step: 0`` (no stepwise), ``clip_cross:
false`` (no Clip).
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "ConfigError",
    "ExperimentConfig",
    "HacpoConfig",
    "OutputConfig",
    "TaskConfig",
    "TrainConfig",
]


_FLOAT_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


class ConfigError(ValueError):
    """A config key, value or path is wrong; the message names it and what is allowed."""


@dataclass(frozen=True)
class Algorithm:
    """How an algorithm name maps onto the shared machinery (one row of the table above)."""

    share_rollouts: bool
    """Learners train on every agent's rollouts (True) or only their own."""
    loss: str
    """Policy loss name in ``workbench.core.losses.POLICY_LOSSES``."""
    capability_advantages: bool
    """Use the capability-aware baseline (ω ≠ 1 possible); False uses the plain joint/group mean."""
    group_multiplier: int = 1
    """Rollouts per prompt = group_multiplier · G (2 for GSPO×2)."""
    clip: tuple[float, float] | None = None
    """Override of the self-sample clip (ε_low, ε_high); None keeps the ``hacpo`` section's."""


ALGORITHMS: dict[str, Algorithm] = {
    "hacpo": Algorithm(share_rollouts=True, loss="hacpo", capability_advantages=True),
    "naive": Algorithm(share_rollouts=True, loss="gspo", capability_advantages=False),
    "gspo": Algorithm(share_rollouts=False, loss="gspo", capability_advantages=False),
    "gspo_x2": Algorithm(share_rollouts=False, loss="gspo", capability_advantages=False, group_multiplier=2),
    "grpo": Algorithm(share_rollouts=False, loss="grpo", capability_advantages=False, clip=(0.2, 0.28)),
}


@dataclass(frozen=True)
class TaskConfig:
    """Where training and held-out problems come from (``workbench.tasks.load_tasks``)."""

    source: str = "embedded"
    """Task source: ``embedded``, ``gym:<generator>``, ``file:<path>`` or a benchmark name."""
    eval_source: str | None = None
    """Held-out source; None = the same source's ``test`` split."""
    train_size: int = 2000
    """Training problems drawn (the step batches cycle through them)."""
    eval_size: int = 200
    """Held-out problems evaluated (greedy) every ``eval_every`` steps."""
    instruction: str | None = None
    """Instruction appended to each question; None = the bare question (tiny char-level agents)."""
    reward: str = "math_verify"
    """Grader name in ``workbench.tasks.rewards.REWARD_METHODS``."""
    knobs: dict = field(default_factory=dict)
    """Extra keyword arguments for the task source (e.g. ``n_ops: [1, 3]``, ``max_operand: 9``)."""
    eval_knobs: dict | None = None
    """Keyword arguments for the held-out source; None = ``knobs`` when it is the same source, else none."""


@dataclass(frozen=True)
class TrainConfig:
    """The training loop (spec §6; CPU-sized defaults)."""

    steps: int = 40
    """Training steps (each: every agent rolls out, every learner updates)."""
    prompts_per_step: int = 16
    """B, prompts per step (paper: 128)."""
    group_size: int = 8
    """G, responses per agent per prompt (paper: 8)."""
    minibatch_prompts: int = 8
    """Prompts per mini-batch (paper: 64); a mini-batch holds minibatch_prompts·G sequences."""
    micro_batch_size: int = 64
    """Sequences per forward/backward (gradient accumulation; memory knob only)."""
    lr: float = 1e-4
    """AdamW learning rate (paper: 1e-6 for full fine-tuning of 2-8B models)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient-norm clip (paper code: 1.0)."""
    kl_coef: float = 0.001
    """low_var_kl coefficient on self samples (authors' code: 0.001); 0 disables."""
    temperature: float = 1.0
    """Rollout sampling temperature (verl default 1.0)."""
    top_p: float = 1.0
    """Rollout nucleus sampling."""
    max_new_tokens: int = 32
    """Rollout length cap in tokens."""
    eval_every: int = 10
    """Evaluate on the held-out split every this many steps (and at step 0 and the end); 0 = only ends."""
    eval_max_new_tokens: int | None = None
    """Evaluation length cap; None = max_new_tokens."""
    save_every: int = 10
    """Checkpoint every this many steps (and at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk."""
    samples_per_step: int = 8
    """Rollouts written to ``samples/`` per step."""


@dataclass(frozen=True)
class HacpoConfig:
    """HACPO hyperparameters and switches (spec §3, §9; defaults from the paper and the authors' code)."""

    alpha: float = 1.0
    """α of the exponential importance sampling (Eq. 12); 0 = plain ratio."""
    delta: float = 0.2
    """δ: cross samples are clipped to [1 − δ + m·δ_step, 1] (Eqs. 13-14; Table 5's "0.8" is 1 − δ)."""
    delta_step: float = 0.025
    """δ_step: per-mini-batch tightening of the cross lower bound; 0 = the "no Stepwise" ablation."""
    window: int = 5
    """K, steps in the capability moving average (Eq. 9)."""
    min_ratio: float = 0.1
    """Lower clamp of ω (authors' code)."""
    max_ratio: float = 10.0
    """Upper clamp of ω (authors' code)."""
    capability_floor: float = 1e-8
    """Floor of P̂."""
    warmup_steps: int = 0
    """Force ω = 1 for the first steps (the code's stable_perf)."""
    eps_low: float = 3e-4
    """Self-sample clip ε_low (GSPO)."""
    eps_high: float = 4e-4
    """Self-sample clip ε_high (GSPO)."""
    max_abs_log_ratio: float = 10.0
    """Clamp of the sequence log-ratio."""
    normalize_by_std: bool = True
    """Divide advantages by the joint std (Eq. 6)."""
    uniform_group_guard: bool = True
    """All-equal reward group → plain mean baseline (code guard)."""
    binary_guard: bool = True
    """Weighted baseline > 1 → learner's own mean (code guard)."""
    capability_baseline: bool = True
    """Use ω in the baseline (Eq. 7); False = the "−Adv" ablation (plain joint mean)."""
    omega_in_loss: bool = True
    """Scale cross samples by ω^(source, learner) (Eq. 10); False = the "−ω" ablation."""
    clip_cross: bool = True
    """Clip cross ratios to [lb, 1]; False = the "no Clip" ablation."""


@dataclass(frozen=True)
class OutputConfig:
    """Where runs go."""

    root: str = "results"
    """Root of run directories: ``<root>/<experiment>/<run-id>/``."""
    run_id: str | None = None
    """Explicit run id; None = timestamp + random suffix."""


@dataclass(frozen=True)
class ExperimentConfig:
    """One experiment: agents, algorithm, task, training loop, HACPO settings, output."""

    experiment: str
    """Name; the run directory's parent folder."""
    agents: tuple[dict, ...]
    """Agent specs (``workbench.config.AgentSpec`` fields; a bare string is a model name)."""
    algorithm: str = "hacpo"
    """One of ``ALGORITHMS``."""
    seed: int = 0
    """Seed of prompts, sampling and initialization."""
    label: str = ""
    """Method name in tables and figures (``hacpo-adv``); empty = the algorithm name."""
    description: str = ""
    """Free text shown in tables and the results index."""
    task: TaskConfig = field(default_factory=TaskConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    hacpo: HacpoConfig = field(default_factory=HacpoConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    @property
    def algo(self) -> Algorithm:
        """The :class:`Algorithm` row of ``algorithm``."""
        return ALGORITHMS[self.algorithm]

    @property
    def agent_names(self) -> list[str]:
        """Agent names in order."""
        return [a["name"] for a in self.agents]

    @property
    def method(self) -> str:
        """The label shown in tables and figures (``label`` or the algorithm)."""
        return self.label or self.algorithm

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (what ``config.yaml`` holds)."""
        data = dataclasses.asdict(self)
        data["agents"] = [dict(a) for a in self.agents]
        return data


_SECTIONS = {"task": TaskConfig, "train": TrainConfig, "hacpo": HacpoConfig, "output": OutputConfig}


def _check_type(where: str, value: Any, annotation: Any) -> Any:
    """Coerce ``value`` to the annotated type where lossless (int → float), else raise ConfigError."""
    hint = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if hint in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _check_type(where, value, arg)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0])
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is float and isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip()):
        return float(value)  # PyYAML reads "1e-4" (no dot) as a string; users write it anyway
    if annotation in (int, float, str, bool):
        if type(value) is not annotation:
            raise ConfigError(
                f"{where}: expected {annotation.__name__}, got {type(value).__name__} {value!r}"
            )
        return value
    if annotation is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    return value


def _build_section(name: str, cls: type, data: Any) -> Any:
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: expected a mapping of settings, got {data!r}")
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise ConfigError(f"unknown key {name}.{unknown[0]}; valid keys of {name!r}: {valid}")
    return cls(**{k: _check_type(f"{name}.{k}", v, hints[k]) for k, v in data.items()})


def _require(condition: bool, key: str, value: Any, allowed: str) -> None:
    if not condition:
        raise ConfigError(f"{key} = {value!r} is not allowed: {allowed}")


def _normalize_agents(agents: Any) -> tuple[dict, ...]:
    if not isinstance(agents, list) or not agents:
        raise ConfigError(f"agents: expected a non-empty list of agent specs, got {agents!r}")
    out = []
    for i, agent in enumerate(agents):
        spec = {"model": agent} if isinstance(agent, str) else agent
        if not isinstance(spec, dict) or "model" not in spec:
            raise ConfigError(
                f"agents[{i}]: expected a model name or a mapping with a 'model' key, got {agent!r}"
            )
        spec = dict(spec)
        spec.setdefault("name", str(spec["model"]).split(":")[-1].split("/")[-1])
        out.append(spec)
    for i, spec in enumerate(out):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", str(spec["name"])):
            raise ConfigError(
                f"agents[{i}].name = {spec['name']!r} is not allowed: letters, digits and _.+- "
                "(it becomes part of metric keys such as train/acc/<name>)"
            )
    from workbench.config.agent_spec import AgentSpec, AgentSpecError  # light: no transformers import

    for i, spec in enumerate(out):
        try:
            AgentSpec.from_dict(spec)
        except AgentSpecError as exc:
            raise ConfigError(f"agents[{i}] ({spec['name']}): {exc}") from None
    names = [a["name"] for a in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"agents: names must be unique, got {names}; set 'name' on each agent")
    return tuple(out)


def validate(cfg: ExperimentConfig) -> None:
    """Check values and combinations; a :class:`ConfigError` names the key, value and what is allowed."""
    t, h = cfg.train, cfg.hacpo
    _require(cfg.algorithm in ALGORITHMS, "algorithm", cfg.algorithm, f"one of {sorted(ALGORITHMS)}")
    _require(bool(cfg.experiment), "experiment", cfg.experiment, "a non-empty name")
    if cfg.algo.share_rollouts:
        _require(
            len(cfg.agents) >= 2, "agents", cfg.agent_names, f"{cfg.algorithm} shares rollouts: >= 2 agents"
        )
    _require(t.steps >= 1, "train.steps", t.steps, ">= 1")
    _require(t.prompts_per_step >= 1, "train.prompts_per_step", t.prompts_per_step, ">= 1")
    _require(t.group_size >= 2, "train.group_size", t.group_size, ">= 2 (a group needs two responses)")
    _require(t.minibatch_prompts >= 1, "train.minibatch_prompts", t.minibatch_prompts, ">= 1")
    _require(
        t.prompts_per_step % t.minibatch_prompts == 0,
        "train.minibatch_prompts",
        t.minibatch_prompts,
        f"must divide train.prompts_per_step = {t.prompts_per_step}",
    )
    if cfg.algo.group_multiplier > 1:
        _require(
            t.minibatch_prompts % cfg.algo.group_multiplier == 0,
            "train.minibatch_prompts",
            t.minibatch_prompts,
            f"{cfg.algorithm} has {cfg.algo.group_multiplier}x rollouts per prompt: "
            f"must be divisible by {cfg.algo.group_multiplier}",
        )
    _require(t.micro_batch_size >= 1, "train.micro_batch_size", t.micro_batch_size, ">= 1")
    _require(t.lr > 0, "train.lr", t.lr, "> 0")
    _require(t.grad_clip > 0, "train.grad_clip", t.grad_clip, "> 0")
    _require(t.kl_coef >= 0, "train.kl_coef", t.kl_coef, ">= 0")
    _require(t.temperature > 0, "train.temperature", t.temperature, "> 0 (rollouts sample)")
    _require(0 < t.top_p <= 1, "train.top_p", t.top_p, "in (0, 1]")
    _require(t.max_new_tokens >= 1, "train.max_new_tokens", t.max_new_tokens, ">= 1")
    _require(t.eval_every >= 0, "train.eval_every", t.eval_every, ">= 0")
    _require(t.save_every >= 1, "train.save_every", t.save_every, ">= 1")
    _require(t.keep_checkpoints >= 1, "train.keep_checkpoints", t.keep_checkpoints, ">= 1")
    _require(h.alpha >= 0, "hacpo.alpha", h.alpha, ">= 0")
    _require(0 <= h.delta < 1, "hacpo.delta", h.delta, "in [0, 1) (the lower bound 1 − δ must be positive)")
    _require(h.delta_step >= 0, "hacpo.delta_step", h.delta_step, ">= 0")
    _require(h.window >= 1, "hacpo.window", h.window, ">= 1")
    _require(0 < h.min_ratio <= 1, "hacpo.min_ratio", h.min_ratio, "in (0, 1]")
    _require(h.max_ratio >= 1, "hacpo.max_ratio", h.max_ratio, ">= 1")
    _require(h.capability_floor > 0, "hacpo.capability_floor", h.capability_floor, "> 0")
    _require(h.warmup_steps >= 0, "hacpo.warmup_steps", h.warmup_steps, ">= 0")
    _require(0 <= h.eps_low < 1, "hacpo.eps_low", h.eps_low, "in [0, 1)")
    _require(h.eps_high >= 0, "hacpo.eps_high", h.eps_high, ">= 0")
    _require(h.max_abs_log_ratio > 0, "hacpo.max_abs_log_ratio", h.max_abs_log_ratio, "> 0")
    _require(cfg.task.train_size >= 1, "task.train_size", cfg.task.train_size, ">= 1")
    _require(cfg.task.eval_size >= 0, "task.eval_size", cfg.task.eval_size, ">= 0")


def from_dict(data: dict[str, Any]) -> ExperimentConfig:
    """Build and validate an :class:`ExperimentConfig` from plain data (unknown keys are errors)."""
    if not isinstance(data, dict):
        raise ConfigError(f"an experiment config must be a mapping, got {type(data).__name__}")
    top = [f.name for f in dataclasses.fields(ExperimentConfig)]
    unknown = sorted(set(data) - set(top))
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}; valid top-level keys: {top}")
    for key in ("experiment", "agents"):
        if key not in data:
            raise ConfigError(f"missing required key {key!r}")
    hints = typing.get_type_hints(ExperimentConfig)
    kwargs: dict[str, Any] = {
        name: _build_section(name, cls, data.get(name)) for name, cls in _SECTIONS.items()
    }
    for key in ("experiment", "algorithm", "seed", "label", "description"):
        if key in data:
            kwargs[key] = _check_type(key, data[key], hints[key])
    kwargs["agents"] = _normalize_agents(data["agents"])
    cfg = ExperimentConfig(**kwargs)
    validate(cfg)
    return cfg
