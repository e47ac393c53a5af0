"""What builds an agent's worker: `WorkerSettings` (every worker's optimizer, update, loss and sampling
settings, read once from the config and the methods table) and `WorkerArgs` (one agent's spec, index and
those settings). Both are frozen and picklable: they travel to Ray actors (`workbench.train.executors`).
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.agents.generation.vllm_engine import engine_python
from workbench.config.agent_spec import AgentSpec
from workbench.config.experiment import ExperimentConfig
from workbench.core.losses import LossParams
from workbench.train.batches import UpdateSettings

__all__ = ["WorkerArgs", "WorkerSettings"]


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker needs besides its agent spec (picklable: it travels to Ray actors)."""

    update: UpdateSettings
    """Mini-batch sizes, loss name, temperature, KL, gradient clip."""
    loss: LossParams
    """The loss scalars."""
    lr: float
    """AdamW learning rate."""
    weight_decay: float
    """AdamW weight decay."""
    top_p: float
    """Rollout nucleus threshold."""
    max_new_tokens: int
    """Rollout length cap."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (β1, β2)."""
    ratio_normalization: str = "tokens"
    """How a cross sample's log-likelihoods are length-normalised (``tokens`` or ``bytes``)."""
    batch_order: str = "own_first"
    """Order of a learner's rows over its mini-batches (``own_first`` or ``by_prompt``)."""
    compile_decode: bool = False
    """The built-in engine decodes under ``torch.compile``
    (`workbench.agents.generation.engine.TransformersEngine`)."""
    engine: str = "hf"
    """What samples the rollouts (``hf`` or ``vllm``, `workbench.config.sections.TrainConfig.engine`)."""
    engine_python: str = ""
    """With ``vllm``: the engine environment's interpreter (checked before any model loads)."""
    engine_eager: bool = False
    """With ``vllm``: skip vLLM's compilation."""
    engine_kv_gib: float = 1.0
    """With ``vllm``: the KV cache of the agent's server, GiB."""
    engine_is_cap: float | None = None
    """With ``vllm``: the truncation of the sampler/trainer importance weight of own rows; None = off."""
    lr_schedule: str = "constant"
    """Learning-rate schedule (``agents[i].lr_schedule`` overrides it for one agent)."""
    warmup: int = 0
    """Warm-up steps of the schedule."""
    steps: int = 1
    """Training steps of the run (the schedule's length)."""

    @classmethod
    def from_config(cls, cfg: ExperimentConfig) -> WorkerSettings:
        """What every worker needs from the config: optimizer, update and loss scalars, sampling caps."""
        h, t, method = cfg.hacpo, cfg.train, cfg.step_method
        return cls(
            update=UpdateSettings(
                loss=method.loss,
                minibatch_size=t.minibatch_prompts * t.group_size,
                micro_batch_size=t.micro_batch_size,
                micro_batch_tokens=t.micro_batch_tokens,
                temperature=t.temperature,
                kl_coef=t.kl_coef,
                grad_clip=t.grad_clip,
                skip_uniform_groups=t.skip_uniform_groups,
                cross_old_from_learner=method.shared_old_policy == "learner",
                mask_truncated=t.mask_truncated,
            ),
            loss=LossParams(
                eps_low=method.eps_low,
                eps_high=method.eps_high,
                alpha=h.alpha,
                delta=h.delta,
                delta_step=h.delta_step,
                max_abs_log_ratio=h.max_abs_log_ratio,
                clip_cross=h.clip_cross,
            ),
            lr=t.lr,
            weight_decay=t.weight_decay,
            top_p=t.top_p,
            max_new_tokens=t.max_new_tokens,
            betas=(t.adam_beta1, t.adam_beta2),
            ratio_normalization=method.ratio_normalization,
            batch_order=method.batch_order,
            compile_decode=t.compile_decode,
            engine=t.engine,
            engine_python=str(engine_python()) if t.engine == "vllm" else "",
            engine_eager=t.engine_eager,
            engine_kv_gib=t.engine_kv_gib,
            engine_is_cap=t.engine_is_cap,
            lr_schedule=t.lr_schedule,
            warmup=t.warmup,
            steps=t.steps,
        )


@dataclass(frozen=True)
class WorkerArgs:
    """What builds one agent's worker, the same in this process and in a Ray actor (picklable)."""

    spec: AgentSpec
    """The agent spec (loaded by the worker, so an actor loads its own model on its own device)."""
    index: int
    """The agent's index k."""
    names: tuple[str, ...]
    """Every agent's name, in agent order (metric keys name sources)."""
    settings: WorkerSettings
    """Optimizer, update and sampling settings."""

    @classmethod
    def of_experiment(cls, cfg: ExperimentConfig) -> list[WorkerArgs]:
        """One per agent of the experiment, in agent order."""
        names, settings = tuple(cfg.agent_names), WorkerSettings.from_config(cfg)
        return [cls(spec, k, names, settings) for k, spec in enumerate(cfg.agents)]
