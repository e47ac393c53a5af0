"""One learner's mini-batch updates (Algorithm 1, lines 16-17): the loop, in one screen.

    for each mini-batch m (one optimizer step; its shared rows meet the stepwise bound of m, Eq. 14):
        for each micro-batch (gradient accumulation, a memory knob only):
            forward: the learner's log-probs of the rows
            loss:    the method's policy loss against each row's old policy (`workbench.train.scoring`)
            backward
        clip the gradient norm; step

Every registered policy loss is called the same way, ``loss(PolicyBatch, LossParams)``, so the loop never
branches on the method; the per-sample `SampleStats` it returns are recorded per row (`LearnerUpdate`) and
aggregated once, by `workbench.train.metrics.learner_metrics`.

Rows whose loss term is a constant get no backward pass, and the loss, its mean over the mini-batch's rows and
its gradient are those of training every row: rows of advantage 0 are not forwarded at all (the plan,
`workbench.train.batches.LearnerBatch.plan`), and shared rows that clipping leaves without gradient are found
by a no-grad probe first (`workbench.train.probe`, one call per micro-batch).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch

from workbench.agents.forward.agent import Agent, threads_for_pass
from workbench.agents.forward.packing import packed_attention, supports_packing
from workbench.agents.forward.passes import token_logprobs
from workbench.agents.forward.tokens import TokenBatch
from workbench.core import losses
from workbench.core.losses import LossParams, low_var_kl
from workbench.core.progress import bar
from workbench.train.batches import LearnerBatch, MiniBatch, UpdateSettings, update_plan
from workbench.train.probe import ClippedRowProbe
from workbench.train.scoring import policy_batch

__all__ = ["LearnerUpdate", "TrainingError", "UpdateSettings", "update_learner"]


class TrainingError(RuntimeError):
    """A step cannot continue (non-finite loss, ...); the last good checkpoint is kept."""


@dataclass
class LearnerUpdate:
    """What one learner's updates of a step produced (per-sample stats indexed like the batch; NaN on rows
    left out of the update)."""

    ratio_B: torch.Tensor
    lower_B: torch.Tensor
    upper_B: torch.Tensor
    clipped_B: torch.Tensor
    term_B: torch.Tensor
    """Each row's term of its mini-batch's loss (`losses.SampleStats.term_B`)."""
    minibatch_B: torch.Tensor
    """The mini-batch index m each row was trained in (the m of its stepwise bound, Eq. 14)."""
    losses: list[float] = field(default_factory=list)
    """Each mini-batch's policy loss: the mean over its rows (unforwarded rows of advantage 0 included)."""
    sizes: list[int] = field(default_factory=list)
    """Each mini-batch's rows (the loss's denominator)."""
    kls: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    n_updates: int = 0

    @classmethod
    def empty(cls, n: int, n_updates: int) -> LearnerUpdate:
        """NaN statistics for ``n`` rows (rows the loop never trains keep them) and no losses yet."""
        return cls(*(torch.full((n,), math.nan) for _ in range(6)), n_updates=n_updates)

    def record(self, rows: list[int], m: int, stats: losses.SampleStats) -> None:
        """One micro-batch's per-sample statistics, trained in mini-batch ``m``."""
        index_B = torch.tensor(rows, dtype=torch.long)
        for name in ("ratio_B", "lower_B", "upper_B", "clipped_B", "term_B"):
            getattr(self, name)[index_B] = getattr(stats, name).float().cpu()
        self.minibatch_B[index_B] = float(m)


def update_learner(
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    batch: LearnerBatch,
    params: LossParams,
    settings: UpdateSettings,
    *,
    where: str = "",
) -> LearnerUpdate:
    """Mini-batch updates of one learner on its batch; mini-batch m uses the stepwise bound of m (Eq. 14).

    Args:
        agent: The learner.
        optimizer: Its optimizer.
        batch: Its batch, every row with its old policy (`workbench.train.scoring.set_old_policy`).
        params: The loss scalars.
        settings: Mini-batch sizes, temperature, KL and gradient clip.
        where: Named in the error of a non-finite loss (``"step 3, learner 'gpt2-char'"``).

    Returns:
        Per-sample ratios, bounds and clip shares, and the losses, KLs and gradient norms.

    Raises:
        TrainingError: A non-finite loss (nothing of this mini-batch is applied).
    """
    loss_fn = losses.get_policy_loss(settings.loss)
    plan = update_plan(batch, settings)
    out = LearnerUpdate.empty(len(batch), n_updates=len(plan))
    probe = ClippedRowProbe(agent, batch, loss_fn, params, settings.temperature)
    rows_total = sum(len(rows) for minibatch in plan for rows in minibatch.micro_batches)
    with bar(rows_total, f"{agent.name} update", "seq") as progress:
        for m, minibatch in enumerate(plan):
            _minibatch(agent, optimizer, batch, params, settings, loss_fn, probe, m, minibatch, out, where)
            progress.update(sum(len(rows) for rows in minibatch.micro_batches))
    return out


def _minibatch(
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    batch: LearnerBatch,
    params: LossParams,
    settings: UpdateSettings,
    loss_fn: losses.PolicyLoss,
    probe: ClippedRowProbe,
    m: int,
    minibatch: MiniBatch,
    out: LearnerUpdate,
    where: str,
) -> None:
    """One optimizer step: mini-batch ``m``'s micro-batches forward and backward, clip, step."""
    optimizer.zero_grad(set_to_none=True)
    loss_m, backward = 0.0, False
    for rows in minibatch.micro_batches:
        rows, clipped, clipped_stats, clipped_loss = probe.split(rows, m)  # constant terms: no backward
        if clipped:
            out.record(clipped, m, clipped_stats)
            if not math.isfinite(clipped_loss):
                raise TrainingError(f"non-finite loss {clipped_loss} at {where}, mini-batch {m}")
            loss_m += clipped_loss / minibatch.size
        if not rows:
            continue
        view = batch.tokens.select(rows)
        with _forward_pass(agent, view):
            logp_B_T, mask_B_T = token_logprobs(agent, view, temperature=settings.temperature)
            # HACPO: mini-batch m clips cross ratios to the stepwise bound of m (Eq. 14).
            inputs = policy_batch(batch, rows, view, logp_B_T, mask_B_T, m)
            loss, stats = loss_fn(inputs, params)
            total = loss + settings.kl_coef * _kl(batch, rows, view, inputs, out)
            if not torch.isfinite(total):
                raise TrainingError(f"non-finite loss {total.item()} at {where}, mini-batch {m}")
            # The loss is a mean over the mini-batch's rows, those not forwarded included.
            (total * len(rows) / minibatch.size).backward()
        out.record(rows, m, stats)
        loss_m += loss.item() * len(rows) / minibatch.size
        backward = True
    out.losses.append(loss_m)
    out.sizes.append(minibatch.size)
    if not backward:  # no row with a gradient: the step sees zero gradients, as it would
        for p in agent.trainable_parameters():
            p.grad = torch.zeros_like(p)
    out.grad_norms.append(
        torch.nn.utils.clip_grad_norm_(agent.trainable_parameters(), settings.grad_clip).item()
    )
    optimizer.step()


def _forward_pass(agent: Agent, view: TokenBatch) -> contextlib.ExitStack:
    """Threads for the pass's size and, where the model packs rows, packed attention (a checkpointed
    backward pass recomputes packed layers, so the block holds the backward pass too)."""
    stack = contextlib.ExitStack()
    stack.enter_context(threads_for_pass(agent, view))
    if supports_packing(agent.model):
        stack.enter_context(packed_attention(agent.model))
    return stack


def _kl(
    batch: LearnerBatch,
    rows: list[int],
    view: TokenBatch,
    policy_batch: losses.PolicyBatch,
    out: LearnerUpdate,
) -> torch.Tensor | float:
    """KL to the reference on the learner's own rows of a micro-batch (authors' code; not the paper):
    their summed low_var_kl over the micro-batch's rows (so that the mini-batch's loss gets their mean over
    its rows), or 0 without a reference. Logs the mean over the own rows."""
    own = [b for b, r in enumerate(rows) if batch.ref_logp_T[r] is not None]
    if not own:
        return 0.0
    index_B = torch.tensor(own, device=policy_batch.logp_B_T.device)
    ref_logp_B_T = batch.token_view(batch.ref_logp_T, [rows[b] for b in own], view)
    kl_B = low_var_kl(policy_batch.logp_B_T[index_B], ref_logp_B_T, policy_batch.mask_B_T[index_B])
    out.kls.append(kl_B.mean().item())
    return kl_B.sum() / len(rows)
