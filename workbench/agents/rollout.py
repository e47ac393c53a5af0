"""Rollouts: batched sampling with a KV cache, old-policy scoring, and learner token log-probs.

- `generate`: a prefill, then one forward per new token over a preallocated KV cache
  (`workbench.agents.kvcache`). The prefill runs each distinct prompt once (its n samples share it) and the
  prefix all prompts share (a chat template's system turn) once. Rows that finished are dropped from the batch
  (and its cache) as they finish, so a batch costs what its live rows cost. Tokens are drawn by inverse CDF,
  one uniform per row and step (same seed, same samples). The prefill, the token draw and the sliced LM head
  live in `workbench.agents.sampling`; the decode loop is here.
- `token_logprobs` / `sequence_logprobs`: the learner's log-probs with gradient on a `TokenBatch`
  (`workbench.agents.sharing`), one forward pass; the trainer micro-batches with ``TokenBatch.select``
  (`workbench.train.update`: the author's old-policy scores, Eq. 11, and the updates).
- `reference_token_logprobs`: the KL reference (LoRA: adapters disabled; full fine-tuning: initial weights).

Alignment: ``logp_B_T[b, t]`` is the log-prob of ``input_ids_B_T[b, t + 1]`` given the tokens up to ``t``;
both returned tensors have ``T - 1`` columns (``mask_B_T = response_mask_B_T[:, 1:]``).

Log-probs are those of ``softmax(logits / temperature)``, the distribution the tokens were sampled from before
top-p (as verl computes them); temperature 0 (greedy) is scored at temperature 1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from workbench.agents.sampling import Prefilled, chunked_head, pick_B, prefill
from workbench.agents.tokens import TokenBatch
from workbench.core.losses import masked_mean_logp
from workbench.core.types import Rollout

if TYPE_CHECKING:
    from workbench.agents.agent import Agent

DEFAULT_BATCH_ROWS = 256
"""Most rows `generate` samples together by default (one typical step's prompts x G)."""
KV_CACHE_BUDGET_BYTES = 4 << 30
"""Default rows are also capped so that the KV cache stays under this (SmolLM2 fp32: 46 kB per token)."""


def _kv_bytes_per_token(model: Any) -> int:
    """KV-cache bytes per token: layers x 2 x kv heads x head dim x element size (from the config)."""
    config = model.config
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", 1)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", 1)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", 1)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return layers * 2 * kv_heads * head_dim * model.dtype.itemsize


def default_batch_rows(agent: Agent, longest_prompt: int, max_new_tokens: int) -> int:
    """Rows per sampling batch: `DEFAULT_BATCH_ROWS`, fewer when the KV cache would pass its budget."""
    per_row = _kv_bytes_per_token(agent.model) * (longest_prompt + max_new_tokens)
    return max(1, min(DEFAULT_BATCH_ROWS, KV_CACHE_BUDGET_BYTES // per_row))


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


def _sample_chunk(
    agent: Agent,
    prompts: list[list[int]],
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    generator: torch.Generator | None,
) -> list[tuple[list[int], bool]]:
    """Samples one response per prompt row; returns ``(response_ids, finished_with_eos)`` per row."""
    state = prefill(agent, prompts, max_new_tokens)
    with chunked_head(agent.model):
        return _decode(agent, state, temperature, top_p, max_new_tokens, generator)


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
        batch_size: Rows sampled together (KV cache memory grows with it); None = `default_batch_rows`.

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
    size = batch_size or default_batch_rows(agent, max(len(p) for p in encoded), max_new_tokens)
    # Several batches: sample rows in order of prompt length (stable, so a prompt's n rows stay together), so
    # that each batch pads its prompts to a similar width. One batch keeps the prompt-major order.
    order = sorted(range(len(rows)), key=lambda r: len(encoded[rows[r]])) if len(rows) > size else None
    schedule = order or list(range(len(rows)))
    sampled: list[tuple[list[int], bool]] = [([], False)] * len(rows)
    for start in range(0, len(rows), size):
        chunk = schedule[start : start + size]
        for row, result in zip(
            chunk,
            _sample_chunk(
                agent, [encoded[rows[r]] for r in chunk], temperature, top_p, max_new_tokens, generator
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


def _token_logprobs_with(
    model: Any, batch: TokenBatch, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    ids_B_T = batch.input_ids_B_T
    mask_B_T = batch.response_mask_B_T[:, 1:]
    # Only positions from the first response token on need logits: skip the lm_head over long prompts.
    has_response = batch.response_mask_B_T.any(dim=0).nonzero()
    first = int(has_response[0]) if len(has_response) else ids_B_T.shape[1] - 1
    keep = ids_B_T.shape[1] - max(first - 1, 0)
    out = model(
        input_ids=ids_B_T, attention_mask=batch.attention_mask_B_T, use_cache=False, logits_to_keep=keep
    )
    logits_B_K_V = out.logits[:, :-1].float() / (temperature or 1.0)
    targets_B_K = ids_B_T[:, ids_B_T.shape[1] - keep + 1 :]
    picked_B_K = logits_B_K_V.gather(-1, targets_B_K.unsqueeze(-1)).squeeze(-1)
    logp_B_K = picked_B_K - torch.logsumexp(logits_B_K_V, dim=-1)
    # left-fill the skipped prompt columns with zeros so columns align with input positions t + 1
    pad_B_P = logp_B_K.new_zeros((ids_B_T.shape[0], mask_B_T.shape[1] - logp_B_K.shape[1]))
    logp_B_T = torch.cat([pad_B_P, logp_B_K], dim=-1)
    return torch.where(mask_B_T.bool(), logp_B_T, torch.zeros_like(logp_B_T)), mask_B_T


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
