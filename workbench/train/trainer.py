"""The collaborative trainer: one step reads like the paper's Algorithm 1 (spec §4, operational procedure).

    roll out every agent → verify → score source log-probs → update capability →
    per learner: build its batch (own samples first, shared samples re-encoded) → advantages →
    mini-batch updates with the stepwise bound of each mini-batch → log

Every place that departs from plain GSPO is marked ``# HACPO:``. Baselines and ablations are
configurations (``workbench.config.ALGORITHMS`` and the ``hacpo`` section), never forked code.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.agents.agent import Agent
from workbench.agents.loading import load_agent
from workbench.agents.rollout import generate, reference_token_logprobs, score_rollouts, token_logprobs
from workbench.agents.sharing import build_training_batch
from workbench.agents.tokens import TokenBatch
from workbench.config.experiment import ExperimentConfig
from workbench.config.loading import load_experiment
from workbench.core.advantages import capability_aware_advantages, group_advantages
from workbench.core.capability import CapabilityTracker, capability_ratios
from workbench.core.losses import (
    TOKEN_LEVEL_LOSSES,
    get_policy_loss,
    low_var_kl,
    masked_mean_logp,
    sequence_ratio,
    stepwise_lower_bound,
)
from workbench.core.types import Rollout, TaskItem
from workbench.tasks.prompts import build_prompt
from workbench.tasks.rewards import grade_batch
from workbench.tasks.sources import load_tasks
from workbench.train.checkpoint import (
    capture_rng_state,
    load_latest_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from workbench.train.evaluate import evaluate
from workbench.train.rundir import RunWriter, config_hash, create_run_dir, find_run

__all__ = ["Trainer", "TrainingError", "train"]

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """A step cannot continue (non-finite loss, ...); the last good checkpoint is kept."""


@dataclass
class LearnerBatch:
    """One learner's training batch: its own rollouts first, then shared ones (spec §9.8)."""

    rollouts: list[Rollout]
    rollout_ids: list[int]
    tokens: TokenBatch
    advantages_B: torch.Tensor
    is_self_B: torch.Tensor
    cross_coef_B: torch.Tensor
    source_B: torch.Tensor
    old_logp_mean_B: torch.Tensor
    sharing_stats: dict[str, float] = field(default_factory=dict)


def _chunks(n: int, size: int) -> list[list[int]]:
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


class Trainer:
    """Holds a run's agents, optimizers, capability tracker and writer; :meth:`fit` runs the steps.

    Args:
        cfg: A validated experiment config.
        run_dir: The run directory (created or resumed by :func:`train`).
        on_step: Called with each step's metric dict after it is logged (widgets, notebooks).
    """

    def __init__(
        self, cfg: ExperimentConfig, run_dir: Path, on_step: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        self.cfg = cfg
        self.algo = cfg.algo
        self.run_dir = run_dir
        self.writer = RunWriter(run_dir)
        self.on_step = on_step
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self.agents: list[Agent] = [load_agent(spec) for spec in cfg.agents]
        self.names = [agent.name for agent in self.agents]
        self.optimizers = [
            torch.optim.AdamW(a.trainable_parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
            for a in self.agents
        ]
        h = cfg.hacpo
        self.tracker = CapabilityTracker(len(self.agents), window=h.window, floor=h.capability_floor)
        self.train_items: list[TaskItem] = load_tasks(
            cfg.task.source, split="train", n=cfg.task.train_size, seed=cfg.seed, **cfg.task.knobs
        )
        eval_source = cfg.task.eval_source or cfg.task.source
        eval_knobs = cfg.task.eval_knobs
        if eval_knobs is None:
            eval_knobs = cfg.task.knobs if eval_source == cfg.task.source else {}
        self.eval_items: list[TaskItem] = (
            load_tasks(eval_source, split="test", n=cfg.task.eval_size, seed=cfg.seed, **eval_knobs)
            if cfg.task.eval_size
            else []
        )
        self.step = 0
        self.cost = {f"cost/{n}/{k}": 0.0 for n in self.names for k in _COST_KEYS}

    # ----------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue identically."""
        state: dict[str, Any] = {
            "trainer": {"step": self.step, "cost": dict(self.cost)},
            "tracker": self.tracker.state_dict(),
            "rng": capture_rng_state(),
        }
        for i, (agent, opt) in enumerate(zip(self.agents, self.optimizers)):
            state[f"agent_{i}"] = agent.trainable_state_dict()
            state[f"optimizer_{i}"] = opt.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        for i, (agent, opt) in enumerate(zip(self.agents, self.optimizers)):
            agent.load_trainable_state_dict(state[f"agent_{i}"])
            opt.load_state_dict(state[f"optimizer_{i}"])
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
    def evaluate(self) -> dict[str, float]:
        """Greedy accuracy of every agent on the held-out split, appended to ``evals.csv``."""
        if not self.eval_items:
            return {}
        t = self.cfg.train
        metrics, rows = {}, []
        for agent in self.agents:
            result = evaluate(
                agent,
                self.eval_items,
                k=1,
                greedy=True,
                max_new_tokens=t.eval_max_new_tokens or t.max_new_tokens,
                benchmark=self.cfg.task.eval_source or self.cfg.task.source,
                instruction=self.cfg.task.instruction,
                method=self.cfg.task.reward,
                agent_name=agent.name,
            )
            summary = result.summary
            rows += summary.to_dict("records")
            greedy = summary.loc[summary["metric"] == "greedy_acc", "value"]
            metrics[f"eval/acc/{agent.name}"] = float(greedy.iloc[0]) if len(greedy) else math.nan
        self.writer.append_evals(self.step, rows)
        return metrics

    # ------------------------------------------------------------------------------------ one step
    def _prompt_batch(self, step: int) -> list[TaskItem]:
        """Prompts of ``step``: epochs of seeded permutations, so a resumed run sees the same batches."""
        n, size = len(self.train_items), self.cfg.train.prompts_per_step
        start = (step - 1) * size
        batch = []
        for pos in range(start, start + size):
            epoch, offset = divmod(pos, n)
            order = list(range(n))
            random.Random(self.cfg.seed * 1_000_003 + epoch).shuffle(order)
            batch.append(self.train_items[order[offset]])
        return batch

    def train_step(self) -> dict[str, float]:
        """One HACPO step (Algorithm 1, spec §4); returns its flat metrics."""
        cfg, t, h, algo = self.cfg, self.cfg.train, self.cfg.hacpo, self.algo
        step = self.step + 1
        A, P, G = len(self.agents), t.prompts_per_step, t.group_size * algo.group_multiplier
        metrics: dict[str, float] = {}
        t0 = time.perf_counter()

        # 1. Every agent answers the same prompts, G responses each, with its current (= old) policy.
        items = self._prompt_batch(step)
        prompts = [build_prompt(item.question, cfg.task.instruction) for item in items]
        rollouts_A = [
            generate(
                agent,
                prompts,
                n=G,
                temperature=t.temperature,
                top_p=t.top_p,
                max_new_tokens=t.max_new_tokens,
                author=a,
                seed=cfg.seed * 1_000_003 + step * 101 + a,
            )
            for a, agent in enumerate(self.agents)
        ]

        # 2. Verify every response with the shared reward; the source's old log-likelihood, before any update.
        flat = [r for rollouts in rollouts_A for r in rollouts]
        grades = grade_batch(
            [r.text for r in flat], [items[r.prompt_index].answer for r in flat], cfg.task.reward
        )
        for rollout, grade in zip(flat, grades):
            rollout.reward, rollout.grade_reason = grade.reward, grade.reason
        if algo.share_rollouts:
            for agent, rollouts in zip(self.agents, rollouts_A):
                score_rollouts(agent, rollouts, temperature=t.temperature)
        rewards_P_A_G = torch.tensor([r.reward for r in flat]).reshape(A, P, G).permute(1, 0, 2)
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

        # 5. Learners update one after another from the same pre-update rollouts (spec §4 step 6).
        t1 = time.perf_counter()
        sample_info: dict[tuple[int, int], dict[str, float]] = {}
        for k in range(A):
            batch = self._learner_batch(k, rollouts_A, advantages_L_P_A_G, omega_A_A)
            metrics |= self._update_learner(k, batch, sample_info)
        t_update = time.perf_counter() - t1

        self._accumulate_cost(metrics)
        metrics["time/rollout_s"] = t_rollout
        metrics["time/update_s"] = t_update
        metrics["time/step_s"] = time.perf_counter() - t0
        self.step = step
        self.writer.write_samples(step, self._sample_rows(flat, items, sample_info))
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

    def _learner_batch(
        self,
        k: int,
        rollouts_A: list[list[Rollout]],
        advantages_L_P_A_G: torch.Tensor,
        omega_A_A: torch.Tensor,
    ) -> LearnerBatch:
        """Learner k's batch: self rollouts first, then every other agent's (re-encoded as text)."""
        A = len(rollouts_A)
        sources = [k] + ([a for a in range(A) if a != k] if self.algo.share_rollouts else [])
        G = len(rollouts_A[k]) // self.cfg.train.prompts_per_step
        chosen = [(a, i, r) for a in sources for i, r in enumerate(rollouts_A[a])]
        rollouts = [r for _, _, r in chosen]
        tokens, sharing_stats = build_training_batch(self.agents[k], rollouts, k)
        advantages_B = torch.stack([advantages_L_P_A_G[k, r.prompt_index, a, i % G] for a, i, r in chosen])
        # HACPO: a cross sample's loss is scaled by ω^(source, learner) (Eq. 10); −ω ablation keeps 1.
        use_coef = self.algo.loss == "hacpo" and self.cfg.hacpo.omega_in_loss
        coef_B = torch.tensor([omega_A_A[a, k].item() if use_coef else 1.0 for a, _, _ in chosen])
        n_per_agent = len(rollouts_A[0])
        return LearnerBatch(
            rollouts=rollouts,
            rollout_ids=[a * n_per_agent + i for a, i, _ in chosen],
            tokens=tokens,
            advantages_B=advantages_B,
            is_self_B=torch.tensor([a == k for a, _, _ in chosen]),
            cross_coef_B=coef_B,
            source_B=torch.tensor([a for a, _, _ in chosen]),
            old_logp_mean_B=torch.tensor([r.old_logp_mean for r in rollouts], dtype=torch.float32),
            sharing_stats={key: float(v) for key, v in sharing_stats.items()},
        )

    def _update_learner(
        self, k: int, batch: LearnerBatch, sample_info: dict[tuple[int, int], dict[str, float]]
    ) -> dict[str, float]:
        """Mini-batch updates of learner k; mini-batch m uses the stepwise bound of m (Eq. 14)."""
        t, h, algo = self.cfg.train, self.cfg.hacpo, self.algo
        agent, optimizer, name = self.agents[k], self.optimizers[k], self.names[k]
        loss_fn = get_policy_loss(algo.loss)
        eps_low, eps_high = algo.clip or (h.eps_low, h.eps_high)
        minibatch_size = t.minibatch_prompts * t.group_size
        minibatches = [
            [
                _chunk
                for _chunk in (mb[i : i + t.micro_batch_size] for i in range(0, len(mb), t.micro_batch_size))
            ]
            for mb in _chunks(len(batch.rollouts), minibatch_size)
        ]

        # Old (self) and reference token log-probs, before any update, in the exact micro-batches of the
        # update: on-policy self samples then have s = 1 exactly in the first mini-batch.
        agent.model.eval()
        old_self, ref_self = {}, {}
        with torch.no_grad():
            for micros in minibatches:
                for micro in micros:
                    view = batch.tokens.select(micro)
                    old_self[micro[0]] = token_logprobs(agent, view, temperature=t.temperature)
                    if t.kl_coef > 0 and batch.is_self_B[micro].any():
                        ref_self[micro[0]], _ = reference_token_logprobs(
                            agent, view, temperature=t.temperature
                        )
        old_mean_B = batch.old_logp_mean_B.clone()
        for micros in minibatches:
            for micro in micros:
                self_mean = masked_mean_logp(*old_self[micro[0]])
                idx = torch.tensor(micro)
                old_mean_B[idx] = torch.where(batch.is_self_B[idx], self_mean, old_mean_B[idx])

        ratios_B = torch.zeros(len(batch.rollouts))
        lower_B = torch.zeros(len(batch.rollouts))
        losses, kls, grad_norms = [], [], []
        for m, micros in enumerate(minibatches):
            optimizer.zero_grad(set_to_none=True)
            mb_len = sum(len(micro) for micro in micros)
            for micro in micros:
                idx = torch.tensor(micro)
                logp_B_T, mask_B_T = token_logprobs(
                    agent, batch.tokens.select(micro), temperature=t.temperature
                )
                new_mean_B = masked_mean_logp(logp_B_T, mask_B_T)
                if algo.loss in TOKEN_LEVEL_LOSSES:
                    loss, _ = loss_fn(
                        logp_B_T, old_self[micro[0]][0], batch.advantages_B[idx], mask_B_T, eps_low=eps_low,
                        eps_high=eps_high, max_abs_log_ratio=h.max_abs_log_ratio,
                    )  # fmt: skip
                elif algo.loss == "hacpo":
                    loss, _ = loss_fn(
                        new_mean_B, old_mean_B[idx], batch.advantages_B[idx], batch.is_self_B[idx],
                        batch.cross_coef_B[idx], minibatch_index=m, alpha=h.alpha, delta=h.delta,
                        delta_step=h.delta_step, eps_low=eps_low, eps_high=eps_high,
                        max_abs_log_ratio=h.max_abs_log_ratio, clip_cross=h.clip_cross,
                    )  # fmt: skip
                else:
                    loss, _ = loss_fn(
                        new_mean_B, old_mean_B[idx], batch.advantages_B[idx], eps_low=eps_low,
                        eps_high=eps_high, max_abs_log_ratio=h.max_abs_log_ratio,
                    )  # fmt: skip
                total = loss
                if t.kl_coef > 0 and micro[0] in ref_self:
                    # KL to the reference on self samples only (the authors' code, spec §9.9).
                    kl_B = low_var_kl(logp_B_T, ref_self[micro[0]], mask_B_T)
                    kl = (kl_B * batch.is_self_B[idx]).sum() / len(micro)
                    total = total + t.kl_coef * kl
                    kls.append(kl.item())
                if not torch.isfinite(total):
                    raise TrainingError(
                        f"non-finite loss {total.item()} at step {self.step + 1}, learner {name!r}, "
                        f"mini-batch {m}; "
                        f"the last good checkpoint in {self.run_dir / 'checkpoints'} is kept"
                    )
                (total * len(micro) / mb_len).backward()
                losses.append(loss.item())
                ratios_B[idx] = sequence_ratio(new_mean_B.detach(), old_mean_B[idx], h.max_abs_log_ratio)
                lower_B[idx] = stepwise_lower_bound(m, h.delta, h.delta_step)
            grad_norms.append(
                torch.nn.utils.clip_grad_norm_(agent.trainable_parameters(), t.grad_clip).item()
            )
            optimizer.step()

        self._record_samples(k, batch, ratios_B, lower_B, sample_info)
        return self._learner_metrics(k, batch, ratios_B, lower_B, losses, kls, grad_norms, len(minibatches))

    def _learner_metrics(
        self,
        k: int,
        batch: LearnerBatch,
        ratios_B: torch.Tensor,
        lower_B: torch.Tensor,
        losses: list[float],
        kls: list[float],
        grad_norms: list[float],
        n_updates: int,
    ) -> dict[str, float]:
        """``is/<learner>/<source>/*``, loss, KL, grad norm, advantage and cost metrics of learner k."""
        h, name = self.cfg.hacpo, self.names[k]
        eps_low, eps_high = self.algo.clip or (h.eps_low, h.eps_high)
        metrics = {
            f"loss/{name}": sum(losses) / max(len(losses), 1),
            f"grad_norm/{name}": sum(grad_norms) / max(len(grad_norms), 1),
            f"adv/{name}/mean": batch.advantages_B.mean().item(),
            f"adv/{name}/abs_mean": batch.advantages_B.abs().mean().item(),
            f"cost/{name}/trained_responses": float(len(batch.rollouts)),
            f"cost/{name}/trained_tokens": float(batch.tokens.response_mask_B_T.sum().item()),
            f"cost/{name}/updates": float(n_updates),
        }
        if kls:
            metrics[f"kl/{name}"] = sum(kls) / len(kls)
        for key, value in batch.sharing_stats.items():
            metrics[f"share/{name}/{key}"] = value
        for a, source in enumerate(self.names):
            sel = batch.source_B == a
            if not sel.any():
                continue
            s_B = ratios_B[sel]
            if a == k:
                clipped = (s_B < 1 - eps_low) | (s_B > 1 + eps_high)
            else:
                clipped = (
                    (s_B < lower_B[sel]) | (s_B > 1.0) if h.clip_cross else torch.zeros_like(s_B, dtype=bool)
                )
                metrics[f"is/{name}/{source}/in_range_frac"] = 1.0 - clipped.float().mean().item()
            prefix = f"is/{name}/{source}"
            metrics[f"{prefix}/ratio_mean"] = s_B.mean().item()
            metrics[f"{prefix}/ratio_min"] = s_B.min().item()
            metrics[f"{prefix}/ratio_max"] = s_B.max().item()
            metrics[f"{prefix}/clip_frac"] = clipped.float().mean().item()
        return metrics

    def _record_samples(
        self,
        k: int,
        batch: LearnerBatch,
        ratios_B: torch.Tensor,
        lower_B: torch.Tensor,
        sample_info: dict[tuple[int, int], dict[str, float]],
    ) -> None:
        for b, rid in enumerate(batch.rollout_ids):
            sample_info[(rid, k)] = {
                "advantage": batch.advantages_B[b].item(),
                "ratio": ratios_B[b].item(),
                "lower_bound": lower_B[b].item() if not batch.is_self_B[b] else 1 - self.cfg.hacpo.eps_low,
            }

    def _sample_rows(
        self, flat: list[Rollout], items: list[TaskItem], sample_info: dict[tuple[int, int], dict[str, float]]
    ) -> list[dict[str, Any]]:
        """A few rollouts of the first prompts, with reward and each learner's advantage and ratio."""
        rows = []
        for rid, rollout in enumerate(flat):
            if rollout.prompt_index >= max(1, self.cfg.train.samples_per_step // len(self.agents)):
                continue
            row: dict[str, Any] = {
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
                if (rid, k) in sample_info:
                    row[f"learner/{name}"] = sample_info[(rid, k)]
            rows.append(row)
        return rows[: self.cfg.train.samples_per_step]

    def _accumulate_cost(self, metrics: dict[str, float]) -> None:
        """Turn this step's cost counts into cumulative totals (a logged number, not a claim)."""
        for key in list(metrics):
            if key.startswith("cost/"):
                self.cost[key] = self.cost.get(key, 0.0) + metrics[key]
                metrics[key] = self.cost[key]

    # ------------------------------------------------------------------------------------ the loop
    def fit(self) -> Path:
        """Run (or continue) the training loop to ``train.steps``; returns the run directory."""
        t = self.cfg.train
        from tqdm.auto import tqdm

        if self.step == 0:
            metrics = self.evaluate()
            self.writer.log_metrics(0, metrics)
            self.save()  # step 0: the initial weights, so a run killed before its first save resumes here
            self._notify(0, metrics)
        progress = tqdm(total=t.steps, initial=self.step, desc=f"{self.cfg.experiment}", unit="step")
        while self.step < t.steps:
            metrics = self.train_step()
            last = self.step == t.steps
            if (t.eval_every and self.step % t.eval_every == 0) or last:
                metrics |= self.evaluate()
            self.writer.log_metrics(self.step, metrics)
            if self.step % t.save_every == 0 or last:
                self.save()
            self._notify(self.step, metrics)
            progress.update(1)
            progress.set_postfix({n: f"{metrics[f'train/acc/{n}']:.2f}" for n in self.names})
        progress.close()
        self.writer.mark_done({"steps": self.step, "agents": self.names})
        return self.run_dir

    def _notify(self, step: int, metrics: dict[str, float]) -> None:
        if self.on_step is not None:
            self.on_step({"step": step, **metrics})


_COST_KEYS = ("generated_responses", "generated_tokens", "trained_responses", "trained_tokens", "updates")


def train(
    config: ExperimentConfig | str | Path,
    *,
    overrides: list[str] | dict[str, Any] | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    resume: bool = True,
) -> Path:
    """Run an experiment and return its run directory ``results/<experiment>/<run-id>/``.

    With ``resume=True`` a run of the same experiment and identical resolved config continues from its
    latest intact checkpoint, and a finished one is returned as it is (nothing is recomputed).

    Args:
        config: A config object or the path of an experiment YAML.
        overrides: ``["train.steps=5", ...]`` applied to a YAML path.
        on_step: Called with each step's metrics.
        resume: Continue/skip a matching run instead of starting a new one.

    Returns:
        The run directory.
    """
    cfg = config if isinstance(config, ExperimentConfig) else load_experiment(config, overrides)
    cfg_dict = cfg.to_dict()
    root = Path(cfg.output.root)
    run_dir = find_run(root, cfg.experiment, config_hash(cfg_dict)) if resume else None
    if run_dir is not None and RunWriter(run_dir).is_done():
        log.info("run %s is complete with the same config; nothing to do", run_dir)
        return run_dir
    if run_dir is None:
        run_dir = create_run_dir(root, cfg.experiment, run_id=cfg.output.run_id)
    writer = RunWriter(run_dir)
    writer.write_config(cfg_dict)
    writer.write_environment()
    trainer = Trainer(cfg, run_dir, on_step=on_step)
    checkpoint = load_latest_checkpoint(run_dir)
    if checkpoint is not None:
        step, state = checkpoint
        trainer.load_state_dict(state)
        writer.rollback_to(step)
        log.info("resumed %s from step %d", run_dir, step)
    else:  # killed before the step-0 checkpoint: start over, dropping any partial step-0 logs
        writer.rollback_to(-1)
    return trainer.fit()
