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
in its packed slot. Rows run in length buckets (`length_buckets`): rows of similar length together, each
bucket padded only to its own longest row, so the attention of a short row does not pay for the longest one.
Attention never crosses rows, and a row attends to exactly what it attends to padded. Gradients flow through
the gathers: a shared prompt collects the gradient of every row that reads it, which is the sum the padded
layout computes over its copies.

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
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from workbench.agents.forward.logprobs import head_parts
from workbench.agents.forward.tokens import TokenBatch

__all__ = [
    "BUCKET_COST_SLOTS",
    "PACKABLE",
    "PACKED_ATTENTION",
    "PackedAttention",
    "PackedRows",
    "length_buckets",
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


BUCKET_COST_SLOTS = 256
"""What one more attention bucket costs, in padded row positions (`length_buckets`): the fixed cost of one
more SDPA call and its gathers, forward and backward, measured on the quickstart's agents on CPU (≈ 0.6 ms
against ≈ 3 µs per padded position)."""


@dataclass(frozen=True)
class PackedAttention:
    """Where each row's tokens sit in the packed sequence (what `packed_attention_forward` reads).

    Rows run attention in length buckets (`length_buckets`): rows of similar length together, each bucket
    padded only to its own longest row.

    Attributes:
        gathers: Per bucket, ``(B_k, T_k)``: the packed index of token t of the bucket's row b (its prompt's
            shared copy for prompt tokens); past the row's end, index 0 (right padding: causal attention
            never lets a real token see it).
        source_N: For each packed token, the slot of one row position holding it in the buckets' outputs
            laid end to end (bucket k's ``B_k * T_k`` positions, row-major, after every earlier bucket's):
            the attention output it takes (a shared prompt takes its first row's).
    """

    gathers: tuple[torch.Tensor, ...]
    source_N: torch.Tensor

    def to(self, device: torch.device | str) -> PackedAttention:
        return PackedAttention(tuple(g.to(device) for g in self.gathers), self.source_N.to(device))


@dataclass(frozen=True)
class PackedRows:
    """A micro-batch's rows as one sequence of N tokens (`pack_rows`).

    Attributes:
        input_ids_1_N: The packed tokens: each distinct prompt once, then each row's response, in row order.
        position_ids_1_N: Each token's position in its own row (what the padded layout gives it).
        attention: The row layout for `packed_attention_forward`.
        gather_B_T: Packed index of token t of row b, rows in batch order (0 past the row's end).
        predictor_S: For each scored token, in the row-major order of ``response_mask_B_T[:, 1:]``, the packed
            index of the hidden state that predicts it (the last prompt token predicts a row's first response
            token).
        targets_S: The scored tokens.
    """

    input_ids_1_N: torch.Tensor
    position_ids_1_N: torch.Tensor
    attention: PackedAttention
    gather_B_T: torch.Tensor
    predictor_S: torch.Tensor
    targets_S: torch.Tensor


def _prompt_lengths(batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's real length and prompt length (its tokens before the response: prompt, then response), on
    CPU."""
    length_B = batch.attention_mask_B_T.sum(dim=-1).cpu()
    return length_B, length_B - batch.response_mask_B_T.sum(dim=-1).cpu()


def _distinct_prompts(ids_B_T: torch.Tensor, prompt_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(distinct_U_P, owner_B)``: each distinct prompt as ``[length, tokens..., -1 padding]`` and the index
    of row b's prompt among them (rows with identical prompt tokens share one)."""
    P = int(prompt_B.max()) if len(prompt_B) else 0
    in_prompt_B_P = torch.arange(P)[None, :] < prompt_B[:, None]
    keys_B_P = torch.cat([prompt_B[:, None], ids_B_T[:, :P].masked_fill(~in_prompt_B_P, -1)], dim=1)
    distinct_U_P, owner_B = torch.unique(keys_B_P, dim=0, return_inverse=True)
    return distinct_U_P, owner_B


def packed_tokens(batch: TokenBatch) -> int:
    """N of `pack_rows` of ``batch``: its distinct prompts' tokens plus every row's response tokens."""
    length_B, prompt_B = _prompt_lengths(batch)
    if not len(length_B):
        return 0
    distinct_U_P, _ = _distinct_prompts(batch.input_ids_B_T.cpu(), prompt_B)
    return int(distinct_U_P[:, 0].sum() + (length_B - prompt_B).sum())


def length_buckets(length_B: list[int], cost: int | None = None) -> list[list[int]]:
    """Rows grouped for attention: sorted by length, cut where that saves more padded positions than one
    more bucket costs (``cost`` positions, default `BUCKET_COST_SLOTS`); the cheapest such grouping (dynamic
    programming over the distinct lengths). Each bucket lists its rows, shortest first.

    >>> length_buckets([3, 40, 4, 41], cost=10)
    [[0, 2], [1, 3]]
    >>> length_buckets([3, 40, 4, 41], cost=1000)
    [[0, 2, 1, 3]]
    """
    cost = BUCKET_COST_SLOTS if cost is None else cost
    order = sorted(range(len(length_B)), key=lambda b: length_B[b])
    lengths = sorted(set(length_B))
    if len(lengths) <= 1:
        return [order] if order else []
    counts = [0] * len(lengths)
    for n in length_B:
        counts[lengths.index(n)] += 1  # few distinct lengths: a scan is cheap
    rows_before = [0, *itertools.accumulate(counts)]
    # best[j]: the cheapest grouping of the rows of the j shortest lengths; cut[j]: its last bucket's start
    best, cut = [0] * (len(lengths) + 1), [0] * (len(lengths) + 1)
    for j in range(1, len(lengths) + 1):
        width = lengths[j - 1]
        best[j], cut[j] = min(
            (best[i] + (rows_before[j] - rows_before[i]) * width + cost, i) for i in range(j)
        )
    bounds, j = [], len(lengths)
    while j > 0:
        bounds.append(rows_before[j])
        j = cut[j]
    starts = [0, *reversed(bounds)]
    return [order[a:b] for a, b in itertools.pairwise(starts)]


def pack_rows(batch: TokenBatch) -> PackedRows:
    """``batch``'s rows (right padded, prompt then response) packed into one sequence (module docstring).

    Rows whose prompt tokens are identical share one copy of them. The result is on ``batch``'s device.
    """
    device = batch.input_ids_B_T.device
    ids_B_T = batch.input_ids_B_T.cpu()
    B, T = ids_B_T.shape
    length_B, prompt_B = _prompt_lengths(batch)
    col_1_T = torch.arange(T)[None, :]
    in_prompt_B_T = col_1_T < prompt_B[:, None]
    in_response_B_T = (col_1_T < length_B[:, None]) & ~in_prompt_B_T
    # every distinct prompt once, then every row's response, in row order
    distinct_U_P, owner_B = _distinct_prompts(ids_B_T, prompt_B)
    prompt_len_U = distinct_U_P[:, 0]
    in_distinct_U_P = torch.arange(distinct_U_P.shape[1] - 1)[None, :] < prompt_len_U[:, None]
    prompt_start_U = prompt_len_U.cumsum(0) - prompt_len_U
    response_len_B = length_B - prompt_B
    response_start_B = int(prompt_len_U.sum()) + response_len_B.cumsum(0) - response_len_B
    tokens_N = torch.cat([distinct_U_P[:, 1:][in_distinct_U_P], ids_B_T[in_response_B_T]])
    positions_N = torch.cat(
        [
            torch.arange(in_distinct_U_P.shape[1]).expand_as(in_distinct_U_P)[in_distinct_U_P],
            col_1_T.expand(B, T)[in_response_B_T],
        ]
    )
    gather_B_T = torch.where(
        in_prompt_B_T,
        prompt_start_U[owner_B][:, None] + col_1_T,
        torch.where(in_response_B_T, (response_start_B - prompt_B)[:, None] + col_1_T, 0),
    )
    # the row position each packed token takes its attention output from (a prompt: its first row's)
    first_row_U = torch.full((len(prompt_len_U),), B).scatter_reduce(0, owner_B, torch.arange(B), "amin")
    source_row_N = torch.cat(
        [
            first_row_U[:, None].expand_as(in_distinct_U_P)[in_distinct_U_P],
            torch.arange(B)[:, None].expand(B, T)[in_response_B_T],
        ]
    )
    # attention in length buckets: bucket k's outputs fill B_k * T_k slots after the earlier buckets'
    buckets = length_buckets(length_B.tolist())
    slot_start_B = torch.zeros(B, dtype=torch.long)
    gathers, offset = [], 0
    for rows in buckets:
        width = int(length_B[rows[-1]])
        index_B = torch.tensor(rows, dtype=torch.long)
        gathers.append(gather_B_T[index_B, :width])
        slot_start_B[index_B] = offset + torch.arange(len(rows)) * width
        offset += len(rows) * width
    keep_B_T = batch.response_mask_B_T[:, 1:].bool().cpu()
    return PackedRows(
        input_ids_1_N=tokens_N[None, :].to(device),
        position_ids_1_N=positions_N[None, :].to(device),
        attention=PackedAttention(tuple(gathers), slot_start_B[source_row_N] + positions_N).to(device),
        gather_B_T=gather_B_T.to(device),
        predictor_S=gather_B_T[:, :-1][keep_B_T].to(device),
        targets_S=ids_B_T[:, 1:][keep_B_T].to(device),
    )


def _rows(states_1_H_N_D: torch.Tensor, gather_B_T: torch.Tensor) -> torch.Tensor:
    """``(1, H, N, D)`` packed states -> ``(B, H, T, D)`` per-row states.

    Gathers whole tokens (rows of ``H * D`` contiguous values): the states come from the model as a head-major
    view of token-major memory, so this gather copies nothing first, and its backward pass adds whole rows
    (8-10% of a quickstart agent's forward and backward, against gathering along the head-major view).
    """
    _, H, N, D = states_1_H_N_D.shape
    B, T = gather_B_T.shape
    tokens_N_HD = states_1_H_N_D.transpose(1, 2).reshape(N, H * D)  # a view when the memory is token-major
    rows_BT_HD = tokens_N_HD.index_select(0, gather_B_T.flatten())
    return rows_BT_HD.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)


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
            "workbench.agents.forward.packing.packed_attention"
        )
    kwargs.pop("is_causal", None)
    outputs = []
    for gather_B_T in packing.gathers:  # rows of similar length together (`length_buckets`)
        T = gather_B_T.shape[1]
        mask_T_T = None
        if sliding_window is not None and sliding_window < T:
            mask_T_T = _sliding_causal_mask(T, sliding_window, query.device)
        out_B_T_H_D, _ = sdpa_attention_forward(
            module,
            _rows(query, gather_B_T),
            _rows(key, gather_B_T),
            _rows(value, gather_B_T),
            mask_T_T,
            is_causal=True,
            **kwargs,
        )
        outputs.append(out_B_T_H_D.flatten(0, 1))
    out_slots_H_D = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
    out_N_H_D = out_slots_H_D.index_select(0, packing.source_N)
    return out_N_H_D.unsqueeze(0), None


def _inner(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def supports_packing(model: Any) -> bool:
    """Whether `pack_rows` batches give ``model`` (a peft wrapper is looked through) what padded ones do: a
    `PACKABLE` type without attention soft-capping, whose logits are its head of its backbone's states
    (`workbench.agents.forward.logprobs.head_parts`)."""
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
