"""The collaborative trainer: one step reads like the paper's Algorithm 1 (``docs/hacpo.md``, "One step").

    every agent rolls out and scores its own samples once (old log-probs) → verify → update capability →
    advantages → per learner: build its batch (own samples first, shared samples re-encoded from text) →
    mini-batch updates with the stepwise bound of each mini-batch → log

The agents live in workers (`workbench.train.worker`) run in this process or in Ray actors
(`workbench.train.executors`); this driver exchanges only text, rewards and scalars with them.

Every place that departs from plain GSPO is marked ``# HACPO:``. Baselines and ablations are
configurations (``workbench.config.ALGORITHMS`` and the ``hacpo`` section), never forked code.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from workbench.config.experiment import ExperimentConfig, RayConfig
from workbench.core.advantages import capability_aware_advantages, group_advantages
from workbench.core.capability import CapabilityTracker, capability_ratios
from workbench.core.losses import LossParams
from workbench.core.types import RolloutId, TaskItem
from workbench.tasks.prompts import build_prompt
from workbench.tasks.rewards import grade_batch
from workbench.tasks.sources import load_tasks
from workbench.train.checkpoint import (
    capture_rng_state,
    restore_rng_state,
    save_checkpoint,
)
from workbench.train.evaluate import HeldOutSet, held_out_sets
from workbench.train.exchange import SharedRollout
from workbench.train.executors import RayOptions, make_executor
from workbench.train.plan import plan_experiment
from workbench.train.rundir import RunWriter
from workbench.train.update import TrainingError, UpdateSettings
from workbench.train.worker import WorkerSettings

__all__ = ["Trainer", "TrainingError"]

log = logging.getLogger(__name__)


class Trainer:
    """Holds a run's agent workers, capability tracker and writer; `workbench.train.run.fit` runs the steps.

    Each agent lives in an `AgentWorker` (its model, optimizer and own token ids) run by an executor: in this
    process (``executor: local``, the default) or in one Ray actor per agent (``executor: ray``), see
    `workbench.train.executors`. The driver below sees text, rewards and scalars only.

    Args:
        cfg: A validated experiment config.
        run_dir: The run directory (created or resumed by :func:`train`).
        on_step: Called with each step's metric dict after it is logged (widgets, notebooks).
        executor: ``local`` or ``ray``; None = the config's ``executor`` (default ``local``).
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: Path,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        *,
        executor: str | None = None,
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
        self.executor_kind = executor or cfg.executor
        self.executor = make_executor(
            self.executor_kind,
            [
                {"spec": spec, "index": k, "names": self.names, "settings": _worker_settings(cfg)}
                for k, spec in enumerate(cfg.agents)
            ],
            seed=cfg.seed,
            ray_options=_ray_options(cfg.ray),
        )
        self.tracker = CapabilityTracker(len(self.names), window=h.window, floor=h.capability_floor)
        self.train_items: list[TaskItem] = load_tasks(
            cfg.task.source, split="train", n=cfg.task.train_size, seed=cfg.seed, **cfg.task.knobs
        )
        # The main held-out set, then one per task.eval_sources entry (none when task.eval_size is 0).
        self.held_out: list[HeldOutSet] = held_out_sets(cfg)
        # One memory plan gives every agent the bytes its generation and evaluation batches may use: its
        # device's train.memory_fraction, less the runtime and every agent's weights and optimizer state.
        sample = [build_prompt(item.question, cfg.task.instruction) for item in self.train_items[:64]]
        facts = self.executor.each("memory_facts", [{"prompts": sample} for _ in self.names])
        self.memory_plan = plan_experiment(cfg, facts)
        self.executor.each("use_memory_budget", [{"budget": b} for b in self.memory_plan.budgets])
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
        for i, part in enumerate(self.executor.each("state_dict", [{} for _ in self.names])):
            state[f"agent_{i}"] = part["agent"]
            state[f"optimizer_{i}"] = part["optimizer"]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        parts = [
            {"agent": state[f"agent_{i}"], "optimizer": state[f"optimizer_{i}"]}
            for i in range(len(self.names))
        ]
        self.executor.each("load_state_dict", [{"state": part} for part in parts])
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
        return dict(zip(self.names, self.executor.each("start_weights", [{} for _ in self.names])))

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
            kwargs = {
                "items": held_out.items,
                "max_new_tokens": t.eval_max_new_tokens or t.max_new_tokens,
                "benchmark": held_out.benchmark,
                "instruction": task.instruction,
                "method": task.reward,
                "k": t.eval_samples,
                "temperature": t.eval_temperature,
            }
            for name, (agent_rows, values, agent_items) in zip(
                self.names, self.executor.each("evaluate", [kwargs] * len(self.names))
            ):
                rows += agent_rows
                item_rows += agent_items
                metrics[f"{held_out.prefix}/acc/{name}"] = values["greedy_acc"]
                if t.eval_samples:
                    metrics[f"{held_out.prefix}/avg@{t.eval_samples}/{name}"] = values[
                        f"avg@{t.eval_samples}"
                    ]
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
        """One HACPO step (Algorithm 1); returns its flat metrics."""
        cfg, t, h, algo = self.cfg, self.cfg.train, self.cfg.hacpo, self.algo
        step = self.step + 1
        A, P, G = len(self.names), t.prompts_per_step, t.group_size * algo.group_multiplier
        metrics: dict[str, float] = {}
        t0 = time.perf_counter()

        # 1. Every agent answers the same prompts, G responses each, with its current (= old) policy, and
        #    scores them once before any update: its old log-likelihoods, shared with the other learners.
        items = self._prompt_batch(step)
        prompts = [build_prompt(item.question, cfg.task.instruction) for item in items]
        reports = self.executor.each(
            "rollout",
            [{"prompts": prompts, "n": G, "seed": cfg.seed * 1_000_003 + step * 101 + a} for a in range(A)],
        )
        rollouts_A = [report.rollouts for report in reports]

        # 2. Verify every response with the shared reward.
        flat = [r for rollouts in rollouts_A for r in rollouts]
        grades = grade_batch(
            [r.text for r in flat], [items[r.prompt_index].answer for r in flat], cfg.task.reward
        )
        for rollout, grade in zip(flat, grades):
            rollout.reward, rollout.grade_reason = grade.reward, grade.reason
        rewards_P_A_G = torch.zeros(P, A, G)
        for r in flat:
            rewards_P_A_G[r.prompt_index, r.author, r.index] = r.reward
        t_rollout = time.perf_counter() - t0

        # 3. Capability window gets this step's batch accuracy before advantages (Eq. 9, Assumption D.1).
        acc_A = rewards_P_A_G.mean(dim=(0, 2))
        self.tracker.update(acc_A)
        p_hat_A = self.tracker.p_hat()
        omega_A_A = capability_ratios(p_hat_A, h.min_ratio, h.max_ratio)
        if step <= h.warmup_steps:
            omega_A_A = torch.ones(A, A)
        for a, name in enumerate(self.names):
            metrics[f"train/acc/{name}"] = acc_A[a].item()
            metrics[f"train/reward_std/{name}"] = rewards_P_A_G[:, a].std().item()
            metrics[f"capability/{name}"] = p_hat_A[a].item()
            metrics[f"cost/{name}/generated_responses"] = float(P * G)
            metrics[f"cost/{name}/generated_tokens"] = float(sum(r.length for r in rollouts_A[a]))
            for j, source in enumerate(self.names):
                metrics[f"omega/{name}/{source}"] = omega_A_A[a, j].item()

        # 4. Advantages: capability-aware over the joint group when sharing, per agent group otherwise.
        advantages_L_P_A_G = self._advantages(rewards_P_A_G, omega_A_A, metrics)

        # 5. Learners update from the same pre-update rollouts (authors' code): one after another in-process,
        #    in parallel under Ray. Each gets the others' samples as text (re-encoded by its own tokenizer).
        t1 = time.perf_counter()
        # HACPO: a cross sample's loss is scaled by ω^(source, learner) (Eq. 10); the −ω ablation keeps 1.
        use_coef = algo.loss == "hacpo" and h.omega_in_loss
        updates = self._update(
            [
                {
                    "cross": [r for a in range(A) if a != k for r in rollouts_A[a]]
                    if algo.share_rollouts
                    else [],
                    "advantages_P_A_G": advantages_L_P_A_G[k].clone(),
                    "coef_A": omega_A_A[:, k].clone() if use_coef else torch.ones(A),
                    "where": f"step {step}, learner {name!r}",
                }
                for k, name in enumerate(self.names)
            ]
        )
        samples: dict[tuple[RolloutId, int], dict[str, float]] = {}
        for k, update in enumerate(updates):
            metrics |= update.metrics
            samples |= {(rollout_id, k): row for rollout_id, row in update.samples.items()}
        t_update = time.perf_counter() - t1

        self._accumulate_cost(metrics)
        metrics["time/rollout_s"] = t_rollout
        metrics["time/generate_s"] = sum(report.generate_s for report in reports)
        metrics["time/score_s"] = sum(report.score_s for report in reports)
        metrics["time/update_s"] = t_update
        metrics["time/step_s"] = time.perf_counter() - t0
        self.step = step
        self.writer.write_samples(step, self._sample_rows(flat, items, samples))
        return metrics

    def _advantages(
        self, rewards_P_A_G: torch.Tensor, omega_A_A: torch.Tensor, metrics: dict[str, float]
    ) -> torch.Tensor:
        """``advantages_L_P_A_G``: learner L's advantage of each response (0 where L never trains on it)."""
        h, algo = self.cfg.hacpo, self.algo
        A = rewards_P_A_G.shape[1]
        if algo.share_rollouts:
            # HACPO: the baseline weights source a's rewards by ω[L, a] (Eq. 7); −Adv and naive use ω ≡ 1.
            use_omega = algo.capability_advantages and h.capability_baseline
            advantages, adv_metrics = capability_aware_advantages(
                rewards_P_A_G,
                omega_A_A if use_omega else torch.ones(A, A),
                normalize_by_std=h.normalize_by_std,
                uniform_group_guard=h.uniform_group_guard,
                max_reward=1.0 if h.binary_guard else None,
            )
            metrics["adv/uniform_group_frac"] = adv_metrics["uniform_group_frac"]
            for k, name in enumerate(self.names):
                metrics[f"adv/{name}/baseline_fallback_frac"] = adv_metrics[f"baseline_fallback_frac/{k}"]
            return advantages
        advantages = torch.zeros(A, *rewards_P_A_G.shape)
        for k in range(A):
            advantages[k, :, k], adv_metrics = group_advantages(
                rewards_P_A_G[:, k], normalize_by_std=h.normalize_by_std
            )
        metrics["adv/uniform_group_frac"] = adv_metrics["uniform_group_frac"]
        return advantages

    def _update(self, kwargs_L: list[dict[str, Any]]) -> list[Any]:
        """Every learner's updates; a non-finite loss names the step, the learner and the checkpoint kept."""
        try:
            return self.executor.each("update", kwargs_L)
        except TrainingError as exc:
            raise TrainingError(
                f"{exc}; the last good checkpoint in {self.run_dir / 'checkpoints'} is kept"
            ) from None

    def _sample_rows(
        self,
        flat: list[SharedRollout],
        items: list[TaskItem],
        samples: dict[tuple[RolloutId, int], dict[str, float]],
    ) -> list[dict[str, Any]]:
        """A few rollouts of the first prompts, with reward and each learner's advantage, ratio and bounds."""
        rows = []
        first_prompts = max(1, self.cfg.train.samples_per_step // len(self.names))
        for rollout in flat:
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
            for k, name in enumerate(self.names):
                if (rollout.id, k) in samples:
                    row[f"learner/{name}"] = samples[(rollout.id, k)]
            rows.append(row)
        return rows[: self.cfg.train.samples_per_step]

    def _accumulate_cost(self, metrics: dict[str, float]) -> None:
        """Turn this step's cost counts into cumulative totals (a logged number, not a claim)."""
        for key in list(metrics):
            if key.startswith("cost/"):
                self.cost[key] = self.cost.get(key, 0.0) + metrics[key]
                metrics[key] = self.cost[key]


def _worker_settings(cfg: ExperimentConfig) -> WorkerSettings:
    """What every worker needs from the config: optimizer, update and loss scalars, sampling caps."""
    h, t = cfg.hacpo, cfg.train
    eps_low, eps_high = cfg.algo.clip or (h.eps_low, h.eps_high)
    return WorkerSettings(
        update=UpdateSettings(
            loss=cfg.algo.loss,
            minibatch_size=t.minibatch_prompts * t.group_size,
            micro_batch_size=t.micro_batch_size,
            temperature=t.temperature,
            kl_coef=t.kl_coef,
            grad_clip=t.grad_clip,
            skip_uniform_groups=t.skip_uniform_groups,
        ),
        loss=LossParams(
            eps_low=eps_low,
            eps_high=eps_high,
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
        ratio_normalization=h.ratio_normalization,
        compile_decode=t.compile_decode,
    )


def _ray_options(section: RayConfig) -> RayOptions:
    """`RayOptions` from the config's validated ``ray`` section."""
    return RayOptions(
        address=section.address,
        cpus_per_agent=section.cpus_per_agent,
        gpus_per_agent=section.gpus_per_agent,
    )


_COST_KEYS = ("generated_responses", "generated_tokens", "trained_responses", "trained_tokens", "updates")
