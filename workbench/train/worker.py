"""`AgentWorker`: one agent, its optimizer and its step's own rollouts, in the trainer's process or an actor.

The driver (`workbench.train.trainer.Trainer`) runs Algorithm 1 and talks to each agent only through a
worker's calls, whose requests and reports are text, rewards and scalars (`workbench.train.exchange`):

    rollout(RolloutRequest)          generate G responses per prompt, then the one no-grad pass over them
                                     (old + KL reference log-probs, `workbench.train.scoring`)
    update(UpdateRequest)            build the learner's batch (own token ids + cross text re-encoded),
                                     mini-batch updates (`update_learner`) → metrics and per-sample ratios
    evaluate(EvalRequest)            greedy and sampled accuracy rows, per-item results
    state_dict() / load_state_dict() adapter or full weights + optimizer state (checkpoints only)

The worker keeps its own rollouts' token ids and old log-probs between ``rollout`` and ``update`` of a step,
so nothing about a learner's own tokens ever leaves it. Every forward pass runs in `precision` (bf16 autocast
for full fine-tuning on CUDA).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from workbench.agents.forward.agent import Agent, precision
from workbench.agents.generation.engine import RolloutEngine, TransformersEngine, check_rollouts
from workbench.agents.generation.vllm_engine import VLLMEngine
from workbench.agents.models.loading import load_agent
from workbench.agents.models.schedules import lr_scheduler
from workbench.agents.plan.memory import device_key, device_memory
from workbench.config.agent_spec import AgentSpec
from workbench.core.losses import truncated_sampler_weights
from workbench.core.types import Rollout
from workbench.train.batches import build_learner_batch
from workbench.train.evaluate import evaluate
from workbench.train.exchange import (
    EvalReport,
    EvalRequest,
    RolloutReport,
    RolloutRequest,
    UpdateReport,
    UpdateRequest,
    WorkerState,
    as_cross_rollout,
    share,
)
from workbench.train.metrics import engine_metrics, learner_metrics
from workbench.train.plan import AgentFacts
from workbench.train.scoring import OldScores, sampler_log_ratios, score_own, set_old_policy
from workbench.train.settings import WorkerArgs, WorkerSettings
from workbench.train.update import update_learner

__all__ = ["AgentWorker"]

log = logging.getLogger(__name__)


class AgentWorker:
    """One agent with its optimizer; the unit the executors run (in-process or as a Ray actor).

    Args:
        spec: The agent spec (loaded here, so a Ray actor loads its own model on its own device).
        index: The agent's index k.
        names: Every agent's name, in agent order (metric keys name sources).
        settings: Optimizer, update and sampling settings.
        seed: Seeds the global RNGs before loading (a Ray actor's own process); None leaves them alone
            (in-process, the trainer seeded once).
        threads: ``torch.set_num_threads`` for this worker's process (Ray actors); None leaves it alone.
        engine: Builds the rollout engine of the loaded agent (`workbench.agents.generation.engine`); None =
            the built-in `TransformersEngine`.
    """

    def __init__(
        self,
        spec: AgentSpec,
        index: int,
        names: Sequence[str],
        settings: WorkerSettings,
        *,
        seed: int | None = None,
        threads: int | None = None,
        engine: Callable[[Agent], RolloutEngine] | None = None,
    ) -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        if seed is not None:
            torch.manual_seed(seed)
            random.seed(seed)
        self.index, self.names, self.settings = index, list(names), settings
        self.agent = load_agent(spec)
        # Digest of the starting weights, before anything can change them (the run's environment record).
        self._start_digest = self.agent.weights_digest()
        self.optimizer = torch.optim.AdamW(
            self.agent.trainable_parameters(),
            lr=spec.lr or settings.lr,
            betas=settings.betas,
            weight_decay=settings.weight_decay,
        )
        self.scheduler = lr_scheduler(
            self.optimizer,
            spec.lr_schedule or settings.lr_schedule,
            warmup=settings.warmup,
            steps=settings.steps,
        )
        self.engine = engine(self.agent) if engine is not None else self._built_in_engine(settings)
        self.memory_budget: int | None = None
        self._own: list[Rollout] = []
        self._own_scores: OldScores | None = None

    def _built_in_engine(self, settings: WorkerSettings) -> RolloutEngine:
        if settings.engine == "vllm":  # its server starts at the first rollout, on the weights of then
            return VLLMEngine(
                self.agent,
                Path(settings.engine_python),
                enforce_eager=settings.engine_eager,
                threads=torch.get_num_threads(),
                kv_cache_bytes=int(settings.engine_kv_gib * 2**30),
            )
        return TransformersEngine(self.agent, compile_decode=settings.compile_decode)

    def close(self) -> None:
        """Stop what the engine runs beside the trainer (a vLLM server); the agent stays usable."""
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    @classmethod
    def build(cls, args: WorkerArgs, **options: Any) -> AgentWorker:
        """The worker of ``args`` (``options``: ``seed``, ``threads``, ``engine``, as for the constructor)."""
        return cls(args.spec, args.index, args.names, args.settings, **options)

    def ready(self) -> str:
        """Where the agent sits (a Ray actor's first answer: loading errors surface here)."""
        return f"{self.agent.name} on {self.agent.device} ({torch.get_num_threads()} threads)"

    def start_weights(self) -> str:
        """`workbench.agents.forward.agent.state_digest` of the agent's weights as loaded, before any
        update."""
        return self._start_digest

    def memory_facts(self, prompts: list[str]) -> AgentFacts:
        """What the memory plan needs about this agent (`workbench.train.plan`): its model config, its device
        and that device's memory, and the longest of ``prompts`` in its tokens."""
        longest = max((len(self.agent.encode_prompt(p)) for p in prompts), default=1)
        return AgentFacts(
            config=self.agent.model.config.to_dict(),
            device=device_key(self.agent.device),
            device_memory=device_memory(self.agent.device),
            prompt_tokens=longest,
            source=self.agent.source,
        )

    def use_memory_budget(self, budget: int) -> None:
        """Bytes this agent's generation and evaluation batches may use (the trainer's memory plan)."""
        self.memory_budget = budget
        if isinstance(self.engine, TransformersEngine):
            self.engine.memory_budget = budget

    # ------------------------------------------------------------------------------------------ step
    def rollout(self, request: RolloutRequest) -> RolloutReport:
        """G responses per prompt with the current (= old) policy, then the one no-grad pass over them.

        Returns:
            The rollouts as `SharedRollout` (old log-likelihoods filled) and the phase times.
        """
        s, t = self.settings, self.settings.update
        prompts, n = request.prompts, request.n
        t0 = time.perf_counter()
        with precision(self.agent):
            rollouts = self.engine.generate(
                prompts,
                n,
                temperature=t.temperature,
                top_p=s.top_p,
                max_new_tokens=s.max_new_tokens,
                author=self.index,
                seed=request.seed,
            )
            check_rollouts(
                self.agent, prompts, n, rollouts, author=self.index, max_new_tokens=s.max_new_tokens
            )
            t1 = time.perf_counter()
            self._own, self._own_scores = rollouts, score_own(self.agent, rollouts, t)
        return RolloutReport([share(r) for r in rollouts], t1 - t0, time.perf_counter() - t1)

    def update(self, request: UpdateRequest) -> UpdateReport:
        """This learner's mini-batch updates on its own rollouts of the step and the shared ones it is sent.

        Returns:
            The learner's metrics and its per-sample advantages, ratios and bounds.
        """
        if self._own_scores is None:
            raise RuntimeError(f"agent {self.agent.name!r}: update before rollout in this step")
        t = self.settings.update
        own_scores, self._own_scores = self._own_scores, None  # the scores are of the old policy: used once
        batch = build_learner_batch(
            self.agent,
            self.index,
            self._own,
            [as_cross_rollout(r) for r in request.cross],
            request.advantages_P_A_G,
            request.coef_A,
            ratio_normalization=self.settings.ratio_normalization,
            batch_order=self.settings.batch_order,
            skip_uniform_groups=t.skip_uniform_groups,
            mask_truncated=t.mask_truncated,
        )
        lr = self.optimizer.param_groups[0]["lr"]
        with precision(self.agent):
            set_old_policy(self.agent, batch, own_scores, t)
            gaps = sampler_log_ratios(self._own, own_scores)
            correction = None
            if gaps is not None and self.settings.engine_is_cap is not None:  # truncated IS on own rows
                mean_B = torch.stack([g.mean() if g.numel() else g.new_zeros(()) for g in gaps])
                weight_B, correction = truncated_sampler_weights(mean_B, self.settings.engine_is_cap)
                batch.advantages_B[own_scores.rows] *= weight_B
            update = update_learner(
                self.agent, self.optimizer, batch, self.settings.loss, t, where=request.where
            )
        self.scheduler.step()  # the next step's rate (once per training step, `lr_scheduler`)
        self.engine.sync()
        samples = {
            r.id: {"advantage": a, "ratio": s, "lower_bound": lo, "upper_bound": hi}
            for r, a, s, lo, hi in zip(
                batch.rollouts,
                batch.advantages_B.tolist(),
                update.ratio_B.tolist(),
                update.lower_B.tolist(),
                update.upper_B.tolist(),
            )
        }
        metrics = learner_metrics(self.agent.name, self.names, batch, update, skipping=t.skip_uniform_groups)
        metrics[f"train/lr/{self.agent.name}"] = lr
        if gaps is not None:
            metrics |= engine_metrics(
                self.agent.name, gaps, correction, getattr(self.engine, "sync_seconds", 0.0)
            )
        return UpdateReport(metrics, samples)

    def evaluate(self, request: EvalRequest) -> EvalReport:
        """Greedy accuracy and, with ``k`` > 0, sampled avg@k on one held-out set.

        Returns:
            The summary rows for ``evals.csv``, ``{"greedy_acc": ..., "avg@k": ...}``, and the per-item rows
            for ``eval_items.csv`` (`workbench.train.evaluate.EvalResult.item_rows`).
        """
        with precision(self.agent):
            result = evaluate(
                self.agent,
                request.items,
                k=request.k,
                temperature=request.temperature,
                max_new_tokens=request.max_new_tokens,
                greedy=True,
                benchmark=request.benchmark,
                instruction=request.instruction,
                method=request.reward,
                agent_name=self.agent.name,
                memory_budget=self.memory_budget,
            )
        summary, k = result.summary, request.k
        wanted = ["greedy_acc"] + ([f"avg@{k}"] if k else [])
        values = {
            metric: float(summary.loc[summary["metric"] == metric, "value"].iloc[0])
            if (summary["metric"] == metric).any()
            else float("nan")
            for metric in wanted
        }
        return EvalReport(result.rows(), values, result.item_rows())

    # ----------------------------------------------------------------------------------------- state
    def state_dict(self) -> WorkerState:
        """Trainable weights, optimizer and schedule state, on CPU (a driver without the agent's GPU can hold
        them)."""
        return WorkerState(
            self.agent.trainable_state_dict(),
            _on_cpu(self.optimizer.state_dict()),
            self.scheduler.state_dict(),
        )

    def load_state_dict(self, state: WorkerState) -> None:
        """Restore what `state_dict` returned (optimizer tensors move to the agent's device). A checkpoint
        written before schedules were saved has none: its run had a constant rate, which the optimizer's own
        state already holds."""
        self.agent.load_trainable_state_dict(state.agent)
        self.optimizer.load_state_dict(state.optimizer)
        if state.scheduler:
            self.scheduler.load_state_dict(state.scheduler)
        self.engine.sync()


def _on_cpu(tree: Any) -> Any:
    """``tree`` with every tensor on CPU (tensors already there are not copied)."""
    if torch.is_tensor(tree):
        return tree.cpu()
    if isinstance(tree, dict):
        return {k: _on_cpu(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_on_cpu(v) for v in tree)
    return tree
