"""The decode loops of `workbench.agents.rollout.generate`: one forward per new token after the prefill.

- `_decode` (default): over the growing preallocated cache (`workbench.agents.kvcache.preallocate`); rows that
  finish leave the batch and the cache at once, so a batch costs what its live rows cost.
- `_decode_static` (``train.compile_decode``): the decode step under ``torch.compile`` over a static cache
  (`workbench.agents.kvcache.make_static`), CUDA graphs on GPU; every row stays until all have finished, so
  each step has the same shapes and replays one graph instead of launching thousands of small kernels.

Both draw tokens with `workbench.agents.sampling.pick_B` for the live rows, in the same order: equal logits
give equal samples.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

import torch

from workbench.agents.sampling import Prefilled, chunked_head, pick_B, prefill
from workbench.agents.threads import threads_for

if TYPE_CHECKING:
    from workbench.agents.agent import Agent

__all__ = ["sample_rows"]

logger = logging.getLogger(__name__)

_WARNED: set[str] = set()
"""Agents already warned that their layers cannot decode over a static cache."""


@torch.no_grad()
def _decode(
    agent: Agent,
    state: Prefilled,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    generator: torch.Generator | None,
) -> list[tuple[list[int], bool]]:
    """One forward per new token over the cache; finished rows leave the batch (and the cache) at once."""
    model, device = agent.model, agent.device
    cache, logits_B_V, attn_B_C, pos_B, length = (
        state.cache,
        state.logits_R_V,
        state.attn_R_C,
        state.pos_R,
        state.length,
    )
    R = len(pos_B)
    stop_S = torch.tensor(agent.stop_token_ids, device=device)
    tokens_R_N = torch.full((R, max_new_tokens), -1, dtype=torch.long, device=device)  # -1: not sampled
    finished_R = torch.zeros(R, dtype=torch.bool, device=device)
    live_B = torch.arange(R, device=device)  # original row of each live batch row
    for step in range(max_new_tokens):
        token_B = pick_B(logits_B_V, temperature, top_p, generator)
        tokens_R_N[live_B, step] = token_B
        done_B = torch.isin(token_B, stop_S)
        if done_B.any():
            finished_R[live_B[done_B]] = True
            keep_B = (~done_B).nonzero().squeeze(-1)
            if keep_B.numel() == 0:
                break
            # drop finished rows from the batch and the cache: later steps cost only the live rows
            cache.batch_select_indices(keep_B)
            live_B, token_B, attn_B_C, pos_B = (
                live_B[keep_B],
                token_B[keep_B],
                attn_B_C[keep_B],
                pos_B[keep_B],
            )
        if step == max_new_tokens - 1:
            break
        attn_B_C[:, length] = 1
        length += 1
        pos_B = pos_B + 1
        out = model(
            input_ids=token_B[:, None],
            attention_mask=attn_B_C[:, :length],
            position_ids=pos_B[:, None],
            cache=cache,
            use_cache=True,
        )
        cache, logits_B_V = out.cache, out.logits[:, -1]
    lengths_R = (tokens_R_N >= 0).sum(dim=-1).tolist()
    return [(row[:n], done) for row, n, done in zip(tokens_R_N.tolist(), lengths_R, finished_R.tolist())]


_COMPILED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
"""One compiled decode step per model object (`_compiled_step`)."""


def _compiled_step(model: Any, device_type: str) -> Any:
    """``step(token_R_1, attn_R_C, pos_R_1, cache) -> logits_R_V`` under ``torch.compile``, built once per
    model: CUDA graphs on GPU (mode ``reduce-overhead``), inductor's default on CPU."""
    if model not in _COMPILED:

        def step(token_R_1: torch.Tensor, attn_R_C: torch.Tensor, pos_R_1: torch.Tensor, cache: Any) -> Any:
            out = model(input_ids=token_R_1, attention_mask=attn_R_C, position_ids=pos_R_1, cache=cache)
            return out.logits[:, -1]

        mode = "reduce-overhead" if device_type == "cuda" else None
        _COMPILED[model] = torch.compile(step, mode=mode, dynamic=False)
    return _COMPILED[model]


@torch.no_grad()
def _decode_static(
    agent: Agent,
    state: Prefilled,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    generator: torch.Generator | None,
) -> list[tuple[list[int], bool]]:
    """The decode loop over a static cache: every row stays in the batch (finished rows are fed padding and
    their outputs ignored) so each step has the same shapes; tokens are drawn for the live rows only, in the
    order `_decode` draws them, so the same logits give the same samples."""
    step_fn = _compiled_step(agent.model, agent.device.type)
    device, logits_R_V, attn_R_C, pos_R = agent.device, state.logits_R_V, state.attn_R_C, state.pos_R
    R, length = len(pos_R), state.length
    stop_S = torch.tensor(agent.stop_token_ids, device=device)
    tokens_R_N = torch.full((R, max_new_tokens), -1, dtype=torch.long, device=device)
    finished_R = torch.zeros(R, dtype=torch.bool, device=device)
    token_R = torch.full((R,), agent.pad_token_id, dtype=torch.long, device=device)
    for step in range(max_new_tokens):
        live_B = (~finished_R).nonzero().squeeze(-1)
        token_B = pick_B(logits_R_V[live_B], temperature, top_p, generator)
        tokens_R_N[live_B, step] = token_B
        token_R = token_R.fill_(agent.pad_token_id).index_copy_(0, live_B, token_B)
        finished_R[live_B[torch.isin(token_B, stop_S)]] = True
        if bool(finished_R.all()) or step == max_new_tokens - 1:
            break
        attn_R_C[:, length] = 1
        length += 1
        pos_R = pos_R + 1
        logits_R_V = step_fn(token_R[:, None], attn_R_C, pos_R[:, None], state.cache).clone()
    lengths_R = (tokens_R_N >= 0).sum(dim=-1).tolist()
    return [(row[:n], done) for row, n, done in zip(tokens_R_N.tolist(), lengths_R, finished_R.tolist())]


def sample_rows(
    agent: Agent,
    prompts: list[list[int]],
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    generator: torch.Generator | None,
    compile_decode: bool = False,
) -> list[tuple[list[int], bool]]:
    """Samples one response per prompt row: the prefill, then `_decode` (or `_decode_static` with
    ``compile_decode``); returns ``(response_ids, finished_with_eos)`` per row."""
    with threads_for(agent, len(prompts)):  # a decode step forwards one token per row
        state = prefill(agent, prompts, max_new_tokens, static=compile_decode)
        if state.static:
            return _decode_static(agent, state, temperature, top_p, max_new_tokens, generator)
        if compile_decode:
            _warn_not_static(agent)
        with chunked_head(agent.model):
            return _decode(agent, state, temperature, top_p, max_new_tokens, generator)


def _warn_not_static(agent: Agent) -> None:
    if agent.name not in _WARNED:
        _WARNED.add(agent.name)
        logger.warning(
            "agent %s: compile_decode needs full-attention layers only (a static KV cache); decoding eagerly",
            agent.name,
        )
