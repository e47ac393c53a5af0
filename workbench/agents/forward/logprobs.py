"""Token log-probs without the full-vocabulary logits: the LM head and log-softmax run in chunks of tokens.

A causal LM's logits are ``tokens x vocabulary`` (152k columns for Qwen3); computing log-probs from the whole
tensor in fp32 costs several copies of it (the upcast, the division by the temperature, the exp inside
``logsumexp`` and their gradients). Here only the response positions are kept, and their final hidden states
go through the LM head `chunk_tokens` rows at a time: each chunk's logits are upcast to fp32, the target's
logit is gathered and a ``logsumexp`` subtracted. With gradient each chunk keeps only its hidden states,
targets and ``logsumexp``: its backward pass (`_HeadLogprob`) recomputes the chunk's logits, writes the
gradient of the log-softmax by hand, ``d logits = g * (onehot(target) - softmax)``, in place in them, and
hands it to the head's own backward. At most one chunk of logits exists at a time, as under a checkpoint, for
about half the time of autograd's ``logsumexp``/``gather`` backward on the tiny agents' vocabularies.

`selective_logprobs` is the math (a pure function of hidden states, the head and the targets);
`head_parts` finds the backbone and the LM head of a transformers model (through a peft wrapper), or None for
architectures whose logits are not simply ``head(hidden)`` (then `logits_logprobs` takes the model's own
logits and only chunks the log-softmax).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from workbench.agents.plan.memory import LOGITS_CHUNK_BYTES

__all__ = ["chunk_tokens", "head_parts", "logits_logprobs", "selective_logprobs"]


PLAIN_HEADS = frozenset(
    {
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "gpt2",
        "gemma",
        "gemma2",
        "gemma3_text",
        "phi3",
        "olmo2",
        "smollm3",
    }
)
"""Model types whose logits are ``head(final hidden state)``, optionally soft-capped
(``final_logit_softcapping``); others (a logit scale or divisor) use their own forward."""


def chunk_tokens(vocab: int, chunk_bytes: int | None = None) -> int:
    """Tokens per chunk: as many fp32 logit rows of ``vocab`` columns as fit in ``chunk_bytes`` (None =
    `LOGITS_CHUNK_BYTES`)."""
    return max(1, (chunk_bytes or LOGITS_CHUNK_BYTES) // (4 * vocab))


def _scaled_logits(
    raw_C_V: torch.Tensor, temperature: float, softcap: float | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(z_C_V, tanh_C_V)``: fp32 logits soft-capped and divided by the temperature; the tanh of the cap is
    returned for the backward pass (None without a cap)."""
    z_C_V, tanh_C_V = raw_C_V.float(), None
    if softcap:
        tanh_C_V = torch.tanh(z_C_V / softcap)
        z_C_V = tanh_C_V * softcap
    if temperature != 1.0:  # dividing by 1 is exact: skip the pass over the logits
        z_C_V = z_C_V / temperature
    return z_C_V, tanh_C_V


def _chunk_logp(
    hidden_C_H: torch.Tensor,
    targets_C: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    temperature: float,
    softcap: float | None,
) -> torch.Tensor:
    """log softmax(head(h) / T)[target] for one chunk, in fp32."""
    z_C_V, _ = _scaled_logits(head(hidden_C_H), temperature, softcap)
    picked_C = z_C_V.gather(-1, targets_C[:, None]).squeeze(-1)
    return picked_C - torch.logsumexp(z_C_V, dim=-1)


class _HeadLogprob(torch.autograd.Function):
    """`_chunk_logp` with a hand-written backward pass; the head's trainable parameters are explicit inputs,
    so their gradients reach ``backward()`` and ``autograd.grad`` callers alike (a tied head's weight sums
    its two gradients as usual)."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden_C_H: torch.Tensor,
        targets_C: torch.Tensor,
        head: Callable[[torch.Tensor], torch.Tensor],
        temperature: float,
        softcap: float | None,
        *params: torch.Tensor,
    ) -> torch.Tensor:
        with torch.no_grad():
            z_C_V, _ = _scaled_logits(head(hidden_C_H), temperature, softcap)
            lse_C = torch.logsumexp(z_C_V, dim=-1)
            logp_C = z_C_V.gather(-1, targets_C[:, None]).squeeze(-1) - lse_C
        ctx.save_for_backward(hidden_C_H, targets_C, lse_C, *params)
        ctx.head, ctx.temperature, ctx.softcap = head, temperature, softcap
        return logp_C

    @staticmethod
    def backward(ctx: Any, grad_C: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden_C_H, targets_C, lse_C, *params = ctx.saved_tensors
        wants_hidden, wants_params = ctx.needs_input_grad[0], ctx.needs_input_grad[5:]
        hidden_C_H = hidden_C_H.detach().requires_grad_(wants_hidden)
        with torch.enable_grad():
            raw_C_V = ctx.head(hidden_C_H)  # the chunk's logits again, now with the head's graph
        with torch.no_grad():
            z_C_V, tanh_C_V = _scaled_logits(raw_C_V.detach(), ctx.temperature, ctx.softcap)
            fresh = z_C_V.data_ptr() != raw_C_V.data_ptr()  # else z aliases the graph's output: no in-place
            z_C_V = z_C_V.sub_(lse_C[:, None]) if fresh else z_C_V - lse_C[:, None]
            # d logp / d z = onehot(target) - softmax(z), times the incoming gradient of each row
            dz_C_V = z_C_V.exp_().mul_(-grad_C[:, None]).scatter_add_(1, targets_C[:, None], grad_C[:, None])
            if ctx.temperature != 1.0:
                dz_C_V.div_(ctx.temperature)
            if tanh_C_V is not None:  # d(c tanh(x / c)) / dx = 1 - tanh^2
                dz_C_V.mul_(1 - tanh_C_V.square_())
        inputs = ([hidden_C_H] if wants_hidden else []) + [p for p, w in zip(params, wants_params) if w]
        grads = iter(torch.autograd.grad(raw_C_V, inputs, dz_C_V.to(raw_C_V.dtype)) if inputs else ())
        d_hidden = next(grads) if wants_hidden else None
        return d_hidden, None, None, None, None, *(next(grads) if w else None for w in wants_params)


def _has_active_dropout(head: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Whether recomputing the head could draw a different dropout mask (then a checkpoint, which replays
    the random state, does the backward pass)."""
    modules = head.modules() if isinstance(head, torch.nn.Module) else ()
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 and m.training for m in modules)


def selective_logprobs(
    hidden_N_H: torch.Tensor,
    targets_N: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    *,
    temperature: float = 1.0,
    softcap: float | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """``logp_N[i] = log softmax(head(hidden_N_H[i]) / temperature)[targets_N[i]]``, chunk by chunk.

    Args:
        hidden_N_H: Final hidden states of the N positions whose next token is scored.
        targets_N: The next token of each position.
        head: The LM head (``nn.Linear``, possibly LoRA-wrapped); vocabulary V = its output width.
        temperature: Logits are divided by it (0 is read as 1).
        softcap: ``tanh(logits / c) * c`` before the temperature (Gemma's ``final_logit_softcapping``).
        chunk: Positions per chunk; None = `chunk_tokens` of V.

    Returns:
        ``logp_N`` in fp32. With gradient enabled each chunk's logits are recomputed in the backward pass
        (`_HeadLogprob`; a checkpoint where the head has active dropout), so at most one chunk of logits is
        alive at a time.
    """
    temperature = temperature or 1.0
    if chunk is None:
        vocab = getattr(head, "out_features", None) or head(hidden_N_H[:1]).shape[-1]
        chunk = chunk_tokens(vocab)
    grad = torch.is_grad_enabled()
    params = [p for p in head.parameters() if p.requires_grad] if isinstance(head, torch.nn.Module) else []
    replay = grad and _has_active_dropout(head)
    parts = []
    for start in range(0, hidden_N_H.shape[0], chunk):
        args = (
            hidden_N_H[start : start + chunk],
            targets_N[start : start + chunk],
            head,
            temperature,
            softcap,
        )
        if replay:
            parts.append(checkpoint(_chunk_logp, *args, use_reentrant=False))
        elif grad:
            parts.append(_HeadLogprob.apply(*args, *params))
        else:
            parts.append(_chunk_logp(*args))
    if not parts:
        return hidden_N_H.new_zeros(0, dtype=torch.float32)
    return torch.cat(parts)


def logits_logprobs(
    logits_N_V: torch.Tensor, targets_N: torch.Tensor, *, temperature: float = 1.0, chunk: int | None = None
) -> torch.Tensor:
    """`selective_logprobs` on logits a model already computed (the head is the identity)."""
    return selective_logprobs(
        logits_N_V,
        targets_N,
        lambda x: x,
        temperature=temperature,
        chunk=chunk or chunk_tokens(logits_N_V.shape[-1]),
    )


def head_parts(model: Any) -> tuple[Any, Any, float | None] | None:
    """``(backbone, lm_head, softcap)`` of a causal LM (a peft wrapper is looked through), or None when its
    logits are more than ``lm_head(backbone(...).last_hidden_state)`` (model type not in `PLAIN_HEADS`)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = inner.config
    if config.model_type not in PLAIN_HEADS:
        return None
    backbone, head = inner.base_model, inner.get_output_embeddings()
    if backbone is inner or head is None:
        return None
    return backbone, head, getattr(config, "final_logit_softcapping", None)
