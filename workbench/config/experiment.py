"""Experiment configuration: frozen dataclasses with defaults, validated whenever one is made.

An experiment YAML in ``experiments/`` holds only what differs from the defaults below (spec §6, §9).
Every dataclass validates in ``__post_init__`` (so ``from_dict``, the constructor and ``dataclasses.replace``
all check), before any model loads, and every message names the key, the value and what is allowed. Lossless
coercions happen there too: int → float, ``"1e-4"`` → 1e-4, task knobs → a read-only `FrozenMap`. The
resolved config (``to_dict``) is the first file written into every run directory.

Algorithms, baselines and ablations are configurations, never forked code (style principle 6): ``algorithm``
picks a row of ``workbench.config.methods.ALGORITHMS``, the ``hacpo`` section's switches define the
ablations, and ``label`` names the method in tables and figures (``workbench.config.methods.METHODS``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.config.agent_spec import AgentSpec, AgentSpecError
from workbench.config.checks import ConfigError, build, coerce_fields, require, require_name
from workbench.config.frozen import FrozenMap, thaw
from workbench.config.methods import ALGORITHMS, METHODS, Method
from workbench.tasks.rewards import reward_problem

__all__ = [
    "ConfigError",
    "ExperimentConfig",
    "HacpoConfig",
    "OutputConfig",
    "TaskConfig",
    "TrainConfig",
    "expand_seeds",
    "from_dict",
]

NO_KNOBS = FrozenMap()
"""The default task knobs: none."""
RATIO_NORMALIZATIONS = ("tokens", "bytes")
"""Valid ``hacpo.ratio_normalization`` values."""
REPORT_TO = ("tensorboard", "trackio", "wandb")  # output.report_to sinks (workbench.train.tracking)


@dataclass(frozen=True)
class TaskConfig:
    """Where training and held-out problems come from (``workbench.tasks.load_tasks``)."""

    source: str = "embedded"
    """Task source: ``embedded``, ``gym:<generator>``, ``file:<path>`` or a benchmark name."""
    eval_source: str | None = None
    """Held-out source; None = the same source's ``test`` split."""
    train_size: int = 2000
    """Training problems drawn (the step batches cycle through them)."""
    eval_size: int = 1000
    """Held-out problems evaluated every ``eval_every`` steps (greedy, and ``train.eval_samples`` sampled)."""
    eval_seed: int | None = 0
    """Seed of the held-out draw; fixed by default so every seed of an experiment is evaluated on the same
    items; None = the run's ``seed``."""
    instruction: str | None = None
    """Instruction appended to each question; None = the bare question (tiny char-level agents)."""
    reward: str = "math_verify"
    """Grader: ``math_verify``, ``boxed_exact``, ``numeric`` (``workbench.tasks.rewards.REWARD_METHODS``), or
    your own function as ``package.module:function`` (imported and tried once when the config loads)."""
    knobs: FrozenMap = NO_KNOBS
    """Extra keyword arguments for the task source (e.g. ``n_ops: [1, 3]``, ``max_operand: 9``); read-only,
    lists become tuples."""
    eval_knobs: FrozenMap | None = None
    """Keyword arguments for the held-out source; None = ``knobs`` when it is the same source, else none."""
    eval_sources: tuple[str, ...] = ()
    """Further held-out sources evaluated next to ``eval_source`` (``[math500, "gym:gsm_symbolic"]``): each
    its ``test`` split, ``eval_size`` items, no knobs."""

    def __post_init__(self) -> None:
        coerce_fields(self, "task")
        require(bool(self.source.strip()), "task.source", self.source, "a non-empty source name")
        if self.eval_source is not None:
            require(
                bool(self.eval_source.strip()), "task.eval_source", self.eval_source, "a source name or null"
            )
        require(self.train_size >= 1, "task.train_size", self.train_size, ">= 1")
        require(self.eval_size >= 0, "task.eval_size", self.eval_size, ">= 0")
        require(
            self.eval_seed is None or self.eval_seed >= 0, "task.eval_seed", self.eval_seed, ">= 0 or null"
        )
        if problem := reward_problem(self.reward):
            raise ConfigError(problem)
        require(
            all(map(str.strip, self.eval_sources)), "task.eval_sources", self.eval_sources, "source names"
        )


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
    adam_beta1: float = 0.9
    """AdamW β1."""
    adam_beta2: float = 0.999
    """AdamW β2."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient-norm clip (paper code: 1.0)."""
    kl_coef: float = 0.001
    """low_var_kl coefficient on self samples (authors' code: 0.001); 0 disables."""
    skip_uniform_groups: bool = False
    """Leave out of the update the samples of every prompt whose rewards in the learner's group are all equal
    (their advantage is 0: only the mini-batch composition and normalisation change)."""
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
    eval_samples: int = 4
    """k of the sampled held-out metric avg@k logged next to greedy accuracy; 0 = greedy only."""
    eval_temperature: float = 1.0
    """Sampling temperature of the avg@k evaluation."""
    save_every: int = 10
    """Checkpoint every this many steps (and at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk."""
    samples_per_step: int = 8
    """Rollouts written to ``samples/`` per step."""

    def __post_init__(self) -> None:
        coerce_fields(self, "train")
        require(self.steps >= 1, "train.steps", self.steps, ">= 1")
        require(self.prompts_per_step >= 1, "train.prompts_per_step", self.prompts_per_step, ">= 1")
        require(
            self.group_size >= 2, "train.group_size", self.group_size, ">= 2 (a group needs two responses)"
        )
        require(self.minibatch_prompts >= 1, "train.minibatch_prompts", self.minibatch_prompts, ">= 1")
        require(
            self.prompts_per_step % self.minibatch_prompts == 0,
            "train.minibatch_prompts",
            self.minibatch_prompts,
            f"must divide train.prompts_per_step = {self.prompts_per_step}",
        )
        require(self.micro_batch_size >= 1, "train.micro_batch_size", self.micro_batch_size, ">= 1")
        require(self.lr > 0, "train.lr", self.lr, "> 0")
        require(0 <= self.adam_beta1 < 1, "train.adam_beta1", self.adam_beta1, "in [0, 1)")
        require(0 <= self.adam_beta2 < 1, "train.adam_beta2", self.adam_beta2, "in [0, 1)")
        require(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, ">= 0")
        require(self.grad_clip > 0, "train.grad_clip", self.grad_clip, "> 0")
        require(self.kl_coef >= 0, "train.kl_coef", self.kl_coef, ">= 0")
        require(self.temperature > 0, "train.temperature", self.temperature, "> 0 (rollouts sample)")
        require(0 < self.top_p <= 1, "train.top_p", self.top_p, "in (0, 1]")
        require(self.max_new_tokens >= 1, "train.max_new_tokens", self.max_new_tokens, ">= 1")
        require(self.eval_every >= 0, "train.eval_every", self.eval_every, ">= 0")
        mnt = self.eval_max_new_tokens
        require(mnt is None or mnt >= 1, "train.eval_max_new_tokens", mnt, ">= 1 or null")
        require(self.eval_samples >= 0, "train.eval_samples", self.eval_samples, ">= 0 (0 = greedy only)")
        require(self.eval_temperature > 0, "train.eval_temperature", self.eval_temperature, "> 0")
        require(self.save_every >= 1, "train.save_every", self.save_every, ">= 1")
        require(self.keep_checkpoints >= 1, "train.keep_checkpoints", self.keep_checkpoints, ">= 1")
        require(self.samples_per_step >= 0, "train.samples_per_step", self.samples_per_step, ">= 0")


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
    ratio_normalization: str = "tokens"
    """Cross-sample log-ratio per token of each policy's own tokenization (``tokens``, Eq. 25) or per UTF-8
    byte of the shared response (``bytes``: summed log-probs / byte length; tokenizer-neutral)."""

    def __post_init__(self) -> None:
        coerce_fields(self, "hacpo")
        require(self.alpha >= 0, "hacpo.alpha", self.alpha, ">= 0")
        require(
            0 <= self.delta < 1,
            "hacpo.delta",
            self.delta,
            "in [0, 1) (the lower bound 1 − δ must be positive)",
        )
        require(self.delta_step >= 0, "hacpo.delta_step", self.delta_step, ">= 0")
        require(self.window >= 1, "hacpo.window", self.window, ">= 1")
        require(0 < self.min_ratio <= 1, "hacpo.min_ratio", self.min_ratio, "in (0, 1]")
        require(self.max_ratio >= 1, "hacpo.max_ratio", self.max_ratio, ">= 1")
        require(self.capability_floor > 0, "hacpo.capability_floor", self.capability_floor, "> 0")
        require(self.warmup_steps >= 0, "hacpo.warmup_steps", self.warmup_steps, ">= 0")
        require(0 <= self.eps_low < 1, "hacpo.eps_low", self.eps_low, "in [0, 1)")
        require(self.eps_high >= 0, "hacpo.eps_high", self.eps_high, ">= 0")
        require(self.max_abs_log_ratio > 0, "hacpo.max_abs_log_ratio", self.max_abs_log_ratio, "> 0")
        norm = self.ratio_normalization
        require(
            norm in RATIO_NORMALIZATIONS, "hacpo.ratio_normalization", norm, f"one of {RATIO_NORMALIZATIONS}"
        )


@dataclass(frozen=True)
class OutputConfig:
    """Where runs go."""

    root: str = "results"
    """Root of run directories: ``<root>/<experiment>/<run-id>/``."""
    run_id: str | None = None
    """Explicit run id; None = timestamp + random suffix."""
    report_to: tuple[str, ...] = ()
    """Tracking sinks fed every step (``tensorboard``, ``trackio``, ``wandb``; `workbench.train.tracking`);
    empty = none: nothing leaves the run directory."""

    def __post_init__(self) -> None:
        coerce_fields(self, "output")
        require(bool(self.root.strip()), "output.root", self.root, "a non-empty directory")
        if self.run_id is not None:
            require_name("output.run_id", self.run_id, "a directory name")
        ok = set(self.report_to) <= set(REPORT_TO)
        require(ok, "output.report_to", list(self.report_to), f"a list of {list(REPORT_TO)}")


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
    task: TaskConfig = field(default_factory=TaskConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    hacpo: HacpoConfig = field(default_factory=HacpoConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            object.__setattr__(self, name, build(name, cls, getattr(self, name)))
        coerce_fields(self, "")
        object.__setattr__(self, "agents", _agent_specs(self.agents))
        require_name("experiment", self.experiment, "the run directory's parent folder")
        require(self.seed >= 0, "seed", self.seed, ">= 0")
        if self.seeds is not None:
            ok = bool(self.seeds) and min(self.seeds) >= 0 and len(set(self.seeds)) == len(self.seeds)
            require(ok, "seeds", list(self.seeds), "a non-empty list of unique ints >= 0, or null")
        require(self.algorithm in ALGORITHMS, "algorithm", self.algorithm, f"one of {list(ALGORITHMS)}")
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

    @property
    def algo(self) -> Method:
        """The mechanics of ``algorithm``: its row of ``workbench.config.methods.METHODS``."""
        return ALGORITHMS[self.algorithm]

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


_SECTIONS = {"task": TaskConfig, "train": TrainConfig, "hacpo": HacpoConfig, "output": OutputConfig}


def _agent_specs(agents: Any) -> tuple[AgentSpec, ...]:
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
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"an experiment config must be a mapping, got {type(data).__name__}")
    top = [f.name for f in dataclasses.fields(ExperimentConfig)]
    unknown = sorted(set(data) - set(top), key=str)
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}; valid top-level keys: {top}")
    for key in ("experiment", "agents"):
        if key not in data:
            raise ConfigError(f"missing required key {key!r}")
    return ExperimentConfig(**data)


def expand_seeds(cfg: ExperimentConfig) -> list[ExperimentConfig]:
    """One config per seed of ``cfg.seeds`` (each with ``seed=s, seeds=None``, so each has its own config hash
    and run directory); ``[cfg]`` when ``seeds`` is None."""
    if cfg.seeds is None:
        return [cfg]
    return [dataclasses.replace(cfg, seed=s, seeds=None) for s in cfg.seeds]
