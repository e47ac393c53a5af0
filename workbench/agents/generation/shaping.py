"""An agent's generation options beyond temperature and top-p: top-k, min-p, repetition penalty, stop strings.

Set per agent (``agents[i].top_k``, ``min_p``, ``repetition_penalty``, ``stop_strings``; TRL's
``generation_kwargs``), read from the agent's spec by `workbench.agents.generation.rollout.generate`, and used
by both decode loops in the same order, so eager and compiled decoding still draw the same samples:

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

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Shaping", "StopWatch", "penalize", "seen_tokens"]


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
