"""Training views of shared rollouts: self samples keep their ids, cross samples are re-encoded (Sec. 3.3).

A learner trains on every agent's rollouts. Its own (``author == learner_index``) keep ``prompt_ids +
response_ids`` exactly as sampled, so an on-policy self sample has ratio 1. Another agent's response is
re-encoded as the HACPO authors' verl-v1 port does:

1. the text is the source's decoded response, special tokens skipped and terminal EOS stripped
   (``Rollout.text``);
2. the prompt is re-encoded with the learner's prompt format (`Agent.encode_prompt`);
3. the response is ``learner.tokenizer.encode(text, add_special_tokens=False)`` (special-token strings in the
   text stay plain text), plus the learner's EOS when the source finished with EOS (an EOS-only response
   becomes the learner's EOS alone);
4. the source's old log-prob sum and count travel with the rollout (they are never recomputed).

Characters the learner's vocabulary lacks (a byte-level BPE source vs a character-level learner) become the
learner's unknown token and are counted; they never raise. A re-encoded response longer than the learner's
cap (twice its ``max_new_tokens``, and never past its context window) is truncated and counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.agents.forward.tokens import TokenBatch, pack
from workbench.core.types import Rollout

if TYPE_CHECKING:
    from workbench.agents.forward.agent import Agent

CROSS_LENGTH_FACTOR = 2
"""A re-encoded response keeps at most this many times the learner's ``max_new_tokens`` tokens."""


def _response_cap(learner: Agent, prompt_len: int) -> int:
    cap = CROSS_LENGTH_FACTOR * learner.max_new_tokens
    if learner.max_positions is not None:
        cap = min(cap, learner.max_positions - prompt_len)
    return max(cap, 1)


def reencode_response(learner: Agent, rollout: Rollout) -> tuple[list[int], list[int], dict[str, int]]:
    """The learner's view of another agent's rollout: ``(prompt_ids, response_ids, counts)``.

    ``counts`` holds ``unknown_chars`` (learner unknown tokens produced), ``truncated`` (0/1),
    ``empty`` (0/1: no response token at all) and ``lossy`` (0/1: decoding does not give the text back).
    """
    (body,) = _encode_texts(learner, [rollout.text])
    (decoded,) = learner.tokenizer.batch_decode([body], skip_special_tokens=False)
    return _reencoded(learner, rollout, learner.encode_prompt(rollout.prompt), body, decoded)


def _encode_texts(learner: Agent, texts: list[str]) -> list[list[int]]:
    """Each text in the learner's tokens, one tokenizer call for all (an empty text has none)."""
    present = [t for t in texts if t]
    # split_special_tokens: a literal "<eos>" in the text is text, never the learner's special token
    encoded = (
        learner.tokenizer(present, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        if present
        else []
    )
    bodies = iter(encoded)
    return [list(next(bodies)) if t else [] for t in texts]


def _reencoded(
    learner: Agent, rollout: Rollout, prompt_ids: list[int], body: list[int], decoded: str
) -> tuple[list[int], list[int], dict[str, int]]:
    """`reencode_response` given the prompt's ids, the text's ids and their decoding."""
    unk_id = getattr(learner.tokenizer, "unk_token_id", None)
    unknown = sum(1 for t in body if t == unk_id) if unk_id is not None else 0
    lossy = int(bool(body) and decoded != rollout.text)
    response = body + ([learner.eos_token_id] if rollout.finish_reason == "eos" else [])
    cap = _response_cap(learner, len(prompt_ids))
    truncated = int(len(response) > cap)
    response = response[:cap]
    counts = {"unknown_chars": unknown, "truncated": truncated, "empty": int(not response), "lossy": lossy}
    return list(prompt_ids), response, counts


def build_training_batch(
    learner: Agent, rollouts: list[Rollout], learner_index: int
) -> tuple[TokenBatch, dict[str, int]]:
    """One learner's batch over every agent's rollouts, in the order given.

    Cross samples are re-encoded as `reencode_response` does, each distinct prompt once and every text in one
    tokenizer call.

    Args:
        learner: The agent being updated.
        rollouts: Rollouts of all agents (self and cross), already scored by their authors.
        learner_index: The learner's agent index: rollouts with this ``author`` are self samples.

    Returns:
        The `TokenBatch` (CPU) and counts for logging: ``self``, ``reencoded``, ``unknown_chars``,
        ``truncated``, ``empty_responses``, ``lossy``.
    """
    cross = [r for r in rollouts if r.author != learner_index]
    prompts = {p: learner.encode_prompt(p) for p in dict.fromkeys(r.prompt for r in cross)}
    bodies = _encode_texts(learner, [r.text for r in cross])
    decoded = learner.tokenizer.batch_decode(bodies, skip_special_tokens=False) if bodies else []
    reencoded = iter(zip(cross, bodies, decoded))
    pairs: list[tuple[list[int], list[int]]] = []
    counts = {"self": 0, "reencoded": 0, "unknown_chars": 0, "truncated": 0, "empty_responses": 0, "lossy": 0}
    for rollout in rollouts:
        if rollout.author == learner_index:
            pairs.append((list(rollout.prompt_ids), list(rollout.response_ids)))
            counts["self"] += 1
            counts["empty_responses"] += int(not rollout.response_ids)
            continue
        _, body, text = next(reencoded)
        prompt_ids, response_ids, row = _reencoded(learner, rollout, prompts[rollout.prompt], body, text)
        pairs.append((prompt_ids, response_ids))
        counts["reencoded"] += 1
        counts["unknown_chars"] += row["unknown_chars"]
        counts["truncated"] += row["truncated"]
        counts["empty_responses"] += row["empty"]
        counts["lossy"] += row["lossy"]
    return pack(pairs, learner.pad_token_id), counts
