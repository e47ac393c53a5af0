"""A speed-up, not the algorithm: shared rows that clipping leaves without gradient skip their backward pass.

Between heterogeneous agents most shared ratios fall outside the clip band [lb_m, 1] (Eqs. 13-14): such a
row's loss term is a constant. A no-grad forward over a micro-batch's shared rows (`ClippedRowProbe.split`)
finds them; the update then forwards and backpropagates only the others, and adds the clipped rows' constant
to the mini-batch's loss, so loss, statistics and gradient are those of training every row. A no-grad forward
costs about `PROBE_BREAK_EVEN` of a forward and backward, so the probe keeps going only while at least that
share of the rows it probes turn out clipped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from workbench.agents.forward.agent import Agent, threads_for_pass
from workbench.agents.forward.passes import token_logprobs
from workbench.core import losses
from workbench.train.batches import LearnerBatch
from workbench.train.scoring import policy_batch

__all__ = ["PROBE_BREAK_EVEN", "ClippedRowProbe"]

PROBE_BREAK_EVEN = 0.35
"""A no-grad forward costs about 0.35 of a forward and backward (the quickstart's agents on CPU): probing
shared rows for clipped ones pays while at least this share of the probed rows turn out clipped."""


@dataclass
class ClippedRowProbe:
    """One learner's probe over its update: what it needs, and the rows probed and found clipped so far."""

    agent: Agent
    batch: LearnerBatch
    loss_fn: losses.PolicyLoss
    params: losses.LossParams
    temperature: float
    probed: int = 0
    clipped: int = 0

    def split(self, rows: list[int], m: int) -> tuple[list[int], list[int], losses.SampleStats | None, float]:
        """The micro-batch ``rows`` of mini-batch ``m`` split into those that need a backward pass and those
        clipping leaves without gradient (none when it no longer pays, or no row is shared).

        Returns:
            ``(to_train, clipped, clipped_stats, clipped_loss)``: the clipped rows' `SampleStats` and the sum
            of their constant loss terms (the micro-batch's loss with every other advantage set to 0).
        """
        shared = [r for r in rows if not self.batch.scored_B[r]]  # old policy: another agent's
        if not shared or not self.pays():
            return rows, [], None, 0.0
        clipped, stats, loss = self._clipped(shared, m)
        self.probed, self.clipped = self.probed + len(shared), self.clipped + len(clipped)
        no_grad = set(clipped)
        return [r for r in rows if r not in no_grad], clipped, stats, loss

    def pays(self) -> bool:
        """Whether probing goes on: first time, or while at least `PROBE_BREAK_EVEN` of the rows probed so far
        turned out clipped."""
        return not self.probed or self.clipped >= PROBE_BREAK_EVEN * self.probed

    @torch.no_grad()
    def _clipped(self, rows: list[int], m: int) -> tuple[list[int], losses.SampleStats | None, float]:
        view = self.batch.tokens.select(rows)
        with threads_for_pass(self.agent, view):
            logp_B_T, mask_B_T = token_logprobs(self.agent, view, temperature=self.temperature)
        inputs = policy_batch(self.batch, rows, view, logp_B_T, mask_B_T, m)
        _, stats = self.loss_fn(inputs, self.params)
        clipped_B = stats.clipped_B == 1
        if not clipped_B.any():
            return [], None, 0.0
        # Every loss term is its row's advantage times a factor: the clipped rows' terms are the loss of the
        # micro-batch with every other advantage set to 0.
        alone = dataclasses.replace(inputs, advantages_B=inputs.advantages_B * clipped_B)
        loss, _ = self.loss_fn(alone, self.params)
        clipped = [r for r, c in zip(rows, clipped_B.tolist()) if c]
        kept = losses.SampleStats(*(getattr(stats, f.name)[clipped_B] for f in dataclasses.fields(stats)))
        return clipped, kept, loss.item() * len(rows)
