"""A step's logged metrics and samples: per agent (`step_metrics`, `omega_metrics`), per learner from its
batch and what its updates recorded per row (`learner_metrics`), and the samples log (`sample_rows`).

Everything here reads tensors the update already holds (`workbench.train.batches.LearnerBatch`,
`workbench.train.update.LearnerUpdate`); nothing runs a model. A row *carries gradient* when it was forwarded
(advantage ≠ 0, or a KL term needed it) and clipping left it a gradient (`SampleStats.clipped_B` < 1): for a
shared row, its ratio lay inside [lb_m, 1] (Eqs. 13-14).

| key | meaning |
|---|---|
| ``loss/<learner>`` | the policy loss of the rows that carry gradient (mean over mini-batches) |
| ``loss_clipped/<learner>`` | the constant the clipped rows add to it (their terms get no gradient) |
| ``adv_src/<learner>/<source>/sum``, ``/mean`` | the learner's advantages of the source's rows |
| ``adv_src/<learner>/<source>/grad_sum`` | Σ advantage × ω (its loss coefficient) over rows with gradient |
| ``grad_frac/<learner>/<source>`` | share of the source's rows that carry gradient |
| ``length/<learner>/<source>`` | mean response length of the source's rows, in the learner's tokens |
| ``is/<learner>/<source>/…``, ``is_mb/…`` | sequence ratios and clip (own) or in-band (shared) shares |
| ``engine/<agent>/logp_gap_mean``, ``/…_max`` | trainer − sampler (vLLM) log-prob of a token, absolute |
| ``engine/<agent>/is_weight_mean``, ``/…_frac`` | truncated IS correction (``train.engine_is_cap``) |
| ``engine/<agent>/sync_s`` | seconds to write and reload the policy into its vLLM server |
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.core.types import TaskItem
from workbench.train.batches import LearnerBatch
from workbench.train.exchange import SharedRollout, UpdateReport
from workbench.train.update import LearnerUpdate

__all__ = ["engine_metrics", "learner_metrics", "omega_metrics", "sample_rows", "split_loss", "step_metrics"]


def engine_metrics(
    name: str, gaps: list[torch.Tensor], correction: dict[str, float] | None, sync_seconds: float
) -> dict[str, float]:
    """The sampler/trainer gap of an agent's own rows (`workbench.train.scoring.sampler_log_ratios`), the
    truncated IS correction's figures where it ran, and the last policy sync's wall time."""
    every_T = torch.cat(gaps).abs() if gaps else torch.zeros(0, dtype=torch.float64)
    metrics = {
        f"engine/{name}/logp_gap_mean": float(every_T.mean()) if every_T.numel() else 0.0,
        f"engine/{name}/logp_gap_max": float(every_T.max()) if every_T.numel() else 0.0,
        f"engine/{name}/sync_s": sync_seconds,
    }
    if correction is not None:
        metrics[f"engine/{name}/is_weight_mean"] = correction["is_weight_mean"]
        metrics[f"engine/{name}/is_truncated_frac"] = correction["truncated_frac"]
    return metrics


def split_loss(update: LearnerUpdate) -> tuple[float, float]:
    """The update's mean mini-batch loss split in two: the part of rows that carry gradient and the constant
    part of rows clipping left without one (their sum is the mean of ``update.losses``)."""
    if not update.sizes:
        return 0.0, 0.0
    trained_B = ~update.term_B.isnan()
    clipped_B = trained_B & (update.clipped_B >= 1.0)
    with_grad, constant = 0.0, 0.0
    for m, size in enumerate(update.sizes):
        in_m = trained_B & (update.minibatch_B == m)
        with_grad += update.term_B[in_m & ~clipped_B].double().sum().item() / size
        constant += update.term_B[in_m & clipped_B].double().sum().item() / size
    return with_grad / len(update.sizes), constant / len(update.sizes)


def learner_metrics(
    name: str, names: list[str], batch: LearnerBatch, update: LearnerUpdate, *, skipping: bool = False
) -> dict[str, float]:
    """``is/<learner>/<source>/*``, per-source advantages and gradient shares, loss, KL, grad norm, advantage
    and cost metrics of one learner (the module docstring lists the per-source keys).

    ``clip_frac`` is the share of a source's samples whose gradient clipping removed (the loss's own
    definition: the clipped branch of GSPO's min, or a cross ratio outside [lb_m, 1]); for cross sources
    ``in_range_frac`` is the share that gave gradient. The ``is/`` statistics count the samples forwarded
    (those of advantage 0 are not, unless a KL term needs them); ``grad_frac`` counts every row of the
    source in the batch. ``cost/<learner>/trained_*`` counts every sample of the update, ``forwarded_tokens``
    the response tokens forwarded. With ``skipping`` (``skip_uniform_groups``) only the kept samples count
    and ``adv/<learner>/kept_frac`` is their share. The same ratio mean and clip (or in-range) share per
    mini-batch index m, under ``is_mb/<learner>/<source>/<m>/``, give the paper's Table 6 per mini-batch:
    cross ratios meet a tighter bound in each later mini-batch (Eq. 14).
    """
    kept_B = ~update.ratio_B.isnan()  # forwarded: rows of advantage 0 have no ratio
    grad_B = kept_B & (update.clipped_B < 1.0)
    response_B = batch.tokens.response_mask_B_T.sum(dim=-1)
    with_grad, constant = split_loss(update)
    metrics = {
        f"loss/{name}": with_grad,
        f"loss_clipped/{name}": constant,
        f"grad_norm/{name}": sum(update.grad_norms) / max(len(update.grad_norms), 1),
        f"adv/{name}/mean": batch.advantages_B.mean().item(),
        f"adv/{name}/abs_mean": batch.advantages_B.abs().mean().item(),
        f"cost/{name}/trained_responses": float(batch.keep_B.sum().item()),
        f"cost/{name}/trained_tokens": float(response_B[batch.keep_B].sum().item()),
        f"cost/{name}/forwarded_tokens": float(response_B[kept_B].sum().item()),
        f"cost/{name}/updates": float(update.n_updates),
    }
    if skipping:
        metrics[f"adv/{name}/kept_frac"] = int(batch.keep_B.sum()) / max(len(batch), 1)
    if update.kls:
        metrics[f"kl/{name}"] = sum(update.kls) / len(update.kls)
    for key, value in batch.sharing_stats.items():
        metrics[f"share/{name}/{key}"] = value
    for a, source in enumerate(names):
        rows_B = batch.source_B == a
        if rows_B.any():
            metrics |= _source_metrics(name, source, batch, rows_B, grad_B, response_B)
        sel = rows_B & kept_B
        if sel.any():
            metrics |= _ratio_metrics(name, source, a == batch.learner, update, sel)
    return metrics


def _source_metrics(
    name: str,
    source: str,
    batch: LearnerBatch,
    rows_B: torch.Tensor,
    grad_B: torch.Tensor,
    response_B: torch.Tensor,
) -> dict[str, float]:
    """Advantage sums, gradient share and length of one source's rows in the learner's batch."""
    advantages_B = batch.advantages_B[rows_B]
    weighted_B = (batch.advantages_B * batch.cross_coef_B)[rows_B & grad_B]
    prefix = f"adv_src/{name}/{source}"
    return {
        f"{prefix}/sum": advantages_B.sum().item(),
        f"{prefix}/mean": advantages_B.mean().item(),
        f"{prefix}/grad_sum": weighted_B.sum().item(),
        f"grad_frac/{name}/{source}": (rows_B & grad_B).sum().item() / rows_B.sum().item(),
        f"length/{name}/{source}": response_B[rows_B].float().mean().item(),
    }


def _ratio_metrics(
    name: str, source: str, own: bool, update: LearnerUpdate, sel: torch.Tensor
) -> dict[str, float]:
    """``is/`` and ``is_mb/`` statistics of one source's forwarded rows."""
    prefix = f"is/{name}/{source}"
    s_B, clipped = update.ratio_B[sel], update.clipped_B[sel].mean().item()
    metrics = {
        f"{prefix}/ratio_mean": s_B.mean().item(),
        f"{prefix}/ratio_min": s_B.min().item(),
        f"{prefix}/ratio_max": s_B.max().item(),
        f"{prefix}/clip_frac": clipped,
    }
    if not own:
        metrics[f"{prefix}/in_range_frac"] = 1.0 - clipped
    for m in sorted({int(m) for m in update.minibatch_B[sel].tolist()}):
        in_m = sel & (update.minibatch_B == m)
        clipped_m = update.clipped_B[in_m].mean().item()
        per_m = f"is_mb/{name}/{source}/{m}"
        metrics[f"{per_m}/ratio_mean"] = update.ratio_B[in_m].mean().item()
        metrics[f"{per_m}/{'in_range_frac' if not own else 'clip_frac'}"] = (
            clipped_m if own else 1.0 - clipped_m
        )
    return metrics


def step_metrics(
    names: list[str],
    rewards_P_A_G: torch.Tensor,
    p_hat_A: torch.Tensor,
    omega_A_A: torch.Tensor,
    rollouts_A: list[list[SharedRollout]],
    updates: list[UpdateReport],
) -> dict[str, float]:
    """Per agent: rollout accuracy and its spread (``rewards_P_A_G``: ``task.reward``'s grades), P̂, ω,
    generation cost, response lengths and the share cut by the length cap; then every learner's own metrics
    (`learner_metrics`, from its update report: its learning rate among them)."""
    metrics: dict[str, float] = {}
    P, _, G = rewards_P_A_G.shape
    acc_A = rewards_P_A_G.mean(dim=(0, 2))
    for a, name in enumerate(names):
        rollouts = rollouts_A[a]
        metrics[f"train/acc/{name}"] = acc_A[a].item()
        metrics[f"train/reward_std/{name}"] = rewards_P_A_G[:, a].std().item()
        metrics[f"capability/{name}"] = p_hat_A[a].item()
        metrics[f"cost/{name}/generated_responses"] = float(P * G)
        metrics[f"cost/{name}/generated_tokens"] = float(sum(r.length for r in rollouts))
        # Response lengths in the author's tokens and in characters (comparable across tokenizers).
        metrics[f"train/length/{name}"] = sum(r.length for r in rollouts) / max(len(rollouts), 1)
        metrics[f"train/length_chars/{name}"] = sum(len(r.text) for r in rollouts) / max(len(rollouts), 1)
        cut = sum(r.finish_reason == "length" for r in rollouts)
        metrics[f"train/truncated_frac/{name}"] = cut / max(len(rollouts), 1)
        for j, source in enumerate(names):
            metrics[f"omega/{name}/{source}"] = omega_A_A[a, j].item()
    for update in updates:
        metrics |= update.metrics
    return metrics


def omega_metrics(names: list[str], baseline_L_A: torch.Tensor, coef_A_L: torch.Tensor) -> dict[str, float]:
    """The ω each learner used: ``omega_baseline/<learner>/<source>`` (the source's weight in its baseline,
    Eq. 7) and ``omega_loss/<learner>/<source>`` (the source's coefficient in its loss, Eq. 10; 1 for its own
    rows)."""
    metrics = {}
    for k, name in enumerate(names):
        for a, source in enumerate(names):
            metrics[f"omega_baseline/{name}/{source}"] = baseline_L_A[k, a].item()
            metrics[f"omega_loss/{name}/{source}"] = coef_A_L[a, k].item() if a != k else 1.0
    return metrics


def sample_rows(
    names: list[str],
    rollouts_A: list[list[SharedRollout]],
    items: list[TaskItem],
    updates: list[UpdateReport],
    per_author: int,
) -> list[dict[str, Any]]:
    """``per_author`` rollouts of every author, the same prompts for each (the step's first ones, all of
    their answers in turn), with reward and each learner's advantage, ratio and bounds: the step's
    ``samples/step_*.jsonl``."""
    rows = []
    for rollouts in rollouts_A:
        for rollout in sorted(rollouts, key=lambda r: (r.prompt_index, r.index))[:per_author]:
            row: dict[str, Any] = {
                "id": str(rollout.id),
                "prompt": rollout.prompt,
                "answer": items[rollout.prompt_index].answer,
                "author": names[rollout.author],
                "text": rollout.text,
                "reward": rollout.reward,
                "grade": rollout.grade_reason,
                **({"rewards": dict(rollout.reward_terms)} if rollout.reward_terms else {}),
                "length": rollout.length,
                "finish_reason": rollout.finish_reason,
            }
            for name, update in zip(names, updates):
                if rollout.id in update.samples:
                    row[f"learner/{name}"] = update.samples[rollout.id]
            rows.append(row)
    return rows
