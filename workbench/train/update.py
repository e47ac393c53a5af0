"""One learner's mini-batch updates (Algorithm 1, lines 16-17), its one no-grad pass, and their metrics.

`score_self` is the learner's no-grad pass of a step: over its own rollouts, before any update, in
micro-batches of the update's sizes. It gives the old log-likelihoods the author shares and the learner's own
old (and KL reference) log-probs, stored per row of its batch; cross samples need no pass of the learner,
since their old log-prob is the source's (Eq. 11). The symmetric Naive (``hacpo.naive_symmetric``) is the one
exception: its learner scores the shared rows too, at the start of its update, and takes them as its own old
policy. In mini-batch 0, before the learner's first optimizer step, the rows it scored take its current
log-probs as their old ones (`workbench.train.batches.LearnerBatch.policy_batch`): s = 1 exactly there.

`update_learner` is the mini-batch loop: for each mini-batch (one optimizer step; mini-batch m gets the
stepwise bound of m, Eq. 14), for each micro-batch (gradient accumulation of own and shared rows together, a
memory knob only): the learner's log-probs, the loss, backward; then clip and step. Every registered policy
loss is called the same way, ``loss(PolicyBatch, LossParams)``, so the loop never branches on the method; the
per-sample `SampleStats` it returns are aggregated once, by `learner_metrics`.

Rows whose loss term is a constant get no backward pass; the loss, its mean over the mini-batch's rows and
its gradient are those of training every row: rows of advantage 0 are not forwarded at all (the plan,
`workbench.train.batches.LearnerBatch.plan`), and a no-grad pass over a micro-batch's shared rows finds those
whose ratio clipping leaves without gradient (`_clipped_rows`; between heterogeneous agents most shared ratios
fall outside [lb_m, 1]), as long as enough of them do to pay for that pass (`PROBE_BREAK_EVEN`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field

import torch

from workbench.agents.agent import Agent
from workbench.agents.packing import packed_attention, supports_packing
from workbench.agents.rollout import reference_token_logprobs, token_logprobs
from workbench.agents.threads import threads_for
from workbench.agents.tokens import TokenBatch, self_token_batch
from workbench.core import losses
from workbench.core.losses import LossParams, length_normalized_logp, low_var_kl
from workbench.core.types import Rollout
from workbench.train.batches import LearnerBatch, MiniBatch, OldScores, plan_micro_batches

__all__ = [
    "LearnerUpdate",
    "TrainingError",
    "UpdateSettings",
    "learner_metrics",
    "score_cross",
    "score_own",
    "score_self",
    "update_learner",
]


class TrainingError(RuntimeError):
    """A step cannot continue (non-finite loss, ...); the last good checkpoint is kept."""


@dataclass(frozen=True)
class UpdateSettings:
    """What the update loop needs besides the loss scalars (unpacked from the config by the trainer)."""

    loss: str = "gspo"
    """Key of ``workbench.core.losses.POLICY_LOSSES``."""
    minibatch_size: int = 64
    """Sequences per optimizer step."""
    micro_batch_size: int = 64
    """Sequences per forward/backward at most."""
    micro_batch_tokens: int | None = None
    """Prompt + response tokens per forward/backward at most (None: sequences alone bound a micro-batch)."""
    temperature: float = 1.0
    """Log-probs are of softmax(logits / temperature), the sampling distribution."""
    kl_coef: float = 0.0
    """low_var_kl coefficient on self samples (0 = no reference pass)."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    skip_uniform_groups: bool = False
    """Leave out the samples of prompts whose advantages are all 0 in the learner's batch; the kept samples
    are spread over as many mini-batches as the full batch has (so the update count stays the same)."""
    cross_old_from_learner: bool = False
    """Take a cross sample's old policy from the learner's own no-grad pass at the start of its update instead
    of the source's shared log-likelihood (the symmetric Naive, ``hacpo.naive_symmetric``)."""


@dataclass
class LearnerUpdate:
    """What one learner's updates of a step produced (per-sample stats indexed like the batch; NaN on rows
    left out of the update)."""

    ratio_B: torch.Tensor
    lower_B: torch.Tensor
    upper_B: torch.Tensor
    clipped_B: torch.Tensor
    minibatch_B: torch.Tensor
    """The mini-batch index m each row was trained in (the m of its stepwise bound, Eq. 14)."""
    losses: list[float] = field(default_factory=list)
    """Each mini-batch's policy loss: the mean over its rows (unforwarded rows of advantage 0 included)."""
    kls: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    n_updates: int = 0

    @classmethod
    def empty(cls, n: int, n_updates: int) -> LearnerUpdate:
        """NaN statistics for ``n`` rows (rows the loop never trains keep them) and no losses yet."""
        return cls(*(torch.full((n,), math.nan) for _ in range(5)), n_updates=n_updates)

    def record(self, rows: list[int], m: int, stats: losses.SampleStats) -> None:
        """One micro-batch's per-sample statistics, trained in mini-batch ``m``."""
        index_B = torch.tensor(rows, dtype=torch.long)
        for name in ("ratio_B", "lower_B", "upper_B", "clipped_B"):
            getattr(self, name)[index_B] = getattr(stats, name).float().cpu()
        self.minibatch_B[index_B] = float(m)


def score_own(agent: Agent, rollouts: list[Rollout], settings: UpdateSettings) -> OldScores:
    """`score_self` of an author's own rollouts, in micro-batches of the update's sizes, with each rollout's
    ``old_logp_sum`` and ``old_logp_count`` filled in: what it shares (Eq. 11)."""
    tokens = self_token_batch(rollouts, agent.pad_token_id)
    plan = plan_micro_batches(
        range(len(rollouts)),
        1,
        settings.micro_batch_size,
        micro_batch_tokens=settings.micro_batch_tokens,
        length_B=tokens.attention_mask_B_T.sum(dim=-1).tolist(),
    )
    scores = score_self(
        agent,
        tokens,
        [rows for minibatch in plan for rows in minibatch.micro_batches],
        temperature=settings.temperature,
        reference=settings.kl_coef > 0,
    )
    for rollout, total, count in zip(rollouts, scores.sums, scores.counts):
        rollout.old_logp_sum, rollout.old_logp_count = total, count
    return scores


@torch.no_grad()
def score_self(
    agent: Agent,
    tokens: TokenBatch,
    micro_batches: list[list[int]],
    *,
    temperature: float,
    reference: bool = False,
    length_B: torch.Tensor | None = None,
) -> OldScores:
    """The learner's log-probs of some rows under its current policy, before any update: its old policy.

    Runs micro-batch by micro-batch, in the update's micro-batches (so an on-policy self sample has s = 1
    exactly in the first mini-batch), eval mode, no gradient.

    Args:
        agent: The learner, before any update of the step.
        tokens: The token view the rows index (its own rollouts: `workbench.agents.tokens.self_token_batch`).
        micro_batches: Rows of ``tokens`` per micro-batch, in update order.
        temperature: The sampling temperature (log-probs of softmax(logits / temperature)).
        reference: Also the KL reference's log-probs (``train.kl_coef`` > 0).
        length_B: Per row of ``tokens``, a byte length dividing the summed log-probs instead of the token
            count where > 0 (bytes normalization); None = token counts.

    Returns:
        The `OldScores` of the rows, in the order of ``micro_batches``.
    """
    scores = OldScores([], [], [] if reference else None, torch.zeros(0), [], [])
    means = []
    agent.model.eval()
    for rows in micro_batches:
        view = tokens.select(rows)
        with _threads(agent, view):
            old_logp_B_T, mask_B_T = token_logprobs(agent, view, temperature=temperature)
            ref_logp_B_T = reference_token_logprobs(agent, view, temperature)[0] if reference else None
        lengths = length_B[rows].to(old_logp_B_T.device) if length_B is not None else None
        means.append(length_normalized_logp(old_logp_B_T, mask_B_T, lengths))
        widths = view.attention_mask_B_T.sum(dim=-1).tolist()
        for b, (logp_T, m_T) in enumerate(zip(old_logp_B_T.cpu(), mask_B_T.cpu())):
            scores.rows.append(rows[b])
            scores.logp_T.append(old_logp_B_T[b, : widths[b] - 1])
            if ref_logp_B_T is not None:
                scores.ref_logp_T.append(ref_logp_B_T[b, : widths[b] - 1])
            values_T = logp_T[m_T.bool()]
            scores.sums.append(float(values_T.double().sum()))
            scores.counts.append(int(values_T.numel()))
    scores.mean_B = torch.cat(means) if means else torch.zeros(0, device=agent.device)
    return scores


def score_cross(agent: Agent, batch: LearnerBatch, settings: UpdateSettings) -> None:
    """The symmetric Naive (``hacpo.naive_symmetric``): the learner's own old log-probs of the shared rows of
    ``batch`` it trains, before its update, set as their old policy (in mini-batch 0 they are replaced by
    the current ones, as an own row's are: `LearnerBatch.policy_batch`)."""
    cross = [
        [r for r in rows if not batch.is_self_B[r]]
        for minibatch in _plan(batch, settings)
        for rows in minibatch.micro_batches
    ]
    cross = [rows for rows in cross if rows]
    scores = score_self(agent, batch.tokens, cross, temperature=settings.temperature, length_B=batch.length_B)
    batch.set_old_scores(scores)


def _plan(batch: LearnerBatch, settings: UpdateSettings) -> list[MiniBatch]:
    return batch.plan(
        settings.minibatch_size,
        settings.micro_batch_size,
        settings.micro_batch_tokens,
        kl_on_self=settings.kl_coef > 0,
    )


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
        batch: Its batch, every row with its old log-probs (`workbench.train.batches.build_learner_batch`).
        params: The loss scalars.
        settings: Mini-batch sizes, temperature, KL and gradient clip.
        where: Named in the error of a non-finite loss (``"step 3, learner 'gpt2-char'"``).

    Returns:
        Per-sample ratios, bounds and clip shares, and the losses, KLs and gradient norms.

    Raises:
        TrainingError: A non-finite loss (nothing of this mini-batch is applied).
    """
    loss_fn = losses.get_policy_loss(settings.loss)
    plan = _plan(batch, settings)
    out = LearnerUpdate.empty(len(batch), n_updates=len(plan))
    probes = _Probes()
    for m, minibatch in enumerate(plan):
        optimizer.zero_grad(set_to_none=True)
        minibatch_loss, backward = 0.0, False
        step = _Step(agent, batch, loss_fn, params, settings, out, m, minibatch.size, where)
        for rows in minibatch.micro_batches:
            shared = [r for r in rows if batch.old_logp_T[r] is None]  # old policy: another agent's
            if shared and probes.worth_it():
                clipped, clipped_loss = _clipped_rows(agent, batch, shared, m, loss_fn, params, settings, out)
                if not math.isfinite(clipped_loss):
                    raise TrainingError(f"non-finite loss {clipped_loss} at {where}, mini-batch {m}")
                probes.count(len(shared), len(clipped))
                minibatch_loss += clipped_loss / minibatch.size
                no_grad = set(clipped)
                rows = [r for r in rows if r not in no_grad]
            if rows:
                minibatch_loss += step.backward(rows)
                backward = True
        out.losses.append(minibatch_loss)
        if not backward:  # no row with a gradient: the step sees zero gradients, as it would
            for p in agent.trainable_parameters():
                p.grad = torch.zeros_like(p)
        out.grad_norms.append(
            torch.nn.utils.clip_grad_norm_(agent.trainable_parameters(), settings.grad_clip).item()
        )
        optimizer.step()
    return out


@dataclass(frozen=True)
class _Step:
    """What a micro-batch's forward and backward in mini-batch ``m`` (of ``size`` rows) needs."""

    agent: Agent
    batch: LearnerBatch
    loss_fn: losses.PolicyLoss
    params: LossParams
    settings: UpdateSettings
    out: LearnerUpdate
    m: int
    size: int
    where: str

    def backward(self, rows: list[int]) -> float:
        """Forward and backward of ``rows``; records their statistics and returns their share of the
        mini-batch's policy loss."""
        agent, batch, m = self.agent, self.batch, self.m
        view = batch.tokens.select(rows)
        # A checkpointed backward pass recomputes packed layers: the packed block holds it too.
        packed = packed_attention(agent.model) if supports_packing(agent.model) else contextlib.nullcontext()
        with _threads(agent, view), packed:
            logp_B_T, mask_B_T = token_logprobs(agent, view, temperature=self.settings.temperature)
            # HACPO: mini-batch m clips cross ratios to the stepwise bound of m (Eq. 14).
            policy_batch = batch.policy_batch(rows, view, logp_B_T, mask_B_T, m)
            loss, stats = self.loss_fn(policy_batch, self.params)
            total = loss + self.settings.kl_coef * _kl(batch, rows, view, policy_batch, self.out)
            if not torch.isfinite(total):
                raise TrainingError(f"non-finite loss {total.item()} at {self.where}, mini-batch {m}")
            # The loss is a mean over the mini-batch's rows, those not forwarded included.
            (total * len(rows) / self.size).backward()
        self.out.record(rows, m, stats)
        return loss.item() * len(rows) / self.size


PROBE_BREAK_EVEN = 0.35
"""A no-grad forward costs about 0.35 of a forward and backward (the quickstart's agents on CPU): probing
shared rows for clipped ones pays while at least this share of the probed rows turn out clipped."""


@dataclass
class _Probes:
    """Shared rows probed and found clipped so far in one learner's update (probing goes on while it pays)."""

    probed: int = 0
    clipped: int = 0

    def worth_it(self) -> bool:
        return self.probed == 0 or self.clipped >= PROBE_BREAK_EVEN * self.probed

    def count(self, probed: int, clipped: int) -> None:
        self.probed, self.clipped = self.probed + probed, self.clipped + clipped


@torch.no_grad()
def _clipped_rows(
    agent: Agent,
    batch: LearnerBatch,
    rows: list[int],
    m: int,
    loss_fn: losses.PolicyLoss,
    params: LossParams,
    settings: UpdateSettings,
    out: LearnerUpdate,
) -> tuple[list[int], float]:
    """The rows whose loss term clipping leaves without gradient (``SampleStats.clipped_B`` = 1: a shared
    ratio outside its bounds, Eqs. 13-14, or GSPO's clipped branch), found by a no-grad pass in mini-batch
    ``m``; they need no backward pass. Records their statistics; returns them and the sum of their (constant)
    loss terms, which the mini-batch's loss still holds."""
    view = batch.tokens.select(rows)
    with _threads(agent, view):
        logp_B_T, mask_B_T = token_logprobs(agent, view, temperature=settings.temperature)
    policy_batch = batch.policy_batch(rows, view, logp_B_T, mask_B_T, m)
    _, stats = loss_fn(policy_batch, params)
    clipped_B = stats.clipped_B == 1
    if not clipped_B.any():
        return [], 0.0
    # Every loss term is its row's advantage times a factor: the clipped rows' terms are the loss of the
    # micro-batch with every other advantage set to 0.
    alone = dataclasses.replace(policy_batch, advantages_B=policy_batch.advantages_B * clipped_B)
    loss, _ = loss_fn(alone, params)
    clipped = [r for r, c in zip(rows, clipped_B.tolist()) if c]
    out.record(
        clipped,
        m,
        losses.SampleStats(*(getattr(stats, f.name)[clipped_B] for f in dataclasses.fields(stats))),
    )
    return clipped, loss.item() * len(rows)


def _threads(agent: Agent, view: TokenBatch) -> contextlib.AbstractContextManager[None]:
    """`threads_for` a pass over a micro-batch, its response tokens the measure of its work."""
    return threads_for(agent, int(view.response_mask_B_T.sum()))


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


def learner_metrics(
    name: str, names: list[str], batch: LearnerBatch, update: LearnerUpdate, *, skipping: bool = False
) -> dict[str, float]:
    """``is/<learner>/<source>/*``, loss, KL, grad norm, advantage and cost metrics of one learner.

    ``clip_frac`` is the share of a source's samples whose gradient clipping removed (the loss's own
    definition: the clipped branch of GSPO's min, or a cross ratio outside [lb_m, 1]); for cross sources
    ``in_range_frac`` is the share that gave gradient. The ``is/`` statistics count the samples forwarded
    (those of advantage 0 are not, unless a KL term needs them); ``cost/<learner>/trained_*`` counts every
    sample of the update, ``forwarded_tokens`` the response tokens forwarded. With ``skipping``
    (``skip_uniform_groups``) only the kept samples count and ``adv/<learner>/kept_frac`` is their share.
    The same ratio mean and clip (or in-range) share per mini-batch index m, under
    ``is_mb/<learner>/<source>/<m>/``, give the paper's Table 6 per mini-batch: cross ratios meet a tighter
    bound in each later mini-batch (Eq. 14).
    """
    kept_B = ~update.ratio_B.isnan()  # forwarded: rows of advantage 0 have no ratio
    response_B = batch.tokens.response_mask_B_T.sum(dim=-1)
    metrics = {
        f"loss/{name}": sum(update.losses) / max(len(update.losses), 1),
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
        sel = (batch.source_B == a) & kept_B
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
        for m in sorted({int(m) for m in update.minibatch_B[sel].tolist()}):
            in_m = sel & (update.minibatch_B == m)
            clipped_m = update.clipped_B[in_m].mean().item()
            per_m = f"is_mb/{name}/{source}/{m}"
            metrics[f"{per_m}/ratio_mean"] = update.ratio_B[in_m].mean().item()
            metrics[f"{per_m}/{'clip_frac' if a == batch.learner else 'in_range_frac'}"] = (
                clipped_m if a == batch.learner else 1.0 - clipped_m
            )
    return metrics
