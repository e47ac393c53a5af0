"""Preallocated KV caches for `workbench.agents.generation.rollout.generate`: growing (`preallocate`) and
static (`make_static`).

transformers' ``DynamicLayer`` grows its keys and values with ``torch.cat`` at every decoded token, so a
response of N tokens copies the whole cache N times (O(N²) memory traffic). `preallocate` moves each
full-attention layer of a prefilled cache into a buffer sized for the whole rollout (prompt + response cap): a
new token is one slice write, and the attention reads a view of the filled part. Dropping finished rows
compacts the buffer in place.

Layers of any other kind (sliding-window, linear attention) keep their own class; only their rows are
selected. transformers is imported lazily, on the first call, like everywhere else in this layer.

`make_static` gives the compiled decode (``train.compile_decode``) fixed shapes instead: transformers'
``StaticLayer`` (rows x heads x capacity x head dim, written in place at a position held in a tensor), so one
decode step is the same graph every time; rows are never dropped and the attention reads the whole capacity,
masked.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


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
