"""The collaborative trainer: one step reads like the paper's Algorithm 1 (``docs/hacpo.md``, "One step").

    1. roll out: every agent answers the step's prompts and scores its answers once (old log-probs)
    2. verify every answer with the shared reward
    3. capability P̂ (Eq. 9) and ω (Eq. 8)
    4. advantages (Eqs. 5-7)
    5. per learner: its batch (own samples first, shared samples re-encoded from text), mini-batch updates
       with the stepwise bound of each mini-batch
    6. log

The agents live in workers (`workbench.train.worker`) run in this process or in Ray actors
(`workbench.train.executors`); this driver exchanges only the records of `workbench.train.exchange` (text,
rewards and scalars) with them, one typed call per phase.

Every place that departs from plain GSPO carries a comment starting with ``HACPO:`` (the README's grep lists
them all, here and in the modules the step calls). Baselines and ablations are
configurations (``workbench.config.METHODS`` and the ``hacpo`` section), never forked code: the step reads
what a method does from its row of the method table, never its name.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from workbench.config.experiment import ExperimentConfig
from workbench.core.advantages import (
    CapabilityTracker,
    capability_aware_advantages,
    capability_ratios,
    group_advantages,
)
from workbench.core.types import TaskItem
from workbench.tasks.prompts import build_prompt
from workbench.tasks.rewards import grade_batch
from workbench.tasks.sources import load_tasks
from workbench.train.checkpoint import (
    capture_rng_state,
    restore_rng_state,
    save_checkpoint,
)
from workbench.train.evaluate import HeldOutSet, held_out_sets
from workbench.train.exchange import (
    EvalRequest,
    RolloutRequest,
    SharedRollout,
    UpdateReport,
    UpdateRequest,
    WorkerState,
)
from workbench.train.executors import Executor, RayOptions, make_executor
from workbench.train.plan import plan_experiment
from workbench.train.rundir import RunWriter
from workbench.train.update import TrainingError
from workbench.train.worker import WorkerSettings

__all__ = ["Trainer", "TrainingError"]

log = logging.getLogger(__name__)


class Trainer:
    """Holds a run's agent workers, capability tracker and writer; `workbench.train.run.fit` runs the steps.

    Each agent lives in an `AgentWorker` (its model, optimizer and own token ids) run by an executor: in this
    process (``executor: local``, the default, one after another; ``threads``, all at once) or in one Ray
    actor per agent (``executor: ray``), see `workbench.train.executors`. The driver below sees text, rewards
    and scalars only.

    Args:
        cfg: A validated experiment config.
        run_dir: The run directory (created or resumed by :func:`train`).
        on_step: Called with each step's metric dict after it is logged (widgets, notebooks).
        executor: ``local``, ``threads`` or ``ray``; None = the config's ``executor`` (default ``local``); or
            an `Executor` already holding the workers (tests drive the step with scripted workers).
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: Path,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        *,
        executor: str | Executor | None = None,
    ) -> None:
        self.cfg = cfg
        self.algo = cfg.algo
        self.run_dir = run_dir
        self.writer = RunWriter(run_dir)
        self.on_step = on_step
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self.names = [spec.display_name for spec in cfg.agents]
        h = cfg.hacpo
        if executor is None or isinstance(executor, str):
            executor = make_executor(
                executor or cfg.executor,
                [
                    {
                        "spec": spec,
                        "index": k,
                        "names": self.names,
                        "settings": WorkerSettings.from_config(cfg),
                    }
                    for k, spec in enumerate(cfg.agents)
                ],
                seed=cfg.seed,
                ray_options=RayOptions.from_config(cfg.ray),
            )
        self.executor: Executor = executor
        self.tracker = CapabilityTracker(len(self.names), window=h.window, floor=h.capability_floor)
        self.train_items: list[TaskItem] = load_tasks(
            cfg.task.source, split="train", n=cfg.task.train_size, seed=cfg.seed, **cfg.task.knobs
        )
        # The main held-out set, then one per task.eval_sources entry (none when task.eval_size is 0).
        self.held_out: list[HeldOutSet] = held_out_sets(cfg)
        # One memory plan gives every agent the bytes its generation and evaluation batches may use: its
        # device's train.memory_fraction, less the runtime and every agent's weights and optimizer state.
        sample = [build_prompt(item.question, cfg.task.instruction) for item in self.train_items[:64]]
        self.memory_plan = plan_experiment(cfg, self.executor.memory_facts(sample))
        self.executor.use_memory_budgets(self.memory_plan.budgets)
        for warning in self.memory_plan.warnings:
            log.warning("memory plan: %s", warning)
        self.step = 0
        self.cost = {f"cost/{n}/{k}": 0.0 for n in self.names for k in _COST_KEYS}
        self._orders: dict[int, list[int]] = {}

    def close(self) -> None:
        """Releases the workers (Ray actors end; in-process nothing to do)."""
        self.executor.close()

    # ----------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue identically (weights come from every worker)."""
        state: dict[str, Any] = {
            "trainer": {"step": self.step, "cost": dict(self.cost)},
            "tracker": self.tracker.state_dict(),
            "rng": capture_rng_state(),
        }
        for i, part in enumerate(self.executor.state_dicts()):
            state[f"agent_{i}"] = part.agent
            state[f"optimizer_{i}"] = part.optimizer
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        self.executor.load_state_dicts(
            [WorkerState(state[f"agent_{i}"], state[f"optimizer_{i}"]) for i in range(len(self.names))]
        )
        self.tracker.load_state_dict(state["tracker"])
        self.step = int(state["trainer"]["step"])
        self.cost = dict(state["trainer"]["cost"])
        restore_rng_state(state["rng"])

    def save(self) -> Path:
        """Checkpoint the current step."""
        return save_checkpoint(
            self.run_dir, self.step, self.state_dict(), keep_last=self.cfg.train.keep_checkpoints
        )

    # ------------------------------------------------------------------------------------ evaluation
    def start_weights(self) -> dict[str, str]:
        """Per agent: the digest of its weights as loaded, before any update (`AgentWorker.start_weights`)."""
        return dict(zip(self.names, self.executor.start_weights()))

    def evaluate(self) -> dict[str, float]:
        """Greedy accuracy and sampled avg@k of every agent on every held-out set, appended to ``evals.csv``
        (and each item's results to ``eval_items.csv``).

        Logs ``eval/acc/<agent>`` (greedy) and ``eval/avg@k/<agent>`` (k = ``train.eval_samples`` responses
        per item at ``train.eval_temperature``, when k > 0) on the main set, and the same under
        ``eval/<source>/`` on each of ``task.eval_sources`` (`workbench.train.evaluate.held_out_sets`).
        """
        if not self.held_out:
            return {}
        t, task = self.cfg.train, self.cfg.task
        metrics, rows, item_rows = {}, [], []
        for held_out in self.held_out:
            request = EvalRequest(
                items=held_out.items,
                benchmark=held_out.benchmark,
                max_new_tokens=t.eval_max_new_tokens or t.max_new_tokens,
                instruction=task.instruction,
                reward=task.reward,
                k=t.eval_samples,
                temperature=t.eval_temperature,
            )
            for name, report in zip(self.names, self.executor.evaluate(request)):
                rows += report.rows
                item_rows += report.item_rows
                metrics[f"{held_out.prefix}/acc/{name}"] = report.values["greedy_acc"]
                if t.eval_samples:
                    k = t.eval_samples
                    metrics[f"{held_out.prefix}/avg@{k}/{name}"] = report.values[f"avg@{k}"]
        self.writer.append_eval_items(self.step, item_rows)
        self.writer.append_evals(self.step, rows)
        return metrics

    # ------------------------------------------------------------------------------------ one step
    def _epoch_order(self, epoch: int) -> list[int]:
        """The seeded permutation of the training items for one epoch (the last two are kept).

        A per-instance cache: a method-level ``lru_cache`` would hold every Trainer alive, and with it its
        models and Ray actors.
        """
        if epoch not in self._orders:
            order = list(range(len(self.train_items)))
            random.Random(self.cfg.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {e: o for e, o in self._orders.items() if e == epoch - 1} | {epoch: order}
        return self._orders[epoch]

    def _prompt_batch(self, step: int) -> list[TaskItem]:
        """Prompts of ``step``: epochs of seeded permutations, so a resumed run sees the same batches."""
        n, size = len(self.train_items), self.cfg.train.prompts_per_step
        start = (step - 1) * size
        return [self.train_items[self._epoch_order(pos // n)[pos % n]] for pos in range(start, start + size)]

    def train_step(self) -> dict[str, float]:
        """One step of Algorithm 1 for every agent; returns its flat metrics."""
        cfg, h, method = self.cfg, self.cfg.hacpo, self.algo
        step = self.step + 1
        A, P, G = len(self.names), cfg.train.prompts_per_step, cfg.train.group_size * method.group_multiplier
        metrics: dict[str, float] = {}
        t0 = time.perf_counter()

        # 1. Every agent answers the same prompts, G responses each, with its current (= old) policy, and
        #    scores them once before any update: its old log-likelihoods, shared with the other learners.
        items = self._prompt_batch(step)
        prompts = [build_prompt(item.question, cfg.task.instruction) for item in items]
        reports = self.executor.rollout(
            [RolloutRequest(prompts, G, seed=cfg.seed * 1_000_003 + step * 101 + a) for a in range(A)]
        )
        rollouts_A = [report.rollouts for report in reports]

        # 2. Verify every response with the shared reward.
        rewards_P_A_G = self._grade(rollouts_A, items, P, G)
        t_rollout = time.perf_counter() - t0

        # 3. Capability P̂ of every agent (Eq. 9) and the ratios ω = P̂_k / P̂_j (Eq. 8).
        # HACPO: P̂ includes this step's batch accuracy, taken before advantages (Assumption D.1); ω ≡ 1 in
        # the warm-up steps. GSPO and Naive only log them.
        acc_A = rewards_P_A_G.mean(dim=(0, 2))
        self.tracker.update(acc_A)
        p_hat_A = self.tracker.p_hat()
        omega_A_A = capability_ratios(p_hat_A, h.min_ratio, h.max_ratio)
        if step <= h.warmup_steps:
            omega_A_A = torch.ones(A, A)

        # 4. Advantages: capability-aware over the joint group when sharing, per agent group otherwise.
        advantages_L_P_A_G = self._advantages(rewards_P_A_G, omega_A_A, metrics)

        # 5. Every learner updates from the same pre-update rollouts (the authors' code): one after another
        #    in-process, in parallel under Ray. It builds its batch from its own samples and the others' text.
        t1 = time.perf_counter()
        # HACPO: a cross sample's loss is scaled by ω^(source, learner) (Eq. 10); Naive and −ω keep 1.
        use_coef = method.omega_coef and h.omega_in_loss
        requests = [
            UpdateRequest(
                # HACPO: a learner trains on every other agent's rollouts too (Sec. 3.3); GSPO on its own.
                cross=[r for a in range(A) if a != k for r in rollouts_A[a]] if method.share_rollouts else [],
                advantages_P_A_G=advantages_L_P_A_G[k].clone(),
                coef_A=omega_A_A[:, k].clone() if use_coef else torch.ones(A),
                where=f"step {step}, learner {name!r}",
            )
            for k, name in enumerate(self.names)
        ]
        updates = self._update(requests)
        t_update = time.perf_counter() - t1

        # 6. Log: accuracy, capability, ω and cost per agent, each learner's update, phase times, samples.
        metrics |= self._step_metrics(rewards_P_A_G, p_hat_A, omega_A_A, rollouts_A, updates)
        self._accumulate_cost(metrics)
        metrics["time/rollout_s"] = t_rollout
        metrics["time/generate_s"] = sum(report.generate_s for report in reports)
        metrics["time/score_s"] = sum(report.score_s for report in reports)
        metrics["time/update_s"] = t_update
        metrics["time/step_s"] = time.perf_counter() - t0
        self.step = step
        self.writer.write_samples(step, self._sample_rows(rollouts_A, items, updates))
        return metrics

    def _grade(
        self, rollouts_A: list[list[SharedRollout]], items: list[TaskItem], P: int, G: int
    ) -> torch.Tensor:
        """``rewards_P_A_G`` of every rollout (each rollout's reward and grading reason are set too)."""
        flat = [r for rollouts in rollouts_A for r in rollouts]
        grades = grade_batch(
            [r.text for r in flat], [items[r.prompt_index].answer for r in flat], self.cfg.task.reward
        )
        rewards_P_A_G = torch.zeros(P, len(rollouts_A), G)
        for rollout, grade in zip(flat, grades):
            rollout.reward, rollout.grade_reason = grade.reward, grade.reason
            rewards_P_A_G[rollout.prompt_index, rollout.author, rollout.index] = rollout.reward
        return rewards_P_A_G

    def _advantages(
        self, rewards_P_A_G: torch.Tensor, omega_A_A: torch.Tensor, metrics: dict[str, float]
    ) -> torch.Tensor:
        """``advantages_L_P_A_G``: learner L's advantage of each response (0 where L never trains on it).

        Logs each learner's share of uniform groups (all rewards equal, advantage 0: the joint group when
        sharing, its own group otherwise) and their mean, and the share where the baseline guard fired.
        """
        h, method = self.cfg.hacpo, self.algo
        A = rewards_P_A_G.shape[1]
        if method.share_rollouts:
            # HACPO: the baseline weights source a's rewards by ω[L, a] (Eq. 7); −Adv and naive use ω ≡ 1.
            use_omega = method.capability_advantages and h.capability_baseline
            advantages, adv_metrics = capability_aware_advantages(
                rewards_P_A_G,
                omega_A_A if use_omega else torch.ones(A, A),
                normalize_by_std=h.normalize_by_std,
                uniform_group_guard=h.uniform_group_guard,
                max_reward=1.0 if h.binary_guard else None,
            )
            uniform_A = [adv_metrics["uniform_group_frac"]] * A  # every learner's groups are the joint ones
            for k, name in enumerate(self.names):
                metrics[f"adv/{name}/baseline_fallback_frac"] = adv_metrics[f"baseline_fallback_frac/{k}"]
        else:
            advantages, uniform_A = torch.zeros(A, *rewards_P_A_G.shape), []
            for k in range(A):
                advantages[k, :, k], adv_metrics = group_advantages(
                    rewards_P_A_G[:, k], normalize_by_std=h.normalize_by_std
                )
                uniform_A.append(adv_metrics["uniform_group_frac"])
        for name, frac in zip(self.names, uniform_A):
            metrics[f"adv/{name}/uniform_group_frac"] = frac
        metrics["adv/uniform_group_frac"] = sum(uniform_A) / A
        return advantages

    def _update(self, requests: list[UpdateRequest]) -> list[UpdateReport]:
        """Every learner's updates; a non-finite loss names the step, the learner and the checkpoint kept."""
        try:
            return self.executor.update(requests)
        except TrainingError as exc:
            raise TrainingError(
                f"{exc}; the last good checkpoint in {self.run_dir / 'checkpoints'} is kept"
            ) from None

    def _step_metrics(
        self,
        rewards_P_A_G: torch.Tensor,
        p_hat_A: torch.Tensor,
        omega_A_A: torch.Tensor,
        rollouts_A: list[list[SharedRollout]],
        updates: list[UpdateReport],
    ) -> dict[str, float]:
        """Per agent: rollout accuracy and reward spread, P̂, ω, generation cost; then every learner's own."""
        metrics: dict[str, float] = {}
        P, _, G = rewards_P_A_G.shape
        acc_A = rewards_P_A_G.mean(dim=(0, 2))
        for a, name in enumerate(self.names):
            metrics[f"train/acc/{name}"] = acc_A[a].item()
            metrics[f"train/reward_std/{name}"] = rewards_P_A_G[:, a].std().item()
            metrics[f"capability/{name}"] = p_hat_A[a].item()
            metrics[f"cost/{name}/generated_responses"] = float(P * G)
            metrics[f"cost/{name}/generated_tokens"] = float(sum(r.length for r in rollouts_A[a]))
            for j, source in enumerate(self.names):
                metrics[f"omega/{name}/{source}"] = omega_A_A[a, j].item()
        for update in updates:
            metrics |= update.metrics
        return metrics

    def _sample_rows(
        self, rollouts_A: list[list[SharedRollout]], items: list[TaskItem], updates: list[UpdateReport]
    ) -> list[dict[str, Any]]:
        """A few rollouts of the first prompts, with reward and each learner's advantage, ratio and bounds."""
        rows = []
        first_prompts = max(1, self.cfg.train.samples_per_step // len(self.names))
        for rollout in (r for rollouts in rollouts_A for r in rollouts):
            if rollout.prompt_index >= first_prompts:
                continue
            row: dict[str, Any] = {
                "id": str(rollout.id),
                "prompt": rollout.prompt,
                "answer": items[rollout.prompt_index].answer,
                "author": self.names[rollout.author],
                "text": rollout.text,
                "reward": rollout.reward,
                "grade": rollout.grade_reason,
                "length": rollout.length,
                "finish_reason": rollout.finish_reason,
            }
            for name, update in zip(self.names, updates):
                if rollout.id in update.samples:
                    row[f"learner/{name}"] = update.samples[rollout.id]
            rows.append(row)
        return rows[: self.cfg.train.samples_per_step]

    def _accumulate_cost(self, metrics: dict[str, float]) -> None:
        """Turn this step's cost counts into cumulative totals (a logged number, not a claim)."""
        for key in list(metrics):
            if key.startswith("cost/"):
                self.cost[key] = self.cost.get(key, 0.0) + metrics[key]
                metrics[key] = self.cost[key]


_COST_KEYS = ("generated_responses", "generated_tokens", "trained_responses", "trained_tokens", "updates")
