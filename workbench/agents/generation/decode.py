"""The decode loops of `workbench.agents.generation.rollout.generate`: one forward per new token after the
prefill.

- `_decode` (default): over the growing preallocated cache (`sampling.preallocate`); rows that finish
  leave the batch and the cache at once, so a batch costs what its live rows cost.
- `_decode_static` (``train.compile_decode``): the decode step under ``torch.compile`` over a static cache
  (`workbench.agents.generation.sampling.make_static`), CUDA graphs on GPU; every row stays until all have
  finished, so each step has the same shapes and replays one graph instead of launching thousands of small
  kernels.

Both draw tokens with `workbench.agents.generation.sampling.pick_B` for the live rows, in the same order,
through the same `_Shaper`: equal logits give equal samples.

An agent's generation options beyond temperature and top-p (`Shaping`: ``agents[i].top_k``, ``min_p``,
``repetition_penalty``, ``stop_strings``; TRL's ``generation_kwargs``) act in this order in both loops:

1. the repetition penalty on the raw logits (`penalize`, transformers' ``RepetitionPenaltyLogitsProcessor``:
   a logit of a token already in the prompt or the response is divided by the penalty, multiplied when
   negative), greedy decoding included;
2. temperature, then top-k and min-p (`workbench.agents.generation.sampling.pick_B`), then top-p;
3. after each token, a row whose text now holds a stop string ends (`StopWatch.hits`); its response is then
   cut before the token in which the string begins (`StopWatch.cut`), so the text that is graded and the
   token ids that are trained end at the same place.

Each is off at its default (0, 0, 1, none): the default draw is bit-identical to one without them. They shape
what is sampled only: the importance ratios are of softmax(logits / temperature), as for top-p (and as in TRL
and verl).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from workbench.agents.forward.agent import threads_for
from workbench.agents.generation.sampling import Prefilled, chunked_head, pick_B, prefill

if TYPE_CHECKING:
    from workbench.agents.forward.agent import Agent

__all__ = ["Shaping", "StopWatch", "penalize", "sample_rows", "seen_tokens"]


logger = logging.getLogger(__name__)

_WARNED: set[str] = set()
"""Agents already warned that their layers cannot decode over a static cache."""


class _Shaper:
    """The per-step part of an agent's generation options (`Shaping`, below): the repetition penalty's
    memory of each row's tokens, the stop strings' watch, each row's finish reason."""

    def __init__(
        self,
        agent: Agent,
        shaping: Shaping,
        prompts: list[list[int]],
        vocab: int,
        on_step: Callable[[], Any] | None = None,
    ) -> None:
        self.shaping, self.on_step = shaping, on_step
        self.penalty = shaping.repetition_penalty
        self.seen_R_V = seen_tokens(prompts, vocab, agent.device) if self.penalty != 1.0 else None
        self.watch = StopWatch(agent.tokenizer, shaping.stop_strings) if shaping.stop_strings else None
        self.reason_R = ["length"] * len(prompts)

    def pick(
        self, logits_B_V: torch.Tensor, rows_B: torch.Tensor, temperature: float, top_p: float, generator: Any
    ) -> torch.Tensor:
        """The next token of rows ``rows_B`` (the penalty applied, then `pick_B`); remembered as seen."""
        if self.seen_R_V is not None:
            logits_B_V = penalize(logits_B_V, self.seen_R_V[rows_B], self.penalty)
        s = self.shaping
        token_B = pick_B(logits_B_V, temperature, top_p, generator, top_k=s.top_k, min_p=s.min_p)
        if self.seen_R_V is not None:
            self.seen_R_V[rows_B, token_B.clamp_max(self.seen_R_V.shape[1] - 1)] = True
        if self.on_step is not None:
            self.on_step()
        return token_B

    def done(
        self,
        token_B: torch.Tensor,
        stop_S: torch.Tensor,
        rows_B: torch.Tensor,
        tokens_R_N: torch.Tensor,
        step: int,
    ) -> torch.Tensor:
        """``done_B``: rows that ended at this token: a stop token (``eos``) or a stop string (``stop``)."""
        eos_B = torch.isin(token_B, stop_S)
        done_B = eos_B
        if self.watch is not None:
            done_B = eos_B | (self.watch.hits(tokens_R_N, rows_B, step) & ~eos_B)
        for row, eos in zip(rows_B[done_B].tolist(), eos_B[done_B].tolist()):
            self.reason_R[row] = "eos" if eos else "stop"
        return done_B

    def rows(self, tokens_R_N: torch.Tensor) -> list[tuple[list[int], str]]:
        """``(response_ids, finish_reason)`` of every row."""
        lengths_R = (tokens_R_N >= 0).sum(dim=-1).tolist()
        return [(row[:n], reason) for row, n, reason in zip(tokens_R_N.tolist(), lengths_R, self.reason_R)]


@torch.no_grad()
def _decode(
    agent: Agent,
    state: Prefilled,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    generator: torch.Generator | None,
    shaper: _Shaper,
) -> list[tuple[list[int], str]]:
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
    live_B = torch.arange(R, device=device)  # original row of each live batch row
    for step in range(max_new_tokens):
        token_B = shaper.pick(logits_B_V, live_B, temperature, top_p, generator)
        tokens_R_N[live_B, step] = token_B
        done_B = shaper.done(token_B, stop_S, live_B, tokens_R_N, step)
        if done_B.any():
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
    return shaper.rows(tokens_R_N)


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
    shaper: _Shaper,
) -> list[tuple[list[int], str]]:
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
        token_B = shaper.pick(logits_R_V[live_B], live_B, temperature, top_p, generator)
        tokens_R_N[live_B, step] = token_B
        token_R = token_R.fill_(agent.pad_token_id).index_copy_(0, live_B, token_B)
        finished_R[live_B[shaper.done(token_B, stop_S, live_B, tokens_R_N, step)]] = True
        if bool(finished_R.all()) or step == max_new_tokens - 1:
            break
        attn_R_C[:, length] = 1
        length += 1
        pos_R = pos_R + 1
        logits_R_V = step_fn(token_R[:, None], attn_R_C, pos_R[:, None], state.cache).clone()
    return shaper.rows(tokens_R_N)


def sample_rows(
    agent: Agent,
    prompts: list[list[int]],
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    generator: torch.Generator | None,
    compile_decode: bool = False,
    shaping: Shaping | None = None,
    on_step: Callable[[], Any] | None = None,
) -> list[tuple[list[int], str]]:
    """Samples one response per prompt row: the prefill, then `_decode` (or `_decode_static` with
    ``compile_decode``), with the agent's generation options (``shaping``; None = the agent's spec's);
    returns ``(response_ids, finish_reason)`` per row: ``eos`` (ends with a stop token), ``stop`` (its last
    token completed a stop string) or ``length``. ``on_step`` is called after each decode step (a progress
    bar's update)."""
    shaping = shaping or Shaping.of(agent.spec)
    with threads_for(agent, len(prompts)):  # a decode step forwards one token per row
        state = prefill(agent, prompts, max_new_tokens, static=compile_decode)
        shaper = _Shaper(agent, shaping, prompts, state.logits_R_V.shape[-1], on_step)
        if state.static:
            return _decode_static(agent, state, temperature, top_p, max_new_tokens, generator, shaper)
        if compile_decode:
            _warn_not_static(agent)
        with chunked_head(agent.model):
            return _decode(agent, state, temperature, top_p, max_new_tokens, generator, shaper)


def _warn_not_static(agent: Agent) -> None:
    if agent.name not in _WARNED:
        _WARNED.add(agent.name)
        logger.warning(
            "agent %s: compile_decode needs full-attention layers only (a static KV cache); decoding eagerly",
            agent.name,
        )


# The agent's generation options (`Shaping`), used by `_Shaper` above.


@dataclass(frozen=True)
class Shaping:
    """The options of one agent (its spec's fields)."""

    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop_strings: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: Any) -> Shaping:
        """The options of an `workbench.config.agent_spec.AgentSpec`."""
        return cls(spec.top_k, spec.min_p, spec.repetition_penalty, tuple(spec.stop_strings))


def seen_tokens(prompts: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """``seen_R_V``: True where token v is in row r's prompt (the repetition penalty's memory)."""
    seen_R_V = torch.zeros((len(prompts), vocab), dtype=torch.bool, device=device)
    for r, prompt in enumerate(prompts):
        ids = torch.tensor([t for t in prompt if t < vocab], dtype=torch.long, device=device)
        seen_R_V[r, ids] = True
    return seen_R_V


def penalize(logits_B_V: torch.Tensor, seen_B_V: torch.Tensor, penalty: float) -> torch.Tensor:
    """The logits with every seen token's divided by ``penalty`` (multiplied when negative)."""
    penalized_B_V = torch.where(logits_B_V < 0, logits_B_V * penalty, logits_B_V / penalty)
    return torch.where(seen_B_V, penalized_B_V, logits_B_V)


class StopWatch:
    """Finds an agent's stop strings in its responses while they are sampled and cuts the responses there.

    Args:
        tokenizer: The agent's tokenizer (decodes with special tokens skipped, as rollout texts are).
        strings: The stop strings (non-empty).
    """

    def __init__(self, tokenizer: Any, strings: tuple[str, ...]) -> None:
        self.tokenizer, self.strings = tokenizer, strings
        # A window of tokens that holds the longest string (a token decodes to one character at least, a
        # byte-level one to a part of one).
        self.window = 4 * max(len(s) for s in strings) + 4

    def hits(self, tokens_R_N: torch.Tensor, rows_B: torch.Tensor, step: int) -> torch.Tensor:
        """``hit_B``: whether row ``rows_B[b]``'s last tokens (up to ``step``) now hold a stop string."""
        start = max(0, step + 1 - self.window)
        tails = tokens_R_N[rows_B, start : step + 1].tolist()
        texts = self.tokenizer.batch_decode(
            [[t for t in tail if t >= 0] for tail in tails], skip_special_tokens=True
        )
        return torch.tensor([any(s in text for s in self.strings) for text in texts], device=rows_B.device)

    def cut(self, response_ids: list[int], text: str, reason: str) -> tuple[list[int], str, str]:
        """``(ids, text, reason)`` of a response cut before its first stop string (reason ``stop``): the
        longest prefix of its tokens whose text does not reach into the string, and that text; unchanged when
        its text holds none."""
        found = [i for i in (text.find(s) for s in self.strings) if i >= 0]
        if not found:
            return response_ids, text, reason
        at, n = min(found), len(response_ids)
        while n > 0:
            prefix = self.tokenizer.decode(response_ids[:n], skip_special_tokens=True)
            if len(prefix) <= at and text.startswith(prefix):
                return response_ids[:n], prefix, "stop"
            n -= 1
        return [], "", "stop"
