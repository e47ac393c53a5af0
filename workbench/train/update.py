"""One learner's mini-batch updates (Algorithm 1, lines 16-17) and the per-step metrics they produce.

`update_learner` splits a `LearnerBatch` into mini-batches (one optimizer step each; mini-batch m gets the
stepwise bound of m, Eq. 14) and micro-batches (gradient accumulation, a memory knob only). Every registered
policy loss is called the same way, ``loss(PolicyBatch, LossParams)``, so the loop never branches on the
method; the per-sample `SampleStats` it returns are aggregated once, by `learner_metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from workbench.agents.agent import Agent
from workbench.agents.rollout import reference_token_logprobs, token_logprobs
from workbench.agents.tokens import TokenBatch
from workbench.core import losses
from workbench.core.losses import LossParams, PolicyBatch, low_var_kl, masked_mean_logp
from workbench.train.batches import LearnerBatch

__all__ = ["LearnerUpdate", "TrainingError", "UpdateSettings", "learner_metrics", "update_learner"]


class TrainingError(RuntimeError):
    """A step cannot continue (non-finite loss, ...); the last good checkpoint is kept."""


@dataclass(frozen=True)
class UpdateSettings:
    """What the update loop needs besides the loss scalars (unpacked from the config by the trainer)."""

    loss: str
    """Key of ``workbench.core.losses.POLICY_LOSSES``."""
    minibatch_size: int
    """Sequences per optimizer step."""
    micro_batch_size: int
    """Sequences per forward/backward."""
    temperature: float
    """Log-probs are of softmax(logits / temperature), the sampling distribution."""
    kl_coef: float
    """low_var_kl coefficient on self samples (0 = no reference pass)."""
    grad_clip: float
    """Gradient-norm clip."""


@dataclass
class _Micro:
    """One micro-batch: its rows, token view, and the no-grad passes made before any update."""

    rows: torch.Tensor
    view: TokenBatch
    old_logp_B_T: torch.Tensor
    ref_logp_B_T: torch.Tensor | None


@dataclass
class LearnerUpdate:
    """What one learner's updates of a step produced (per-sample stats are indexed like the batch)."""

    ratio_B: torch.Tensor
    lower_B: torch.Tensor
    upper_B: torch.Tensor
    clipped_B: torch.Tensor
    losses: list[float] = field(default_factory=list)
    kls: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    n_updates: int = 0


def _micro_batches(
    agent: Agent, batch: LearnerBatch, settings: UpdateSettings
) -> tuple[list[list[_Micro]], torch.Tensor]:
    """Mini-batches of micro-batches with old and reference log-probs, and the old means of every row.

    The old (self) and reference token log-probs are computed before any update, in the exact micro-batches
    of the update: an on-policy self sample then has s = 1 exactly in the first mini-batch.
    """
    minibatches: list[list[_Micro]] = []
    old_mean_B = batch.old_logp_mean_B.clone()
    agent.model.eval()
    with torch.no_grad():
        for start in range(0, len(batch), settings.minibatch_size):
            stop = min(start + settings.minibatch_size, len(batch))
            micros = []
            for first in range(start, stop, settings.micro_batch_size):
                rows = torch.arange(first, min(first + settings.micro_batch_size, stop))
                view = batch.tokens.select(rows)
                old_logp_B_T, mask_B_T = token_logprobs(agent, view, temperature=settings.temperature)
                ref = None
                if settings.kl_coef > 0 and batch.is_self_B[rows].any():
                    ref, _ = reference_token_logprobs(agent, view, temperature=settings.temperature)
                self_mean_B = masked_mean_logp(old_logp_B_T, mask_B_T)
                old_mean_B[rows] = torch.where(batch.is_self_B[rows], self_mean_B, old_mean_B[rows])
                micros.append(_Micro(rows, view, old_logp_B_T, ref))
            minibatches.append(micros)
    return minibatches, old_mean_B


def update_learner(
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    batch: LearnerBatch,
    params: LossParams,
    settings: UpdateSettings,
    *,
    where: str = "",
) -> LearnerUpdate:
    """Mini-batch updates of one learner; mini-batch m uses the stepwise bound of m (Eq. 14).

    Args:
        agent: The learner.
        optimizer: Its optimizer.
        batch: Its batch (self samples first).
        params: The loss scalars.
        settings: Mini-batch sizes, temperature, KL and gradient clip.
        where: Named in the error of a non-finite loss (``"step 3, learner 'gpt2-char'"``).

    Returns:
        Per-sample ratios, bounds and clip shares, and the losses, KLs and gradient norms.

    Raises:
        TrainingError: A non-finite loss (nothing of this mini-batch is applied).
    """
    loss_fn = losses.get_policy_loss(settings.loss)
    device = agent.device
    minibatches, old_mean_B = _micro_batches(agent, batch, settings)
    n = len(batch)
    out = LearnerUpdate(*(torch.zeros(n) for _ in range(4)), n_updates=len(minibatches))
    for m, micros in enumerate(minibatches):
        optimizer.zero_grad(set_to_none=True)
        mb_len = sum(len(micro.rows) for micro in micros)
        for micro in micros:
            rows = micro.rows
            logp_B_T, mask_B_T = token_logprobs(agent, micro.view, temperature=settings.temperature)
            policy_batch = PolicyBatch(
                logp_B_T=logp_B_T,
                mask_B_T=mask_B_T,
                old_logp_mean_B=old_mean_B[rows].to(device),
                advantages_B=batch.advantages_B[rows].to(device),
                is_self_B=batch.is_self_B[rows].to(device),
                cross_coef_B=batch.cross_coef_B[rows].to(device),
                minibatch_index=m,
                old_logp_B_T=micro.old_logp_B_T,
            )
            loss, stats = loss_fn(policy_batch, params)
            total = loss
            if micro.ref_logp_B_T is not None:
                # KL to the reference on self samples only (the authors' code, spec §9.9).
                kl_B = low_var_kl(logp_B_T, micro.ref_logp_B_T, mask_B_T)
                kl = (kl_B * policy_batch.is_self_B).sum() / len(rows)
                total = total + settings.kl_coef * kl
                out.kls.append(kl.item())
            if not torch.isfinite(total):
                raise TrainingError(f"non-finite loss {total.item()} at {where}, mini-batch {m}")
            (total * len(rows) / mb_len).backward()
            out.losses.append(loss.item())
            for name in ("ratio_B", "lower_B", "upper_B", "clipped_B"):
                getattr(out, name)[rows] = getattr(stats, name).float().cpu()
        params_ = agent.trainable_parameters()
        out.grad_norms.append(torch.nn.utils.clip_grad_norm_(params_, settings.grad_clip).item())
        optimizer.step()
    return out


def learner_metrics(
    name: str, names: list[str], batch: LearnerBatch, update: LearnerUpdate
) -> dict[str, float]:
    """``is/<learner>/<source>/*``, loss, KL, grad norm, advantage and cost metrics of one learner.

    ``clip_frac`` is the share of a source's samples whose gradient clipping removed (the loss's own
    definition: the clipped branch of GSPO's min, or a cross ratio outside [lb_m, 1]); for cross sources
    ``in_range_frac`` is the share that gave gradient.
    """
    metrics = {
        f"loss/{name}": sum(update.losses) / max(len(update.losses), 1),
        f"grad_norm/{name}": sum(update.grad_norms) / max(len(update.grad_norms), 1),
        f"adv/{name}/mean": batch.advantages_B.mean().item(),
        f"adv/{name}/abs_mean": batch.advantages_B.abs().mean().item(),
        f"cost/{name}/trained_responses": float(len(batch)),
        f"cost/{name}/trained_tokens": float(batch.tokens.response_mask_B_T.sum().item()),
        f"cost/{name}/updates": float(update.n_updates),
    }
    if update.kls:
        metrics[f"kl/{name}"] = sum(update.kls) / len(update.kls)
    for key, value in batch.sharing_stats.items():
        metrics[f"share/{name}/{key}"] = value
    for a, source in enumerate(names):
        sel = batch.source_B == a
        if not sel.any():
            continue
        prefix = f"is/{name}/{source}"
        s_B, clipped = update.ratio_B[sel], update.clipped_B[sel].mean().item()
        metrics[f"{prefix}/ratio_mean"] = s_B.mean().item()
        metrics[f"{prefix}/ratio_min"] = s_B.min().item()
        metrics[f"{prefix}/ratio_max"] = s_B.max().item()
        metrics[f"{prefix}/clip_frac"] = clipped
        if a != batch.learner:
            metrics[f"{prefix}/in_range_frac"] = 1.0 - clipped
    return metrics
