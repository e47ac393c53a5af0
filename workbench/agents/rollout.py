"""Rollouts: batched sampling with a KV cache, old-policy scoring, and learner token log-probs.

- `generate`: a prefill, then one forward per new token over a preallocated KV cache
  (`workbench.agents.kvcache`). The prefill runs each distinct prompt once (its n samples share it) and the
  prefix all prompts share (a chat template's system turn) once. Rows that finished are dropped from the batch
  (and its cache) as they finish, so a batch costs what its live rows cost. Tokens are drawn by inverse CDF,
  one uniform per row and step (same seed, same samples). Batches hold as many rows as the memory budget
  allows (`workbench.agents.memory.generation_rows`). The prefill, the token draw and the sliced LM head live
  in `workbench.agents.sampling`, the decode loops (eager, and compiled over a static cache) in
  `workbench.agents.decode`.
- `token_logprobs` / `sequence_logprobs`: the learner's log-probs with gradient on a `TokenBatch`
  (`workbench.agents.sharing`), one forward pass; the trainer micro-batches with ``TokenBatch.select``
  (`workbench.train.update`: the author's old-policy scores, Eq. 11, and the updates).
- `reference_token_logprobs`: the KL reference (LoRA: adapters disabled; full fine-tuning: initial weights).

Alignment: ``logp_B_T[b, t]`` is the log-prob of ``input_ids_B_T[b, t + 1]`` given the tokens up to ``t``;
both returned tensors have ``T - 1`` columns (``mask_B_T = response_mask_B_T[:, 1:]``).

Log-probs are those of ``softmax(logits / temperature)``, the distribution the tokens were sampled from before
top-p (as verl computes them); temperature 0 (greedy) is scored at temperature 1. They are computed on the
response positions only, a chunk of tokens at a time (`workbench.agents.logprobs`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from workbench.agents.decode import sample_rows
from workbench.agents.logprobs import head_parts, logits_logprobs, selective_logprobs
from workbench.agents.memory import generation_rows
from workbench.agents.packing import pack_rows, packed_attention, packed_attention_active, supports_packing
from workbench.agents.tokens import TokenBatch
from workbench.core.losses import masked_mean_logp
from workbench.core.types import Rollout

if TYPE_CHECKING:
    from workbench.agents.agent import Agent


def _decode_response(agent: Agent, response_ids: list[int], finished: bool) -> str:
    body = response_ids[:-1] if finished else response_ids  # the terminal EOS is not part of the text
    return agent.tokenizer.decode(body, skip_special_tokens=True)


def _check_context(agent: Agent, prompts: list[list[int]], max_new_tokens: int) -> None:
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
            (`workbench.agents.memory.generation_rows`: KV cache, prefill and sampling buffers per row).
        memory_budget: Bytes a batch may use; None = the agent alone on its device (90% of its memory, less
            the runtime and the model).
        compile_decode: Decode under ``torch.compile`` over a static KV cache (`_decode_static`; CUDA graphs
            on GPU); models with sliding-window or other non-standard layers decode eagerly.

    Returns:
        Rollouts, prompt-major (prompt 0's n samples, then prompt 1's...), ``prompt_index`` = index in
        ``prompts``, ``index`` = 0..n-1 within the prompt. ``response_ids`` end with the stop token when
        ``finish_reason == "eos"``; ``text`` is decoded with special tokens skipped and without that terminal
        token. Old log-probs are not filled (`workbench.train.update.score_self` does that).
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
    _check_context(agent, encoded, max_new_tokens)
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
    sampled: list[tuple[list[int], bool]] = [([], False)] * len(rows)
    for start in range(0, len(rows), size):
        chunk = schedule[start : start + size]
        for row, result in zip(
            chunk,
            sample_rows(
                agent,
                [encoded[rows[r]] for r in chunk],
                temperature,
                top_p,
                max_new_tokens,
                generator,
                compile_decode,
            ),
        ):
            sampled[row] = result
    rollouts = []
    for row, (response_ids, finished) in enumerate(sampled):
        i = rows[row]
        rollouts.append(
            Rollout(
                prompt_index=i,
                author=author,
                index=row % n,
                prompt=prompts[i],
                text=_decode_response(agent, response_ids, finished),
                prompt_ids=list(encoded[i]),
                response_ids=response_ids,
                finish_reason="eos" if finished else "length",
            )
        )
    return rollouts


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
    """Log-probs of the response tokens (`workbench.agents.logprobs`): the LM head and the log-softmax run
    only on response positions, a chunk of tokens at a time, so no full-vocabulary fp32 tensor is built.

    The rows run packed (`workbench.agents.packing`: no padding, each distinct prompt once) when the model
    supports it; a gradient pass with checkpointing only inside the caller's `packed_attention` block (its
    backward pass recomputes the layers), else padded.
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
        batch: Right-padded sequences (`workbench.agents.sharing.build_training_batch`), any device.
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
    micro-batch (`workbench.train.update.score_self`).
    """
    batch = batch.to(agent.device)
    context = agent.model.disable_adapter() if agent.is_lora else contextlib.nullcontext()
    model = agent.model if agent.is_lora else agent.reference_model()
    with context:
        return _token_logprobs_with(model, batch, temperature)
