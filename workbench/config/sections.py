"""The sections of an experiment config: ``task``, ``train``, ``hacpo``, ``output``, ``ray``.

Frozen dataclasses with defaults and a one-line docstring per field (rendered into ``docs/config.md`` by
`workbench.config.reference`). Each validates in ``__post_init__``, so a bad value is caught however the
section is made, and every message names ``section.field``, the value and what is allowed.
`workbench.config.experiment.ExperimentConfig` holds one of each (and re-exports them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workbench.config.checks import ConfigError, FrozenMap, coerce_fields, require, require_name
from workbench.config.reward_spec import RewardSpec, reward_specs
from workbench.core.knobs import HACPO_KNOBS, knob_problem
from workbench.tasks.rewards import reward_problem

__all__ = [
    "BATCH_ORDERS",
    "ENGINES",
    "LR_SCHEDULES",
    "NO_KNOBS",
    "OWN_ADVANTAGES",
    "RATIO_NORMALIZATIONS",
    "REPORT_TO",
    "HacpoConfig",
    "OutputConfig",
    "RayConfig",
    "TaskConfig",
    "TrainConfig",
]

# The values each choice field allows (messages name them).
ENGINES = ("hf", "vllm")  # train.engine: what samples the rollouts
RATIO_NORMALIZATIONS = ("tokens", "bytes")  # hacpo.ratio_normalization
OWN_ADVANTAGES = ("joint", "group")  # hacpo.own_advantage
BATCH_ORDERS = ("own_first", "by_prompt")  # hacpo.batch_order
REPORT_TO = ("tensorboard", "trackio", "wandb")  # output.report_to sinks (workbench.train.tracking)
LR_SCHEDULES = ("constant", "linear", "cosine")  # train.lr_schedule: transformers' get_scheduler names
NO_KNOBS = FrozenMap()
"""The default task knobs: none."""


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
    your own function as ``package.module:function`` (imported and tried once when the config loads). It
    measures accuracy: ``train/acc``, the capability P̂ (Eq. 9, hence ω) and every evaluation; the run trains
    on it too unless ``rewards`` is set."""
    rewards: tuple[RewardSpec, ...] = ()
    """Reward functions the run trains on, TRL's ``reward_funcs`` with their ``reward_weights``:
    ``[{fn: math_verify, weight: 1}, {fn: format_boxed, weight: 0.2}]`` (the ``task.rewards[i]`` section); the
    advantages (shared by HACPO) are of their weighted sum, each logged as ``reward/<agent>/<name>/mean`` and
    ``/std``; P̂ keeps measuring accuracy with ``reward``. Empty = ``reward`` alone."""
    knobs: FrozenMap = NO_KNOBS
    """Extra keyword arguments for the task source (e.g. ``n_ops: [1, 3]``, ``max_operand: 9``); read-only,
    lists become tuples."""
    eval_knobs: FrozenMap | None = None
    """Keyword arguments for the held-out source; None = ``knobs`` when it is the same source, else none."""
    eval_sources: tuple[str, ...] = ()
    """Further held-out sources evaluated next to ``eval_source`` (``[math500, "gym:gsm_symbolic"]``): each
    its ``test`` split, ``eval_size`` items, no knobs; logged as ``eval/<source>/acc/<agent>`` and
    ``eval/<source>/avg@k/<agent>`` (``<source>``: a file's stem, else the name with ``:`` made ``_``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rewards", reward_specs(self.rewards))
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
            raise ConfigError(problem, key="task.reward")
        require(
            all(map(str.strip, self.eval_sources)), "task.eval_sources", self.eval_sources, "source names"
        )
        unique = len(set(self.eval_sources)) == len(self.eval_sources)
        require(unique, "task.eval_sources", list(self.eval_sources), "each source once")

    def held_out_sources(self) -> list[tuple[str, str, Mapping[str, Any]]]:
        """``(field, source, knobs)`` of every held-out source, the main one first.

        ``eval_source`` (None: the training source's ``test`` split) with ``eval_knobs`` (None: ``knobs`` for
        the same source, else none), then any further ``eval_sources`` (each ``{source, knobs}`` or a name).
        """
        source = self.eval_source or self.source
        knobs = self.eval_knobs
        if knobs is None:
            knobs = self.knobs if source == self.source else {}
        found = [("task.eval_source" if self.eval_source else "task.source", source, knobs)]
        for i, extra in enumerate(self.eval_sources or ()):
            if isinstance(extra, str):
                found.append((f"task.eval_sources[{i}]", extra, {}))
            else:
                found.append((f"task.eval_sources[{i}]", extra["source"], extra.get("knobs") or {}))
        return found


@dataclass(frozen=True)
class TrainConfig:
    """The training loop, with CPU-sized defaults (the paper's settings: ``docs/hacpo.md``)."""

    steps: int = 40
    """Training steps (each: every agent rolls out, every learner updates)."""
    prompts_per_step: int = 16
    """B, prompts per step (paper: 128)."""
    group_size: int = 8
    """G, responses per agent per prompt (paper: 8)."""
    minibatch_prompts: int = 8
    """Prompts per mini-batch (paper: 64); a mini-batch holds minibatch_prompts·G sequences."""
    micro_batch_size: int = 64
    """Sequences per forward/backward at most (gradient accumulation; memory knob only)."""
    micro_batch_tokens: int | None = None
    """Tokens (prompt + response of each sequence) per forward/backward at most, besides micro_batch_size:
    sizes micro-batches by what they cost when lengths vary (a longer sequence goes alone); null = sequences
    alone. Memory knob only: the loss and gradients do not depend on it."""
    lr: float = 1e-4
    """AdamW learning rate (paper: 1e-6 for full fine-tuning of 2-8B models); ``agents[i].lr`` per agent."""
    lr_schedule: str = "constant"
    """Learning-rate schedule over the run's ``steps`` (`LR_SCHEDULES`, through transformers'
    ``get_scheduler``): ``constant``, ``linear`` (decay to 0) or ``cosine``, after ``warmup_steps`` of linear
    warm-up from 0; stepped once per training step, so every mini-batch of a step uses one rate and every
    method the same rate at the same step. Its state is in every checkpoint."""
    warmup_steps: int = 0
    """Warm-up steps of the schedule (the first step's rate is then 0, as in transformers); 0 = none."""
    warmup_ratio: float = 0.0
    """Warm-up as a share of ``steps`` (``ceil(warmup_ratio · steps)`` steps), instead of ``warmup_steps``."""
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
    """Leave out of the update every prompt whose advantages are all 0 in the learner's batch (sharing: all
    agents' rewards to it are equal; else the agent's own G are); the kept samples are spread over as many
    mini-batches as the full batch has, so the number of updates stays the same."""
    temperature: float = 1.0
    """Rollout sampling temperature (verl default 1.0)."""
    top_p: float = 1.0
    """Rollout nucleus sampling."""
    max_new_tokens: int = 32
    """Rollout length cap in tokens."""
    mask_truncated: bool = False
    """Responses cut by ``max_new_tokens`` (finish reason ``length``) carry no gradient, in every learner's
    batch (TRL's ``mask_truncated_completions``): they are still graded, count in their group's baseline and
    in their mini-batch's mean, and are logged (``train/truncated_frac/<agent>``)."""
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
    memory_fraction: float = 0.9
    """Share of each device's memory (a GPU's, or the machine's RAM on CPU) the memory plan may fill; it sizes
    generation and evaluation batches and their KV cache (``python -m workbench plan`` prints the plan)."""
    engine: str = "hf"
    """What samples the rollouts: ``hf`` (the workbench's decode loop on the trained model) or ``vllm`` (a
    vLLM server per agent in its own environment, built by ``make engine``; the merged policy is reloaded
    after every update: `workbench.agents.generation.vllm_engine`, ``docs/engine.md``). Old log-probs are
    the trainer's own scoring pass either way."""
    engine_eager: bool = False
    """With ``engine: vllm``: skip vLLM's compilation (a server starts in ≈ 45 s instead of ≈ 2 min on 2
    CPU cores; sampling speed: ``docs/engine.md``)."""
    engine_kv_gib: float = 1.0
    """With ``engine: vllm``: the KV cache of each agent's server, GiB (``VLLM_CPU_KVCACHE_SPACE`` on CPU,
    ``--kv-cache-memory-bytes`` on a GPU); the memory plan counts it with the server's weights and runtime."""
    engine_is_cap: float | None = None
    """With ``engine: vllm``: truncated importance sampling for the sampler/trainer mismatch, each own row's
    loss weighted by min(exp(mean log π_train/π_vLLM), this cap)
    (`workbench.core.losses.truncated_sampler_weights`); null = off (the measured gap: ``docs/engine.md``)."""
    compile_decode: bool = False
    """Run the rollout decode step under ``torch.compile`` (CUDA graphs on GPU, mode ``reduce-overhead``) over
    a static KV cache: rows stay in the batch until all have finished."""

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
        require(self.engine in ENGINES, "train.engine", self.engine, f"one of {list(ENGINES)}")
        require(self.engine_kv_gib > 0, "train.engine_kv_gib", self.engine_kv_gib, "> 0")
        cap = self.engine_is_cap
        require(cap is None or cap >= 1, "train.engine_is_cap", cap, ">= 1 or null (off)")
        require(self.micro_batch_size >= 1, "train.micro_batch_size", self.micro_batch_size, ">= 1")
        mbt = self.micro_batch_tokens
        require(mbt is None or mbt >= 1, "train.micro_batch_tokens", mbt, ">= 1 or null")
        require(self.lr > 0, "train.lr", self.lr, "> 0")
        require(
            self.lr_schedule in LR_SCHEDULES, "train.lr_schedule", self.lr_schedule, f"one of {LR_SCHEDULES}"
        )
        require(
            0 <= self.warmup_steps <= self.steps, "train.warmup_steps", self.warmup_steps, "in [0, steps]"
        )
        require(0 <= self.warmup_ratio < 1, "train.warmup_ratio", self.warmup_ratio, "in [0, 1)")
        require(
            not (self.warmup_steps and self.warmup_ratio),
            "train.warmup_ratio",
            self.warmup_ratio,
            f"0 when train.warmup_steps is set ({self.warmup_steps}): one of the two",
        )
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
        require(0 < self.memory_fraction <= 1, "train.memory_fraction", self.memory_fraction, "in (0, 1]")

    @property
    def warmup(self) -> int:
        """Warm-up steps of the schedule: ``warmup_steps``, or ``ceil(warmup_ratio · steps)``."""
        return self.warmup_steps or math.ceil(self.warmup_ratio * self.steps)


@dataclass(frozen=True)
class HacpoConfig:
    """HACPO hyperparameters and switches (the paper's Section 3 and Table 5, and the authors' code)."""

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
    """All-equal reward group → plain mean baseline (code guard); false only with ``normalize_by_std: false``
    (an all-equal group has σ = 0: its advantages would be (R − μ̂)/1e-6)."""
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
    naive_symmetric: bool = False
    """Naive only (``algorithm: naive``): a shared sample's ratio is taken against the learner's own policy at
    the start of the step instead of the source's old log-probs, so GSPO's clip treats the partner's correct
    and wrong answers alike (the ``naive-sym`` method, ``docs/methods.md``)."""
    own_advantage: str = "joint"
    """When sharing, the advantage of a learner's own rows: ``joint`` (Eq. 6, against its capability-aware
    baseline over the joint group, as the paper) or ``group`` (Eq. 5, against its own G answers, so they sum
    to 0 per prompt; shared rows keep Eq. 6; beyond the paper, the ``hacpo-owngroup`` method)."""
    batch_order: str = "own_first"
    """When sharing, the order of a learner's rows over its mini-batches: ``own_first`` (its own rows, then
    each source's, as the authors' verl-v1 port: shared rows meet the later, tighter stepwise bounds) or
    ``by_prompt`` (each prompt's own and shared rows together, so every mini-batch mixes them, as the
    authors' main branch did; the ``hacpo-mixed`` method)."""

    def __post_init__(self) -> None:
        coerce_fields(self, "hacpo")
        for name in HACPO_KNOBS:  # alpha, delta, delta_step, window, min_ratio, max_ratio
            if problem := knob_problem(name, getattr(self, name), f"hacpo.{name}"):
                raise ConfigError(problem, key=f"hacpo.{name}")
        require(self.capability_floor > 0, "hacpo.capability_floor", self.capability_floor, "> 0")
        require(self.warmup_steps >= 0, "hacpo.warmup_steps", self.warmup_steps, ">= 0")
        require(0 <= self.eps_low < 1, "hacpo.eps_low", self.eps_low, "in [0, 1)")
        require(self.eps_high >= 0, "hacpo.eps_high", self.eps_high, ">= 0")
        require(self.max_abs_log_ratio > 0, "hacpo.max_abs_log_ratio", self.max_abs_log_ratio, "> 0")
        norm = self.ratio_normalization
        require(
            norm in RATIO_NORMALIZATIONS, "hacpo.ratio_normalization", norm, f"one of {RATIO_NORMALIZATIONS}"
        )
        own = self.own_advantage
        require(own in OWN_ADVANTAGES, "hacpo.own_advantage", own, f"one of {OWN_ADVANTAGES}")
        order = self.batch_order
        require(order in BATCH_ORDERS, "hacpo.batch_order", order, f"one of {BATCH_ORDERS}")
        require(
            self.uniform_group_guard or not self.normalize_by_std,
            "hacpo.uniform_group_guard",
            self.uniform_group_guard,
            "false only with hacpo.normalize_by_std: false. With normalize_by_std = true an all-equal reward "
            "group has σ = 0, so its advantages are (R − μ̂)/1e-6 (250,000 for R − μ̂ = 0.25) whenever ω ≠ 1; "
            "keep the guard on, or set hacpo.normalize_by_std: false",
        )


@dataclass(frozen=True)
class OutputConfig:
    """Where runs go."""

    root: str = "results/runs"
    """Root of run directories: ``<root>/<experiment>/<run-id>/``; the default is the notebooks' too, so a run
    of the command line shows in ``05_figures``."""
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
class RayConfig:
    """Ray cluster and per-agent resources of ``executor: ray`` (`workbench.train.executors.RayOptions`)."""

    address: str | None = None
    """Ray cluster to join: None = ``$RAY_ADDRESS`` if set, else a local Ray started for the run; ``auto`` =
    the running cluster; or ``ray://host:10001`` / ``host:6379``."""
    cpus_per_agent: float = 1.0
    """CPUs each agent's actor reserves; its torch threads = max(1, int(cpus_per_agent))."""
    gpus_per_agent: float | None = None
    """GPUs each CUDA agent reserves; None = 1 for an agent on ``cuda``/``cuda:N``/``auto`` (when the cluster
    has GPUs), 0 on ``cpu``. Fractions (0.5) let two small agents share a GPU."""

    def __post_init__(self) -> None:
        coerce_fields(self, "ray")
        if self.address is not None:
            require(bool(self.address.strip()), "ray.address", self.address, "a cluster address or null")
        require(self.cpus_per_agent > 0, "ray.cpus_per_agent", self.cpus_per_agent, "> 0")
        gpus = self.gpus_per_agent
        require(gpus is None or gpus >= 0, "ray.gpus_per_agent", gpus, ">= 0 or null (1 per CUDA agent)")
