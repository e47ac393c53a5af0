"""Token log-probs without the full-vocabulary logits: the LM head and log-softmax run in chunks of tokens.

A causal LM's logits are ``tokens x vocabulary`` (152k columns for Qwen3); computing log-probs from the whole
tensor in fp32 costs several copies of it (the upcast, the division by the temperature, the exp inside
``logsumexp`` and their gradients). Here only the response positions are kept, and their final hidden states
go through the LM head `chunk_tokens` rows at a time: each chunk's logits are upcast to fp32, the target's
logit is gathered and a ``logsumexp`` subtracted, and with gradient each chunk is a non-reentrant checkpoint,
so its logits are recomputed in the backward pass instead of being kept. At most one chunk of logits exists
at a time.

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

__all__ = ["LOGITS_CHUNK_BYTES", "chunk_tokens", "head_parts", "logits_logprobs", "selective_logprobs"]

LOGITS_CHUNK_BYTES = 64 << 20
"""fp32 logits per chunk (64 MiB: 110 tokens of Qwen3's 152k vocabulary, 341 of SmolLM2's 49k)."""

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


def _chunk_logp(
    hidden_C_H: torch.Tensor,
    targets_C: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    temperature: float,
    softcap: float | None,
) -> torch.Tensor:
    """log softmax(head(h) / T)[target] for one chunk, in fp32."""
    logits_C_V = head(hidden_C_H).float()
    if softcap:
        logits_C_V = torch.tanh(logits_C_V / softcap) * softcap
    logits_C_V = logits_C_V / temperature
    picked_C = logits_C_V.gather(-1, targets_C[:, None]).squeeze(-1)
    return picked_C - torch.logsumexp(logits_C_V, dim=-1)


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
        ``logp_N`` in fp32. With gradient enabled each chunk is a non-reentrant checkpoint: its logits are
        recomputed in the backward pass, so at most one chunk of logits is alive at a time.
    """
    temperature = temperature or 1.0
    if chunk is None:
        vocab = getattr(head, "out_features", None) or head(hidden_N_H[:1]).shape[-1]
        chunk = chunk_tokens(vocab)
    parts = []
    for start in range(0, hidden_N_H.shape[0], chunk):
        args = (
            hidden_N_H[start : start + chunk],
            targets_N[start : start + chunk],
            head,
            temperature,
            softcap,
        )
        if torch.is_grad_enabled():
            parts.append(checkpoint(_chunk_logp, *args, use_reentrant=False))
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
