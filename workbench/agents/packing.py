"""Padding-free forward passes: a micro-batch's rows packed into one sequence, each distinct prompt once.

A learner's micro-batch holds rows of very different lengths (its own responses, other agents' re-encoded
ones up to twice as long) and, per prompt, G or more rows that begin with the same prompt tokens. Padded to
the longest row, a quarter to a third of the positions a forward pass computes are padding, and another third
are copies of a prompt. `pack_rows` lays the rows out as one sequence of N tokens instead: every distinct
prompt once, then every row's response tokens, each token with its position in its own row
(``position_ids``), so embeddings and rotary positions are those of the padded layout. Everything that works
token by token (embeddings, norms, projections, MLPs, the LM head) runs on the N tokens only.

Attention is the one operation that needs the rows: `packed_attention_forward`, registered with transformers'
``AttentionInterface`` as `PACKED_ATTENTION`, gathers each row's queries, keys and values back from the packed
sequence (its prompt's shared copy, then its own response), runs the model's SDPA attention per row exactly as
the padded layout does (causal; a sliding window where the layer has one), and puts each token's output back
in its packed slot. Attention never crosses rows, and a row attends to exactly what it attends to padded.
Gradients flow through the gathers: a shared prompt collects the gradient of every row that reads it, which is
the sum the padded layout computes over its copies.

Packing is exact up to float rounding (the same ops on differently shaped tensors). It applies to causal LMs
whose attention is plain softmax attention given positions (`PACKABLE`: GPT-2's learned positions, Llama's and
Gemma's rotary ones, Gemma-3's sliding-window layers); others (attention logit soft-capping, model types not
listed) keep the padded layout (`supports_packing`).

`packed_attention` switches a model's attention implementation to `PACKED_ATTENTION` for a ``with`` block;
transformers then builds no attention mask at all. The block must hold the backward pass too when gradient
checkpointing recomputes layers in it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from workbench.agents.logprobs import head_parts
from workbench.agents.tokens import TokenBatch

__all__ = [
    "PACKABLE",
    "PACKED_ATTENTION",
    "PackedAttention",
    "PackedRows",
    "pack_rows",
    "packed_attention",
    "packed_attention_active",
    "packed_attention_forward",
    "packed_tokens",
    "supports_packing",
]

PACKED_ATTENTION = "workbench_packed"
"""The attention implementation name `packed_attention` gives a model (registered on first use)."""
PACKABLE = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "gpt2", "gemma", "gemma3_text", "phi3", "olmo2", "smollm3"}
)
"""Model types whose attention is softmax attention over the row's own positions (given by ``position_ids``),
with at most a sliding window: packing computes what the padded layout computes."""


@dataclass(frozen=True)
class PackedAttention:
    """Where each row's tokens sit in the packed sequence (what `packed_attention_forward` reads).

    Attributes:
        gather_B_T: Packed index of token t of row b (its prompt's shared copy for prompt tokens); past the
            row's end, index 0 (right padding: causal attention never lets a real token see it).
        source_N: For each packed token, the flat index ``b * T + t`` of one row position holding it: the
            attention output it takes (a shared prompt takes its first row's).
    """

    gather_B_T: torch.Tensor
    source_N: torch.Tensor

    def to(self, device: torch.device | str) -> PackedAttention:
        return PackedAttention(self.gather_B_T.to(device), self.source_N.to(device))


@dataclass(frozen=True)
class PackedRows:
    """A micro-batch's rows as one sequence of N tokens (`pack_rows`).

    Attributes:
        input_ids_1_N: The packed tokens: each distinct prompt once, then each row's response.
        position_ids_1_N: Each token's position in its own row (what the padded layout gives it).
        attention: The row layout for `packed_attention_forward`.
        predictor_S: For each scored token, in the row-major order of ``response_mask_B_T[:, 1:]``, the packed
            index of the hidden state that predicts it (the last prompt token predicts a row's first response
            token).
        targets_S: The scored tokens.
    """

    input_ids_1_N: torch.Tensor
    position_ids_1_N: torch.Tensor
    attention: PackedAttention
    predictor_S: torch.Tensor
    targets_S: torch.Tensor


def _prompt_lengths(batch: TokenBatch) -> tuple[list[int], list[int]]:
    """Each row's real length and prompt length (its tokens before the response: prompt, then response)."""
    lengths = batch.attention_mask_B_T.sum(dim=-1).tolist()
    responses = batch.response_mask_B_T.sum(dim=-1).tolist()
    return lengths, [n - r for n, r in zip(lengths, responses)]


def packed_tokens(batch: TokenBatch) -> int:
    """N of `pack_rows` of ``batch``: its distinct prompts' tokens plus every row's response tokens."""
    lengths, prompts = _prompt_lengths(batch)
    ids = batch.input_ids_B_T.tolist()
    distinct = {tuple(row[:p]) for row, p in zip(ids, prompts)}
    return sum(map(len, distinct)) + sum(n - p for n, p in zip(lengths, prompts))


def pack_rows(batch: TokenBatch) -> PackedRows:
    """``batch``'s rows (right padded, prompt then response) packed into one sequence (module docstring).

    Rows whose prompt tokens are identical share one copy of them. The result is on ``batch``'s device.
    """
    ids_B_T = batch.input_ids_B_T
    B, T = ids_B_T.shape
    lengths, prompts = _prompt_lengths(batch)
    ids = ids_B_T.tolist()
    tokens: list[int] = []
    positions: list[int] = []
    sources: list[int] = []
    gather_B_T = torch.zeros((B, T), dtype=torch.long)
    starts: dict[tuple[int, ...], int] = {}  # distinct prompt -> packed index of its first token
    for b, (row, n, p) in enumerate(zip(ids, lengths, prompts)):
        key = tuple(row[:p])
        if key not in starts:
            starts[key] = len(tokens)
            tokens += row[:p]
            positions += range(p)
            sources += range(b * T, b * T + p)
        response_start = len(tokens)
        tokens += row[p:n]
        positions += range(p, n)
        sources += range(b * T + p, b * T + n)
        gather_B_T[b, :p] = torch.arange(starts[key], starts[key] + p)
        gather_B_T[b, p:n] = torch.arange(response_start, response_start + n - p)
    keep_B_T = batch.response_mask_B_T[:, 1:].bool().cpu()
    device = ids_B_T.device
    return PackedRows(
        input_ids_1_N=torch.tensor([tokens], dtype=torch.long, device=device),
        position_ids_1_N=torch.tensor([positions], dtype=torch.long, device=device),
        attention=PackedAttention(gather_B_T, torch.tensor(sources, dtype=torch.long)).to(device),
        predictor_S=gather_B_T[:, :-1][keep_B_T].to(device),
        targets_S=ids_B_T[:, 1:][keep_B_T.to(device)],
    )


def _rows(states_1_H_N_D: torch.Tensor, gather_B_T: torch.Tensor) -> torch.Tensor:
    """``(1, H, N, D)`` packed states -> ``(B, H, T, D)`` per-row states."""
    _, H, _, D = states_1_H_N_D.shape
    B, T = gather_B_T.shape
    rows_H_BT_D = states_1_H_N_D[0].index_select(1, gather_B_T.flatten())
    return rows_H_BT_D.view(H, B, T, D).transpose(0, 1)  # (B, H, T, D)


def _sliding_causal_mask(T: int, window: int, device: torch.device) -> torch.Tensor:
    """``(T, T)`` True where query q may see key k: k <= q and q - k < window (transformers' convention)."""
    q_T1 = torch.arange(T, device=device)[:, None]
    k_1T = torch.arange(T, device=device)[None, :]
    return (k_1T <= q_T1) & (q_T1 - k_1T < window)


def packed_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    packing: PackedAttention | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of a packed sequence, row by row (an ``AttentionInterface`` function).

    Args:
        module: The attention module (its key/value groups and causality, as SDPA reads them).
        query: ``(1, H, N, D)`` packed queries, positions already applied; ``key`` and ``value`` likewise
            (``H_kv`` heads).
        attention_mask: Ignored (None: transformers builds no mask for this implementation).
        packing: The row layout (`PackedRows.attention`), passed through the model's forward kwargs.
        sliding_window: The layer's window (Gemma-3's local layers), None for global attention.
        **kwargs: ``dropout``, ``scaling`` and the rest, passed to transformers' SDPA attention.

    Returns:
        ``((1, N, H, D) output, None)``.

    Raises:
        RuntimeError: No ``packing`` (a padded batch must not run under this implementation).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if packing is None:
        raise RuntimeError(
            f"{PACKED_ATTENTION} attention was called without a packed layout: run padded batches outside "
            "workbench.agents.packing.packed_attention"
        )
    B, T = packing.gather_B_T.shape
    mask_T_T = None
    if sliding_window is not None and sliding_window < T:
        mask_T_T = _sliding_causal_mask(T, sliding_window, query.device)
    kwargs.pop("is_causal", None)
    out_B_T_H_D, _ = sdpa_attention_forward(
        module,
        _rows(query, packing.gather_B_T),
        _rows(key, packing.gather_B_T),
        _rows(value, packing.gather_B_T),
        mask_T_T,
        is_causal=True,
        **kwargs,
    )
    H, D = out_B_T_H_D.shape[2:]
    out_N_H_D = out_B_T_H_D.reshape(B * T, H, D).index_select(0, packing.source_N)
    return out_N_H_D.unsqueeze(0), None


def _inner(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def supports_packing(model: Any) -> bool:
    """Whether `pack_rows` batches give ``model`` (a peft wrapper is looked through) what padded ones do: a
    `PACKABLE` type without attention soft-capping, whose logits are its head of its backbone's states
    (`workbench.agents.logprobs.head_parts`)."""
    config = _inner(model).config
    return (
        head_parts(model) is not None
        and config.model_type in PACKABLE
        and getattr(config, "attn_logit_softcapping", None) is None
        and config._attn_implementation in ("sdpa", "eager", PACKED_ATTENTION)
    )


def packed_attention_active(model: Any) -> bool:
    """Whether ``model`` runs under `packed_attention` now."""
    return _inner(model).config._attn_implementation == PACKED_ATTENTION


def _register() -> None:
    from transformers import AttentionInterface

    if PACKED_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(PACKED_ATTENTION, packed_attention_forward)


@contextlib.contextmanager
def packed_attention(model: Any) -> Iterator[None]:
    """``model``'s attention is `packed_attention_forward` inside the block (nested blocks are no-ops).

    Every forward pass inside must get a packed layout (``packing=``); the block must also hold the backward
    pass of a model with gradient checkpointing (its layers run their forward again there).
    """
    config = _inner(model).config
    if config._attn_implementation == PACKED_ATTENTION:
        yield
        return
    _register()
    configs = [config, *(getattr(config, key) for key in config.sub_configs if getattr(config, key, None))]
    previous = [c._attn_implementation_internal for c in configs]
    config._attn_implementation = PACKED_ATTENTION
    try:
        yield
    finally:
        for c, value in zip(configs, previous):
            c._attn_implementation_internal = value
