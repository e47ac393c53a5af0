"""`AgentWorker`: one agent, its optimizer and its step's own rollouts, in the trainer's process or an actor.

The driver (`workbench.train.trainer.Trainer`) runs Algorithm 1 and talks to each agent only through a
worker's four calls, whose arguments and results are text, rewards and scalars (`workbench.train.exchange`):

    rollout(prompts)                     generate G responses per prompt, then the one no-grad pass over them
                                         (old + KL reference log-probs, `score_self`) → SharedRollouts
    update(cross, advantages, ω, step)   build the learner's batch (own token ids + cross text re-encoded),
                                         mini-batch updates → metrics and per-sample ratios
    evaluate(items)                      greedy accuracy rows and per-item results
    state_dict() / load_state_dict()     adapter or full weights + optimizer state (checkpoints only)

The worker keeps its own rollouts' token ids and `SelfScores` between ``rollout`` and ``update`` of a step, so
nothing about a learner's own tokens ever leaves it. Every forward pass runs in `precision` (bf16 autocast
for full fine-tuning on CUDA).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from workbench.agents.agent import Agent
from workbench.agents.engine import RolloutEngine, TransformersEngine, check_rollouts
from workbench.agents.hf import precision
from workbench.agents.loading import load_agent
from workbench.agents.memory import device_key, device_memory
from workbench.agents.tokens import self_token_batch
from workbench.config.agent_spec import AgentSpec
from workbench.core.losses import LossParams
from workbench.core.types import Rollout, TaskItem
from workbench.train.batches import build_learner_batch
from workbench.train.evaluate import evaluate
from workbench.train.exchange import RolloutReport, SharedRollout, UpdateReport, as_cross_rollout, share
from workbench.train.plan import AgentFacts
from workbench.train.update import SelfScores, UpdateSettings, learner_metrics, score_self, update_learner

__all__ = ["AgentWorker", "WorkerSettings"]

log = logging.getLogger(__name__)


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
    compile_decode: bool = False
    """The built-in engine decodes under ``torch.compile`` (`workbench.agents.engine.TransformersEngine`)."""


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
        engine: Builds the rollout engine of the loaded agent (`workbench.agents.engine`); None = the
            built-in `TransformersEngine`.
    """

    def __init__(
        self,
        spec: AgentSpec,
        index: int,
        names: list[str],
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
        self.index, self.names, self.settings = index, names, settings
        self.agent = load_agent(spec)
        # Digest of the starting weights, before anything can change them (the run's environment record).
        self._start_digest = self.agent.weights_digest()
        self.optimizer = torch.optim.AdamW(
            self.agent.trainable_parameters(),
            lr=settings.lr,
            betas=settings.betas,
            weight_decay=settings.weight_decay,
        )
        self.engine = (
            engine(self.agent)
            if engine is not None
            else TransformersEngine(self.agent, compile_decode=settings.compile_decode)
        )
        self.memory_budget: int | None = None
        self._own: list[Rollout] = []
        self._scores: SelfScores | None = None

    def ready(self) -> str:
        """Where the agent sits (a Ray actor's first answer: loading errors surface here)."""
        return f"{self.agent.name} on {self.agent.device} ({torch.get_num_threads()} threads)"

    def start_weights(self) -> str:
        """`workbench.agents.agent.state_digest` of the agent's weights as loaded, before any update."""
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
    def rollout(self, prompts: list[str], *, n: int, seed: int) -> RolloutReport:
        """G responses per prompt with the current (= old) policy, then the one no-grad pass over them.

        Args:
            prompts: The step's prompts (user contents).
            n: Responses per prompt (G).
            seed: Sampling seed of this agent and step.

        Returns:
            The rollouts as `SharedRollout` (old log-likelihoods filled) and the phase times.
        """
        s, t = self.settings, self.settings.update
        t0 = time.perf_counter()
        with precision(self.agent):
            rollouts = self.engine.generate(
                prompts,
                n,
                temperature=t.temperature,
                top_p=s.top_p,
                max_new_tokens=s.max_new_tokens,
                author=self.index,
                seed=seed,
            )
            check_rollouts(
                self.agent, prompts, n, rollouts, author=self.index, max_new_tokens=s.max_new_tokens
            )
            t1 = time.perf_counter()
            scores = score_self(self.agent, self_token_batch(rollouts, self.agent.pad_token_id), t)
        for rollout, total, count in zip(rollouts, scores.old_logp_sum, scores.old_logp_count):
            rollout.old_logp_sum, rollout.old_logp_count = total, count
        self._own, self._scores = rollouts, scores
        return RolloutReport([share(r) for r in rollouts], t1 - t0, time.perf_counter() - t1)

    def update(
        self,
        cross: list[SharedRollout],
        advantages_P_A_G: torch.Tensor,
        coef_A: torch.Tensor,
        *,
        where: str,
    ) -> UpdateReport:
        """This learner's mini-batch updates on its own rollouts of the step and the shared ``cross`` ones.

        Args:
            cross: Other agents' rollouts to train on, grouped by author in agent order (empty: no sharing).
            advantages_P_A_G: This learner's advantage of every rollout of the step.
            coef_A: Loss coefficient of each author's samples (ω^(a, k) for HACPO, else ones).
            where: Names the step and learner in a non-finite-loss error.

        Returns:
            The learner's metrics and its per-sample advantages, ratios and bounds.
        """
        if self._scores is None:
            raise RuntimeError(f"agent {self.agent.name!r}: update before rollout in this step")
        batch = build_learner_batch(
            self.agent,
            self.index,
            self._own,
            [as_cross_rollout(r) for r in cross],
            advantages_P_A_G,
            coef_A,
            ratio_normalization=self.settings.ratio_normalization,
        )
        scores, self._scores = self._scores, None  # one update per rollout: the scores are of the old policy
        with precision(self.agent):
            update = update_learner(
                self.agent,
                self.optimizer,
                batch,
                scores,
                self.settings.loss,
                self.settings.update,
                where=where,
            )
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
        return UpdateReport(learner_metrics(self.agent.name, self.names, batch, update), samples)

    def evaluate(
        self, items: list[TaskItem], *, k: int = 0, **kwargs: Any
    ) -> tuple[list[dict[str, Any]], dict[str, float], list[dict[str, Any]]]:
        """Greedy accuracy and, with ``k`` > 0, sampled avg@k (`workbench.train.evaluate.evaluate` keywords).

        Returns:
            The summary rows for ``evals.csv``, ``{"greedy_acc": ..., "avg@k": ...}``, and the per-item rows
            for ``eval_items.csv`` (`workbench.train.evaluate.EvalResult.item_rows`).
        """
        with precision(self.agent):
            result = evaluate(
                self.agent,
                items,
                k=k,
                greedy=True,
                agent_name=self.agent.name,
                memory_budget=self.memory_budget,
                **kwargs,
            )
        summary = result.summary
        wanted = ["greedy_acc"] + ([f"avg@{k}"] if k else [])
        values = {
            metric: float(summary.loc[summary["metric"] == metric, "value"].iloc[0])
            if (summary["metric"] == metric).any()
            else float("nan")
            for metric in wanted
        }
        return result.rows(), values, result.item_rows()

    # ----------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Trainable weights and optimizer state, on CPU (a driver without the agent's GPU can hold them)."""
        return {"agent": self.agent.trainable_state_dict(), "optimizer": _on_cpu(self.optimizer.state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (optimizer tensors move to the agent's device)."""
        self.agent.load_trainable_state_dict(state["agent"])
        self.optimizer.load_state_dict(state["optimizer"])
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
