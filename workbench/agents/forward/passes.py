"""An agent's forward passes on a `TokenBatch`: token log-probs with gradient, and the KL reference's.

- `token_logprobs` / `sequence_logprobs`: the learner's log-probs with gradient on a `TokenBatch`
  (`workbench.agents.forward.sharing`), one forward pass; the trainer micro-batches with ``TokenBatch.select``
  (`workbench.train.scoring`: the author's old-policy scores, Eq. 11; `workbench.train.update`: the updates).
- `reference_token_logprobs`: the KL reference (LoRA: adapters disabled; full fine-tuning: initial weights).

Alignment: ``logp_B_T[b, t]`` is the log-prob of ``input_ids_B_T[b, t + 1]`` given the tokens up to ``t``;
both returned tensors have ``T - 1`` columns (``mask_B_T = response_mask_B_T[:, 1:]``).

Log-probs are those of ``softmax(logits / temperature)``, the distribution the tokens were sampled from before
top-p (as verl computes them); temperature 0 (greedy) is scored at temperature 1. They are computed on the
response positions only, a chunk of tokens at a time (`workbench.agents.forward.logprobs`), on rows packed
without padding where the model allows it (`workbench.agents.forward.packing`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from workbench.agents.forward.logprobs import head_parts, logits_logprobs, selective_logprobs
from workbench.agents.forward.packing import (
    pack_rows,
    packed_attention,
    packed_attention_active,
    supports_packing,
)
from workbench.agents.forward.tokens import TokenBatch
from workbench.core.losses import masked_mean_logp

if TYPE_CHECKING:
    from workbench.agents.forward.agent import Agent

__all__ = ["reference_token_logprobs", "sequence_logprobs", "token_logprobs"]


@contextlib.contextmanager
def _grad_mode(agent: Agent) -> Iterator[None]:
    """Gradient checkpointing acts only in train mode (dropout was zeroed at load for it); else eval."""
    use_train = agent.spec.gradient_checkpointing and torch.is_grad_enabled()
    if use_train:
        agent.model.train()
    try:
        yield
    finally:
        if use_train:
            agent.model.eval()


def _checkpointing(model: Any) -> bool:
    """Whether a gradient pass of ``model`` recomputes its layers in the backward pass."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return bool(getattr(inner, "is_activation_checkpointing", False)) and model.training


def _token_logprobs_with(
    model: Any, batch: TokenBatch, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the response tokens (`workbench.agents.forward.logprobs`): the LM head and the log-softmax
    run only on response positions, a chunk of tokens at a time, so no full-vocabulary fp32 tensor is built.

    The rows run packed (`workbench.agents.forward.packing`: no padding, each distinct prompt once) when the
    model supports it; a gradient pass with checkpointing only inside the caller's `packed_attention` block
    (its backward pass recomputes the layers), else padded.
    """
    mask_B_T = batch.response_mask_B_T[:, 1:]
    keep_B_T = mask_B_T.bool()
    parts = head_parts(model)
    packable = supports_packing(model)
    if packable and torch.is_grad_enabled() and _checkpointing(model):
        packable = packed_attention_active(model)
    if packable:
        backbone, head, softcap = parts
        packed = pack_rows(batch)
        with packed_attention(model):
            hidden_1_N_H = backbone(
                input_ids=packed.input_ids_1_N,
                position_ids=packed.position_ids_1_N,
                use_cache=False,
                packing=packed.attention,
            ).last_hidden_state
        hidden_S_H = hidden_1_N_H[0].index_select(0, packed.predictor_S)
        logp_N = selective_logprobs(
            hidden_S_H, packed.targets_S, head, temperature=temperature, softcap=softcap
        )
    else:
        logp_N = _padded_logprobs(model, parts, batch, keep_B_T, temperature)
    logp_B_T = torch.zeros(keep_B_T.shape, dtype=logp_N.dtype, device=logp_N.device)
    return logp_B_T.masked_scatter(keep_B_T, logp_N), mask_B_T


def _padded_logprobs(
    model: Any,
    parts: tuple[Any, Any, float | None] | None,
    batch: TokenBatch,
    keep_B_T: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """``logp_N`` of the scored tokens of a right-padded batch, in the row-major order of ``keep_B_T``."""
    ids_B_T = batch.input_ids_B_T
    targets_N = ids_B_T[:, 1:][keep_B_T]
    if parts is not None:
        backbone, head, softcap = parts
        hidden_B_T_H = backbone(
            input_ids=ids_B_T, attention_mask=batch.attention_mask_B_T, use_cache=False
        ).last_hidden_state
        hidden_N_H = hidden_B_T_H[:, :-1][keep_B_T]
        return selective_logprobs(hidden_N_H, targets_N, head, temperature=temperature, softcap=softcap)
    # Only positions from the first response token on are scored: the rest of the prompt needs no head.
    has_response = batch.response_mask_B_T.any(dim=0).nonzero()
    first = int(has_response[0]) if len(has_response) else ids_B_T.shape[1] - 1
    start = max(first - 1, 0)
    keep = ids_B_T.shape[1] - start
    out = model(
        input_ids=ids_B_T, attention_mask=batch.attention_mask_B_T, use_cache=False, logits_to_keep=keep
    )
    logits_N_V = out.logits[:, :-1][keep_B_T[:, start:]]
    return logits_logprobs(logits_N_V, targets_N, temperature=temperature)


def token_logprobs(
    agent: Agent, batch: TokenBatch, *, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The learner's log-probs of each next token, with gradient (eval mode: dropout off).

    Args:
        agent: The learner.
        batch: Right-padded sequences (`workbench.agents.forward.sharing.build_training_batch`), any device.
        temperature: Logits are divided by it (0 is read as 1).

    Returns:
        ``(logp_B_T, mask_B_T)``, both ``(B, T - 1)``: ``logp_B_T[b, t]`` = log π(input_ids[b, t+1] | ≤ t);
        ``mask_B_T`` is 1 on response tokens; prompt and padding columns hold 0.
    """
    batch = batch.to(agent.device)
    with _grad_mode(agent):
        return _token_logprobs_with(agent.model, batch, temperature)


def sequence_logprobs(agent: Agent, batch: TokenBatch, *, temperature: float = 1.0) -> torch.Tensor:
    """Per-sequence mean response log-prob under the learner, with gradient (``mean_logp_B``)."""
    logp_B_T, mask_B_T = token_logprobs(agent, batch, temperature=temperature)
    return masked_mean_logp(logp_B_T, mask_B_T)


@torch.no_grad()
def reference_token_logprobs(
    agent: Agent, batch: TokenBatch, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs under the KL reference policy, aligned like `token_logprobs`, without gradient.

    With LoRA the reference is the same model with its adapters disabled; with full fine-tuning it is the
    model's initial weights, loaded once on first use (`Agent.reference_model`). One forward pass: callers
    micro-batch (`workbench.train.scoring.score_self`).
    """
    batch = batch.to(agent.device)
    context = agent.model.disable_adapter() if agent.is_lora else contextlib.nullcontext()
    model = agent.model if agent.is_lora else agent.reference_model()
    with context:
        return _token_logprobs_with(model, batch, temperature)
