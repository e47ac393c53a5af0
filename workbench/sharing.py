"""Training views of shared rollouts: self samples keep their ids, cross samples are re-encoded (spec §3(c)).

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

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from workbench.types import Rollout

if TYPE_CHECKING:
    from workbench.agents import Agent

CROSS_LENGTH_FACTOR = 2
"""A re-encoded response keeps at most this many times the learner's ``max_new_tokens`` tokens."""


@dataclass
class TokenBatch:
    """Right-padded token sequences of one learner, ready for a forward pass.

    Attributes:
        input_ids_B_T: Prompt + response ids, right padded with the learner's pad id.
        attention_mask_B_T: 1 on real tokens, 0 on padding.
        response_mask_B_T: 1 on response tokens (the EOS included), aligned with ``input_ids_B_T``.
    """

    input_ids_B_T: torch.Tensor
    attention_mask_B_T: torch.Tensor
    response_mask_B_T: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids_B_T.shape[0]

    def select(self, indices: Iterable[int] | torch.Tensor) -> TokenBatch:
        """The rows ``indices``, trailing all-padding columns dropped (for micro-batching)."""
        index_B = torch.as_tensor(
            list(indices) if not torch.is_tensor(indices) else indices, dtype=torch.long
        )
        index_B = index_B.to(self.input_ids_B_T.device)
        attn_B_T = self.attention_mask_B_T[index_B]
        width = int(attn_B_T.sum(dim=-1).max()) if len(index_B) else 0
        return TokenBatch(
            input_ids_B_T=self.input_ids_B_T[index_B, :width],
            attention_mask_B_T=attn_B_T[:, :width],
            response_mask_B_T=self.response_mask_B_T[index_B, :width],
        )

    def to(self, device: torch.device | str) -> TokenBatch:
        """A copy on ``device`` (self when already there)."""
        if self.input_ids_B_T.device == torch.device(device):
            return self
        return TokenBatch(
            self.input_ids_B_T.to(device),
            self.attention_mask_B_T.to(device),
            self.response_mask_B_T.to(device),
        )


def pack(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> TokenBatch:
    """Right-pads ``(prompt_ids, response_ids)`` pairs into a `TokenBatch` (on CPU)."""
    width = max((len(p) + len(r) for p, r in pairs), default=0)
    ids_B_T = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    attn_B_T = torch.zeros((len(pairs), width), dtype=torch.long)
    resp_B_T = torch.zeros((len(pairs), width), dtype=torch.long)
    for i, (prompt, response) in enumerate(pairs):
        n_p, n = len(prompt), len(prompt) + len(response)
        ids_B_T[i, :n] = torch.tensor(prompt + response, dtype=torch.long)
        attn_B_T[i, :n] = 1
        resp_B_T[i, n_p:n] = 1
    return TokenBatch(ids_B_T, attn_B_T, resp_B_T)


def self_token_batch(rollouts: list[Rollout], pad_id: int) -> TokenBatch:
    """The author's own view of its rollouts: ``prompt_ids + response_ids``."""
    return pack([(r.prompt_ids, r.response_ids) for r in rollouts], pad_id)


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
    tokenizer = learner.tokenizer
    prompt_ids = learner.encode_prompt(rollout.prompt)
    # split_special_tokens: a literal "<eos>" in the text is text, never the learner's special token
    body = (
        tokenizer.encode(rollout.text, add_special_tokens=False, split_special_tokens=True)
        if rollout.text
        else []
    )
    unk_id = getattr(tokenizer, "unk_token_id", None)
    unknown = sum(1 for t in body if t == unk_id) if unk_id is not None else 0
    lossy = int(bool(body) and tokenizer.decode(body, skip_special_tokens=False) != rollout.text)
    response = body + ([learner.eos_token_id] if rollout.finish_reason == "eos" else [])
    cap = _response_cap(learner, len(prompt_ids))
    truncated = int(len(response) > cap)
    response = response[:cap]
    counts = {"unknown_chars": unknown, "truncated": truncated, "empty": int(not response), "lossy": lossy}
    return prompt_ids, response, counts


def build_training_batch(
    learner: Agent, rollouts: list[Rollout], learner_index: int
) -> tuple[TokenBatch, dict[str, int]]:
    """One learner's batch over every agent's rollouts, in the order given.

    Args:
        learner: The agent being updated.
        rollouts: Rollouts of all agents (self and cross), already scored by their authors.
        learner_index: The learner's agent index: rollouts with this ``author`` are self samples.

    Returns:
        The `TokenBatch` (CPU) and counts for logging: ``self``, ``reencoded``, ``unknown_chars``,
        ``truncated``, ``empty_responses``, ``lossy``.
    """
    pairs: list[tuple[list[int], list[int]]] = []
    counts = {"self": 0, "reencoded": 0, "unknown_chars": 0, "truncated": 0, "empty_responses": 0, "lossy": 0}
    for rollout in rollouts:
        if rollout.author == learner_index:
            pairs.append((list(rollout.prompt_ids), list(rollout.response_ids)))
            counts["self"] += 1
            counts["empty_responses"] += int(not rollout.response_ids)
            continue
        prompt_ids, response_ids, row = reencode_response(learner, rollout)
        pairs.append((prompt_ids, response_ids))
        counts["reencoded"] += 1
        counts["unknown_chars"] += row["unknown_chars"]
        counts["truncated"] += row["truncated"]
        counts["empty_responses"] += row["empty"]
        counts["lossy"] += row["lossy"]
    return pack(pairs, learner.pad_token_id), counts
