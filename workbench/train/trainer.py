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
what its method does from one record resolved from the two (``cfg.step_method``,
`workbench.config.methods.StepMethod`), never its name, and decides none of it itself.
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
from workbench.tasks.prompts import build_prompt
from workbench.train.checkpoint import (
    capture_rng_state,
    restore_rng_state,
    save_checkpoint,
)
from workbench.train.data import TaskData
from workbench.train.evaluate import difficulty_metrics
from workbench.train.exchange import (
    EvalRequest,
    RolloutRequest,
    UpdateReport,
    UpdateRequest,
    WorkerState,
)
from workbench.train.executors import Executor, start_workers
from workbench.train.metrics import omega_metrics, sample_rows, step_metrics
from workbench.train.plan import ExperimentPlan
from workbench.train.rewarding import grade_step
from workbench.train.rundir import RunWriter
from workbench.train.update import TrainingError

__all__ = ["Trainer", "TrainingError", "start_trainer"]

log = logging.getLogger(__name__)


class Trainer:
    """A run's agents (in their workers), its problems, capability tracker and writer; `fit` runs the steps.

    The constructor assembles parts built elsewhere, each by one call (`start_trainer` makes them from a
    config): the workers, every agent's model, optimizer and own token ids, run by an executor in this process
    (``executor: local``, one after another; ``threads``, all at once) or in one Ray actor per agent
    (``executor: ray``), `workbench.train.executors`; and the problems (`workbench.train.data.TaskData`). The
    driver below sees text, rewards and scalars only.

    Args:
        cfg: A validated experiment config.
        run_dir: The run directory (created or resumed by :func:`workbench.train.run.train`).
        executor: The agents' workers (`workbench.train.executors.start_workers`; tests pass scripted ones).
        data: The training items and held-out sets (`workbench.train.data.TaskData.load`).
        on_step: Called with each step's metric dict after it is logged (widgets, notebooks).
        memory_plan: The memory plan the workers run under, kept for inspection (`start_workers`).
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: Path,
        executor: Executor,
        data: TaskData,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        memory_plan: ExperimentPlan | None = None,
    ) -> None:
        self.cfg, self.method, self.run_dir = cfg, cfg.step_method, run_dir
        self.writer = RunWriter(run_dir)
        self.on_step = on_step
        self.names = cfg.agent_names
        self.executor, self.data, self.memory_plan = executor, data, memory_plan
        self.tracker = CapabilityTracker(
            len(self.names), window=cfg.hacpo.window, floor=cfg.hacpo.capability_floor
        )
        self.step = 0
        self.cost = {f"cost/{n}/{k}": 0.0 for n in self.names for k in _COST_KEYS}

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
            state[f"scheduler_{i}"] = part.scheduler
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        self.executor.load_state_dicts(
            [
                WorkerState(state[f"agent_{i}"], state[f"optimizer_{i}"], state.get(f"scheduler_{i}", {}))
                for i in range(len(self.names))
            ]
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
        ``eval/<source>/`` on each of ``task.eval_sources`` (`workbench.train.data.held_out_sets`); on
        the main set, when its task gives items a difficulty, the same per difficulty value
        (``eval_difficulty/<value>/acc/<agent>``, `workbench.train.evaluate.difficulty_metrics`).
        """
        if not self.data.held_out:
            return {}
        t, task = self.cfg.train, self.cfg.task
        metrics, rows, item_rows = {}, [], []
        for held_out in self.data.held_out:
            request = EvalRequest(
                items=held_out.items,
                benchmark=held_out.benchmark,
                max_new_tokens=t.eval_max_new_tokens or t.max_new_tokens,
                instruction=task.instruction,
                reward=task.reward,
                k=t.eval_samples,
                temperature=t.eval_temperature,
            )
            difficulty_of = {item.id: item.difficulty for item in held_out.items if item.difficulty}
            for name, report in zip(self.names, self.executor.evaluate(request)):
                rows += report.rows
                item_rows += report.item_rows
                metrics[f"{held_out.prefix}/acc/{name}"] = report.values["greedy_acc"]
                if t.eval_samples:
                    k = t.eval_samples
                    metrics[f"{held_out.prefix}/avg@{k}/{name}"] = report.values[f"avg@{k}"]
                if difficulty_of and held_out.prefix == "eval":
                    metrics |= difficulty_metrics(name, report.item_rows, difficulty_of)
        self.writer.append_eval_items(self.step, item_rows)
        self.writer.append_evals(self.step, rows)
        return metrics

    # ------------------------------------------------------------------------------------ one step
    def train_step(self) -> dict[str, float]:
        """One step of Algorithm 1 for every agent; returns its flat metrics."""
        cfg, h, method = self.cfg, self.cfg.hacpo, self.method
        step = self.step + 1
        A, P, G = len(self.names), cfg.train.prompts_per_step, method.group_size
        metrics: dict[str, float] = {}
        t0 = time.perf_counter()

        # 1. Every agent answers the same prompts, G responses each, with its current (= old) policy, and
        #    scores them once before any update: its old log-likelihoods, shared with the other learners.
        items = self.data.prompt_batch(step)
        prompts = [build_prompt(item.question, cfg.task.instruction) for item in items]
        reports = self.executor.rollout(
            [RolloutRequest(prompts, G, seed=cfg.seed * 1_000_003 + step * 101 + a) for a in range(A)]
        )
        rollouts_A = [report.rollouts for report in reports]

        # 2. Verify every response with the shared reward (and any further reward functions).
        graded = grade_step(cfg.task, cfg.train.max_new_tokens, self.names, rollouts_A, items, P, G)
        rewards_P_A_G = graded.rewards_P_A_G
        metrics |= graded.metrics
        t_rollout = time.perf_counter() - t0

        # 3. Capability P̂ of every agent (Eq. 9) and the ratios ω = P̂_k / P̂_j (Eq. 8).
        # HACPO: P̂ includes this step's batch accuracy, taken before advantages (Assumption D.1); ω ≡ 1 in
        # the warm-up steps. GSPO and Naive only log them.
        acc_A = graded.accuracy_P_A_G.mean(dim=(0, 2))
        self.tracker.update(acc_A)
        p_hat_A = self.tracker.p_hat()
        omega_A_A = capability_ratios(p_hat_A, h.min_ratio, h.max_ratio)
        if step <= h.warmup_steps:
            omega_A_A = torch.ones(A, A)

        # 4. Advantages: capability-aware over the joint group when sharing, per agent group otherwise.
        # HACPO: the baseline weights source a's rewards by ω[L, a] (Eq. 7); −Adv and naive use ω ≡ 1.
        baseline_L_A = omega_A_A if method.baseline_omega else torch.ones(A, A)
        advantages_L_P_A_G, adv_metrics = self._advantages(rewards_P_A_G, baseline_L_A)
        metrics |= adv_metrics

        # 5. Every learner updates from the same pre-update rollouts (the authors' code): one after another
        #    in-process, in parallel under Ray. It builds its batch from its own samples and the others' text.
        t1 = time.perf_counter()
        # HACPO: a cross sample's loss is scaled by ω^(source, learner) (Eq. 10); Naive and −ω keep 1.
        coef_A_L = omega_A_A if method.loss_omega else torch.ones(A, A)  # [a, k]: source a, learner k
        requests = [
            UpdateRequest(
                # HACPO: a learner trains on every other agent's rollouts too (Sec. 3.3); GSPO on its own.
                cross=[r for a in range(A) if a != k for r in rollouts_A[a]]
                if method.shares_rollouts
                else [],
                advantages_P_A_G=advantages_L_P_A_G[k].clone(),
                coef_A=coef_A_L[:, k].clone(),
                where=f"step {step}, learner {name!r}",
            )
            for k, name in enumerate(self.names)
        ]
        updates = self._update(requests)
        t_update = time.perf_counter() - t1

        # 6. Log: accuracy, capability, ω and cost per agent, each learner's update, phase times, samples.
        metrics |= step_metrics(self.names, graded.accuracy_P_A_G, p_hat_A, omega_A_A, rollouts_A, updates)
        if method.shares_rollouts:
            metrics |= omega_metrics(self.names, baseline_L_A, coef_A_L)
        self._accumulate_cost(metrics)
        metrics["time/rollout_s"] = t_rollout
        metrics["time/generate_s"] = sum(report.generate_s for report in reports)
        metrics["time/score_s"] = sum(report.score_s for report in reports)
        metrics["time/update_s"] = t_update
        metrics["time/step_s"] = time.perf_counter() - t0
        self.step = step
        per_author = max(1, cfg.train.samples_per_step // A)
        self.writer.write_samples(step, sample_rows(self.names, rollouts_A, items, updates, per_author))
        return metrics

    def _advantages(
        self, rewards_P_A_G: torch.Tensor, baseline_L_A: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``advantages_L_P_A_G``: learner L's advantage of each response (0 where L never trains on it), and
        its metrics.

        ``baseline_L_A[L, a]`` weights source a's rewards in learner L's baseline when sharing (Eq. 7).
        Logs each learner's share of uniform groups (all rewards equal, advantage 0: the joint group when
        sharing, its own group otherwise) and their mean, and the share where the baseline guard fired.
        """
        h, method = self.cfg.hacpo, self.method
        A = rewards_P_A_G.shape[1]
        metrics: dict[str, float] = {}
        if method.shares_rollouts:
            advantages, adv_metrics = capability_aware_advantages(
                rewards_P_A_G,
                baseline_L_A,
                normalize_by_std=h.normalize_by_std,
                uniform_group_guard=h.uniform_group_guard,
                max_reward=self._max_reward(rewards_P_A_G) if h.binary_guard else None,
            )
            uniform_A = [adv_metrics["uniform_group_frac"]] * A  # every learner's groups are the joint ones
            for k, name in enumerate(self.names):
                metrics[f"adv/{name}/baseline_fallback_frac"] = adv_metrics[f"baseline_fallback_frac/{k}"]
                if method.own_advantage == "group":
                    # HACPO: (beyond the paper) own rows against the learner's own G answers (Eq. 5), so they
                    # sum to 0 per prompt; shared rows keep the learner's baseline over the joint group.
                    advantages[k, :, k] = group_advantages(
                        rewards_P_A_G[:, k], normalize_by_std=h.normalize_by_std
                    )[0]
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
        return advantages, metrics

    def _max_reward(self, rewards_P_A_G: torch.Tensor) -> float | torch.Tensor:
        """The baseline guard's threshold: 1, the top of a grader's reward; with ``task.rewards`` (any scale)
        the top reward of each prompt's joint group, so the guard still fires exactly when every advantage
        would be negative (the same decisions as 1 on 0/1 rewards)."""
        return rewards_P_A_G.amax(dim=(1, 2)) if self.cfg.task.rewards else 1.0

    def _update(self, requests: list[UpdateRequest]) -> list[UpdateReport]:
        """Every learner's updates; a non-finite loss names the step, the learner and the checkpoint kept."""
        try:
            return self.executor.update(requests)
        except TrainingError as exc:
            raise TrainingError(
                f"{exc}; the last good checkpoint in {self.run_dir / 'checkpoints'} is kept"
            ) from None

    def _accumulate_cost(self, metrics: dict[str, float]) -> None:
        """Turn this step's cost counts into cumulative totals (a logged number, not a claim)."""
        for key in list(metrics):
            if key.startswith("cost/"):
                self.cost[key] = self.cost.get(key, 0.0) + metrics[key]
                metrics[key] = self.cost[key]


_COST_KEYS = ("generated_responses", "generated_tokens", "trained_responses", "trained_tokens", "updates")


def start_trainer(
    cfg: ExperimentConfig,
    run_dir: Path,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    *,
    executor: str | None = None,
) -> Trainer:
    """A `Trainer` of ``cfg`` with everything it needs, built in order: the global RNGs seeded, the problems
    drawn, the agents loaded in their workers (``executor``, None = the config's) with their memory budgets.
    """
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    data = TaskData.load(cfg)
    workers, memory_plan = start_workers(cfg, data.sample_prompts(cfg.task.instruction), kind=executor)
    return Trainer(cfg, run_dir, workers, data, on_step, memory_plan)
