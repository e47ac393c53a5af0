"""Rollouts: batched sampling with a KV cache (`generate`).

A prefill, then one forward per new token over a preallocated KV cache
(`workbench.agents.generation.sampling`). The prefill runs each distinct prompt once (its n samples share it)
and the prefix all prompts share (a chat template's system turn) once. Rows that finished are dropped from the
batch (and its cache) as they finish, so a batch costs what its live rows cost. Tokens are drawn by inverse
CDF, one uniform per row and step (same seed, same samples). Batches hold as many rows as the memory budget
allows (`workbench.agents.plan.memory.generation_rows`). The prefill, the token draw and the sliced LM head
live in `workbench.agents.generation.sampling`, the decode loops (eager, and compiled over a static cache) in
`workbench.agents.generation.decode`. Old-policy scores are not filled here: the trained model scores its
own samples (`workbench.train.scoring`), whatever sampled them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from workbench.agents.generation.decode import StopWatch, sample_rows
from workbench.agents.plan.memory import generation_rows
from workbench.core.progress import bar
from workbench.core.types import Rollout

if TYPE_CHECKING:
    from workbench.agents.forward.agent import Agent


def _decode_response(agent: Agent, response_ids: list[int], finished: bool) -> str:
    body = response_ids[:-1] if finished else response_ids  # the terminal EOS is not part of the text
    return agent.tokenizer.decode(body, skip_special_tokens=True)


def check_context(agent: Agent, prompts: list[list[int]], max_new_tokens: int) -> None:
    limit, longest = agent.max_positions, max(len(p) for p in prompts)
    if limit is not None and longest + max_new_tokens > limit:
        raise ValueError(
            f"agent {agent.name!r}: a prompt of {longest} tokens + max_new_tokens={max_new_tokens} exceeds "
            f"the model's context of {limit} tokens; shorten the prompts or lower max_new_tokens"
        )


def generate(
    agent: Agent,
    prompts: list[str],
    n: int = 1,
    *,
    temperature: float | None = None,
    top_p: float | None = None,
    max_new_tokens: int | None = None,
    author: int = 0,
    seed: int | None = None,
    batch_size: int | None = None,
    memory_budget: int | None = None,
    compile_decode: bool = False,
    desc: str | None = None,
) -> list[Rollout]:
    """Samples ``n`` responses per prompt with the agent's prompt format.

    Args:
        agent: The author.
        prompts: User contents (question + instruction); `Agent.format_prompt` is applied here.
        n: Responses per prompt (the group size G).
        temperature: Sampling temperature, 0 = greedy; None = ``agent.spec.temperature``.
        top_p: Nucleus threshold; None = ``agent.spec.top_p``.
        max_new_tokens: Response cap; None = ``agent.max_new_tokens``.
        author: Agent index copied into every rollout.
        seed: Seeds a private generator (same seed, same samples); None = torch's global RNG.
        batch_size: Rows sampled together; None = as many as ``memory_budget`` holds
            (`workbench.agents.plan.memory.generation_rows`: KV cache, prefill and sampling buffers per row).
        memory_budget: Bytes a batch may use; None = the agent alone on its device (90% of its memory, less
            the runtime and the model).
        compile_decode: Decode under ``torch.compile`` over a static KV cache (`_decode_static`; CUDA graphs
            on GPU); models with sliding-window or other non-standard layers decode eagerly.
        desc: The label of the progress bar over decode steps (`workbench.core.progress`); None =
            ``"<agent> generate"``.

    Returns:
        Rollouts, prompt-major (prompt 0's n samples, then prompt 1's...), ``prompt_index`` = index in
        ``prompts``, ``index`` = 0..n-1 within the prompt. ``response_ids`` end with the stop token when
        ``finish_reason == "eos"``; ``text`` is decoded with special tokens skipped and without that terminal
        token. A response that reached one of the agent's stop strings (``finish_reason == "stop"``) ends,
        ids and text alike, before the token in which the string begins
        (`workbench.agents.generation.decode`). The agent's top-k, min-p and repetition penalty shape the
        draw. Old log-probs are not filled (`workbench.train.scoring.score_self` does that).
    """
    temperature = agent.spec.temperature if temperature is None else temperature
    top_p = agent.spec.top_p if top_p is None else top_p
    max_new_tokens = max_new_tokens or agent.max_new_tokens
    if n < 1 or temperature < 0 or not 0 < top_p <= 1 or max_new_tokens < 1:
        raise ValueError(
            f"generate: n={n}, temperature={temperature}, top_p={top_p}, max_new_tokens={max_new_tokens}; "
            "need n >= 1, temperature >= 0, top_p in (0, 1], max_new_tokens >= 1"
        )
    if not prompts:
        return []
    encoded = [agent.encode_prompt(p) for p in prompts]
    check_context(agent, encoded, max_new_tokens)
    rows = [i for i in range(len(prompts)) for _ in range(n)]  # prompt-major
    generator = None
    if seed is not None:
        generator = torch.Generator(device=agent.device).manual_seed(seed)
    size = batch_size or generation_rows(
        agent,
        max(len(p) for p in encoded),
        max_new_tokens,
        sampled=temperature > 0,
        top_p=top_p,
        budget=memory_budget,
    )
    # Several batches: sample rows in order of prompt length (stable, so a prompt's n rows stay together), so
    # that each batch pads its prompts to a similar width. One batch keeps the prompt-major order.
    order = sorted(range(len(rows)), key=lambda r: len(encoded[rows[r]])) if len(rows) > size else None
    schedule = order or list(range(len(rows)))
    sampled: list[tuple[list[int], str]] = [([], "length")] * len(rows)
    batches = range(0, len(rows), size)
    with bar(len(batches) * max_new_tokens, desc or f"{agent.name} generate", "tok") as progress:
        for b, start in enumerate(batches):
            chunk = schedule[start : start + size]
            results = sample_rows(
                agent,
                [encoded[rows[r]] for r in chunk],
                temperature,
                top_p,
                max_new_tokens,
                generator,
                compile_decode,
                on_step=progress.update,
            )
            progress.update((b + 1) * max_new_tokens - progress.n)  # the batch's rows all ended
            for row, result in zip(chunk, results):
                sampled[row] = result
    return to_rollouts(agent, prompts, encoded, n, sampled, author=author)


def to_rollouts(
    agent: Agent,
    prompts: list[str],
    encoded: list[list[int]],
    n: int,
    sampled: list[tuple[list[int], str]],
    *,
    author: int,
    sampler_logp: list[list[float]] | None = None,
) -> list[Rollout]:
    """Rollout records of sampled rows, whichever engine drew them (`generate`, the vLLM engine).

    Args:
        agent: The author.
        prompts: User contents, as given to the engine.
        encoded: ``agent.encode_prompt`` of each prompt.
        n: Responses per prompt; ``sampled`` is prompt-major (prompt 0's n rows, then prompt 1's).
        sampled: Per row, the response ids (ending with a stop token when the reason is ``"eos"``) and the
            finish reason (``"eos"`` or ``"length"``).
        author: Agent index copied into every rollout.
        sampler_logp: Per row, the engine's log-prob of each sampled token (``Rollout.sampler_logp_T``, cut
            with the row); None when the engine reports none.

    Returns:
        See `generate`: text decoded without the terminal stop token, and rows cut before the agent's first
        stop string (``finish_reason == "stop"``).
    """
    watch = StopWatch(agent.tokenizer, agent.spec.stop_strings) if agent.spec.stop_strings else None
    rollouts = []
    for row, (response_ids, reason) in enumerate(sampled):
        i = row // n
        text = _decode_response(agent, response_ids, reason == "eos")
        if watch is not None:  # cut before the first stop string: the graded text and the trained ids agree
            response_ids, text, reason = watch.cut(response_ids, text, reason)
        rollouts.append(
            Rollout(
                prompt_index=i,
                author=author,
                index=row % n,
                prompt=prompts[i],
                text=text,
                prompt_ids=list(encoded[i]),
                response_ids=response_ids,
                finish_reason=reason,
                sampler_logp_T=None if sampler_logp is None else sampler_logp[row][: len(response_ids)],
            )
        )
    return rollouts
