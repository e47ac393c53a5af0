"""Sampling internals of `workbench.agents.generation.rollout.generate`: the prefill, the token draw, the
sliced LM head.

- `prefill`: runs each distinct prompt once (its n samples share it) and the prefix all prompts share (a chat
  template's system turn) once, then expands the KV cache (`preallocate`, below) to one row
  per sample.
- `pick_B`: draws one token per row by inverse CDF, one uniform per row and step (same seed, same samples).
- `chunked_head`: computes a plain LM head in slices of `HEAD_CHUNK` columns while decoding (same logits).
- `preallocate` and `make_static`: the KV caches the decode loops (`workbench.agents.generation.decode`) run
  over.

transformers' ``DynamicLayer`` grows its keys and values with ``torch.cat`` at every decoded token, so a
response of N tokens copies the whole cache N times (O(N²) memory traffic). `preallocate` moves each
full-attention layer of a prefilled cache into a buffer sized for the whole rollout (prompt + response cap): a
new token is one slice write, and the attention reads a view of the filled part. Dropping finished rows
compacts the buffer in place. Layers of any other kind (sliding-window, linear attention) keep their own
class; only their rows are selected. transformers is imported lazily, on the first call, like everywhere else
in this layer.

`make_static` gives the compiled decode (``train.compile_decode``) fixed shapes instead: transformers'
``StaticLayer`` (rows x heads x capacity x head dim, written in place at a position held in a tensor), so one
decode step is the same graph every time; rows are never dropped and the attention reads the whole capacity,
masked.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from workbench.agents.forward.agent import Agent


HEAD_CHUNK = 4096
"""Vocabulary columns per matmul of the LM head while decoding (see `chunked_head`)."""
STATIC_CAPACITY_STEP = 64
"""A static cache's capacity is a multiple of this many tokens (each distinct shape compiles once)."""


def pick_B(
    logits_B_V: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    *,
    top_k: int = 0,
    min_p: float = 0.0,
) -> torch.Tensor:
    """Samples one token per row: greedy at temperature 0, else softmax(logits / T) with top-k, min-p and
    nucleus top-p, in that order (transformers' order of its warpers; each 0 / 1 = off).

    Inverse-CDF sampling: one uniform draw per row against the cumulative probabilities (in float64, so that
    even the 1e-8 tails keep their mass). ``torch.multinomial`` drew the same distribution ~30x slower on a
    49k vocabulary. Top-k keeps the k likeliest tokens (ties with the k-th included), min-p the tokens at
    least ``min_p`` times as likely as the likeliest; both renormalize what they keep.
    """
    if temperature == 0:
        return logits_B_V.argmax(dim=-1)
    scaled_B_V = logits_B_V.float() / temperature
    if top_k > 0 or min_p > 0:
        scaled_B_V = _top_k_min_p(scaled_B_V, top_k, min_p)
    probs_B_V = torch.softmax(scaled_B_V, dim=-1)
    order_B_V = None
    if top_p < 1.0:
        probs_B_V, order_B_V = probs_B_V.sort(dim=-1, descending=True)
    cdf_B_V = probs_B_V.cumsum(dim=-1, dtype=torch.float64)
    if top_p < 1.0:
        # keep a token while the tokens ranked above it hold less than top_p (the first always stays)
        kept_B = ((cdf_B_V - probs_B_V) <= top_p).sum(dim=-1, keepdim=True)
    else:
        kept_B = torch.full_like(cdf_B_V[:, :1], cdf_B_V.shape[1], dtype=torch.long)
    total_B = cdf_B_V.gather(-1, kept_B - 1)  # mass of the kept tokens
    u_B = torch.rand(total_B.shape, generator=generator, dtype=torch.float64, device=total_B.device) * total_B
    index_B = torch.minimum(torch.searchsorted(cdf_B_V, u_B, right=True), kept_B - 1)
    zero_B = probs_B_V.gather(-1, index_B).squeeze(-1) == 0  # u rounded onto the total: never a zero token
    if zero_B.any():
        masked_B_V = probs_B_V[zero_B].masked_fill(
            torch.arange(cdf_B_V.shape[1], device=cdf_B_V.device) >= kept_B[zero_B], 0.0
        )
        index_B[zero_B] = torch.multinomial(masked_B_V, 1, generator=generator)
    index_B = index_B.squeeze(-1)
    return index_B if order_B_V is None else order_B_V.gather(-1, index_B[:, None]).squeeze(-1)


def _top_k_min_p(scaled_B_V: torch.Tensor, top_k: int, min_p: float) -> torch.Tensor:
    """The tempered logits with every token top-k or min-p drops set to -inf."""
    if 0 < top_k < scaled_B_V.shape[-1]:
        kth_B = scaled_B_V.topk(top_k, dim=-1).values[:, -1:]
        scaled_B_V = scaled_B_V.masked_fill(scaled_B_V < kth_B, float("-inf"))
    if min_p > 0:
        probs_B_V = torch.softmax(scaled_B_V, dim=-1)
        floor_B = min_p * probs_B_V.amax(dim=-1, keepdim=True)
        scaled_B_V = scaled_B_V.masked_fill(probs_B_V < floor_B, float("-inf"))
    return scaled_B_V


def left_pad(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pads token rows to one width; returns ``(ids_B_T, mask_B_T)`` (mask 1 on real tokens)."""
    width = max(len(r) for r in rows)
    ids_B_T = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask_B_T = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids_B_T[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask_B_T[i, width - len(row) :] = 1
    return ids_B_T.to(device), mask_B_T.to(device)


def shared_prefix(prompts: list[list[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least one token of its own (it gives the logits)."""
    shortest = min(len(p) for p in prompts)
    for t in range(shortest - 1):
        if any(p[t] != prompts[0][t] for p in prompts):
            return t
    return max(shortest - 1, 0)


@contextlib.contextmanager
def chunked_head(model: Any) -> Iterator[None]:
    """Computes a plain ``nn.Linear`` LM head in slices of `HEAD_CHUNK` output columns while decoding.

    The same dot products (each logit is one row of the weight times the hidden state), so the logits are
    unchanged; but at decode shapes (64 rows x 576 -> 49,152) one MKL sgemm ran at about 2/3 of the speed of
    the model's other matmuls, and slices of 4,096 columns cut SmolLM2's decode CPU time by ~5%. A LoRA- or
    bitsandbytes-wrapped head, or a small vocabulary, is left alone.
    """
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.out_features <= HEAD_CHUNK:
        yield
        return

    def forward(x_B_D: torch.Tensor) -> torch.Tensor:
        weights = head.weight.split(HEAD_CHUNK)
        biases = head.bias.split(HEAD_CHUNK) if head.bias is not None else [None] * len(weights)
        return torch.cat([torch.nn.functional.linear(x_B_D, w, b) for w, b in zip(weights, biases)], dim=-1)

    head.forward = forward  # an instance attribute: shadows the class's forward until deleted
    try:
        yield
    finally:
        del head.forward


@dataclass
class Prefilled:
    """The state `prefill` leaves for the decode loop, one row per sample (R rows)."""

    cache: Any
    logits_R_V: torch.Tensor
    attn_R_C: torch.Tensor
    """Attention mask buffer of the whole rollout (C = capacity); the first ``length`` columns are filled."""
    pos_R: torch.Tensor
    """Position of each row's last token."""
    length: int
    static: bool = False
    """The cache is a `make_static` one (else growing, `preallocate`)."""


@torch.no_grad()
def prefill(
    agent: Agent, prompts: list[list[int]], max_new_tokens: int, *, static: bool = False
) -> Prefilled:
    """Runs every distinct prompt once and expands the cache to one row per sample.

    Layout of a cache row: ``[shared prefix][left padding][rest of the prompt]``. The prefix all prompts share
    (a chat template's system turn) is computed once, on one row; the rows' own tokens follow it with their
    positions continuing from it, and the padding between is masked. The G samples of one prompt share its
    forward pass (``rows_R`` maps each sample to its distinct prompt).

    With ``static`` the capacity is rounded up to a multiple of `STATIC_CAPACITY_STEP` (fewer distinct shapes
    to compile) and the cache becomes `make_static` buffers when every layer allows it, else the growing
    cache (``Prefilled.static`` says which).
    """
    model, device = agent.model, agent.device
    distinct: dict[tuple[int, ...], int] = {}
    rows_R = torch.tensor([distinct.setdefault(tuple(p), len(distinct)) for p in prompts], device=device)
    unique = [list(p) for p in distinct]
    shared = shared_prefix(unique) if len(unique) > 1 else 0
    cache = None
    if shared:
        prefix_1_P = torch.tensor([unique[0][:shared]], device=device)
        positions_1_P = torch.arange(shared, device=device)[None]
        out = model(input_ids=prefix_1_P, position_ids=positions_1_P, use_cache=True, logits_to_keep=1)
        cache = out.cache
        cache.batch_repeat_interleave(len(unique))
    ids_U_S, own_U_S = left_pad([p[shared:] for p in unique], agent.pad_token_id, device)
    pos_U_S = shared + (own_U_S.cumsum(-1) - 1).clamp_min(0)
    attn_U_T = torch.cat([own_U_S.new_ones((len(unique), shared)), own_U_S], dim=-1)
    out = model(
        input_ids=ids_U_S,
        attention_mask=attn_U_T,
        position_ids=pos_U_S,
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    length = attn_U_T.shape[1]
    capacity = length + max_new_tokens
    if static:
        capacity = -(-capacity // STATIC_CAPACITY_STEP) * STATIC_CAPACITY_STEP
    attn_R_C = attn_U_T.new_zeros((len(prompts), capacity))
    attn_R_C[:, :length] = attn_U_T[rows_R]
    cache = make_static(out.cache, rows_R, capacity) if static else None
    return Prefilled(
        cache=cache if cache is not None else preallocate(out.cache, rows_R, capacity),
        logits_R_V=out.logits[:, -1][rows_R],
        attn_R_C=attn_R_C,
        pos_R=pos_U_S[:, -1][rows_R],
        length=length,
        static=cache is not None,
    )


# The KV caches: growing (`preallocate`) and static (`make_static`).


@functools.cache
def _layer_class() -> type:
    """The preallocated layer, a ``DynamicLayer`` subclass (defined on first use: transformers is heavy)."""
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """Keys and values in fixed ``(rows, heads, capacity, head_dim)`` buffers; ``keys`` views the filled
        part."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows_R: torch.Tensor, capacity: int):
            super().__init__()
            self.device = keys.device
            self.capacity = capacity
            self._k = keys.new_empty((len(rows_R), keys.shape[1], capacity, keys.shape[3]))
            self._v = values.new_empty((len(rows_R), values.shape[1], capacity, values.shape[3]))
            self.length = keys.shape[2]
            self.rows = len(rows_R)
            self._k[:, :, : self.length] = keys.index_select(0, rows_R)
            self._v[:, :, : self.length] = values.index_select(0, rows_R)
            self.is_initialized = True
            self._refresh()

        def _refresh(self) -> None:
            self.keys = self._k[: self.rows, :, : self.length]
            self.values = self._v[: self.rows, :, : self.length]

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            new = key_states.shape[-2]
            if self.length + new > self.capacity:
                raise RuntimeError(f"KV cache of {self.capacity} tokens is full ({self.length} + {new})")
            self._k[: self.rows, :, self.length : self.length + new] = key_states
            self._v[: self.rows, :, self.length : self.length + new] = value_states
            self.length += new
            self._refresh()
            return self.keys, self.values

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            """Keeps rows ``indices`` (ascending, as `generate` drops finished rows), moved to the front."""
            keys, values = self.keys.index_select(0, indices), self.values.index_select(0, indices)
            self.rows = len(indices)
            self._k[: self.rows, :, : self.length] = keys
            self._v[: self.rows, :, : self.length] = values
            self._refresh()

        def reorder_cache(self, beam_idx: torch.Tensor) -> None:
            self.batch_select_indices(beam_idx)

        def batch_repeat_interleave(self, repeats: int) -> None:
            raise NotImplementedError("a preallocated cache holds a fixed number of rows")

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0:
                raise ValueError("crop takes a negative number of tokens to remove")
            self.length = max(0, self.length + tokens_to_remove)
            self._refresh()

        def reset(self) -> None:
            self.length = 0
            self._refresh()

    return PreallocatedLayer


def preallocate(cache: Any, rows_R: torch.Tensor, capacity: int) -> Any:
    """Expands a prefilled cache to rows ``rows_R`` and preallocates its full-attention layers, in place.

    Args:
        cache: A transformers ``Cache`` after the prefill (U rows).
        rows_R: For each row of the result, the prefilled row it starts from (repeats allowed: the G samples
            of one prompt share its prefill).
        capacity: Tokens each preallocated layer holds (prefilled length + response cap).

    Returns:
        The same cache object, with R rows.
    """
    from transformers.cache_utils import DynamicLayer

    layer_class = _layer_class()
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.numel():
            cache.layers[i] = layer_class(layer.keys, layer.values, rows_R, capacity)
        else:
            layer.batch_select_indices(rows_R)
    return cache


def make_static(cache: Any, rows_R: torch.Tensor, capacity: int) -> Any | None:
    """Moves a prefilled cache into transformers ``StaticLayer`` buffers of ``rows_R`` rows and ``capacity``
    tokens, in place; None (cache untouched) when a layer is not a plain full-attention layer.

    Args:
        cache: A transformers ``Cache`` after the prefill (U rows).
        rows_R: For each row of the result, the prefilled row it starts from.
        capacity: Tokens each layer holds (at least the prefilled length + the response cap).
    """
    from transformers.cache_utils import DynamicLayer, StaticLayer

    if not all(type(layer) is DynamicLayer and layer.is_initialized for layer in cache.layers):
        return None
    for i, layer in enumerate(cache.layers):
        keys, values = layer.keys.index_select(0, rows_R), layer.values.index_select(0, rows_R)
        static = StaticLayer(max_cache_len=capacity)
        static.lazy_initialization(keys, values)  # allocates and marks the buffers' addresses as static
        static.keys[:, :, : keys.shape[2]] = keys
        static.values[:, :, : values.shape[2]] = values
        static.cumulative_length.fill_(keys.shape[2])
        cache.layers[i] = static
    return cache
