"""Records shared across the workbench, and the glossary of shape letters.

Shape suffixes on tensor names:

| letter | meaning |
|---|---|
| ``P`` | prompts in a step's batch |
| ``A`` | agents, as authors (sources) of responses |
| ``L`` | agents, as learners |
| ``G`` | responses per agent per prompt (the group size) |
| ``T`` | tokens |
| ``B`` | a flat batch of sequences |

So ``rewards_P_A_G[p, a, g]`` is the reward of agent ``a``'s ``g``-th response to prompt ``p``, and
``omega_A_A[k, j]`` is the capability ratio ``P̂_k / P̂_j``.

Vocabulary:

- *self sample*: a response the learner generated itself (keeps its own token ids);
- *cross sample*: a response another agent generated, shared with the learner (re-encoded as text);
- *source* / *author*: the agent that generated a response; *learner*: the agent being updated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TaskItem:
    """One verifiable problem.

    Attributes:
        id: Stable identifier, unique within its source (``"embedded-train-17"``).
        question: The problem text shown to the model (without the instruction).
        answer: The gold final answer as a string (``"12"``, ``"\\frac{1}{2}"``).
        solution: A worked solution ending in ``\\boxed{answer}``, when the source has one.
        source: Name of the task source or benchmark (``"embedded"``, ``"gsm8k"``).
        difficulty: A difficulty key the source provides, as text (the embedded task: its number of
            operations, ``"2"``); empty when the source has none. Held-out accuracy is also reported per
            value (``eval_difficulty/`` metrics).
    """

    id: str
    question: str
    answer: str
    solution: str | None = None
    source: str = ""
    difficulty: str = ""


@dataclass(frozen=True, order=True)
class RolloutId:
    """Who wrote a response to which prompt: the identity batches and logs are indexed by.

    Attributes:
        author: Agent index of the author (``a`` in ``rewards_P_A_G``).
        prompt: Index of the prompt in the step's batch (``p``).
        index: Which of the author's responses to that prompt (``g``, 0 .. G−1).
    """

    author: int
    prompt: int
    index: int

    def __str__(self) -> str:
        return f"{self.author}/{self.prompt}/{self.index}"


@dataclass
class Rollout:
    """One sampled response, as produced by its author and shared with every learner.

    The text is the tokenizer-neutral record; token ids are the author's own. The old-policy
    log-likelihood is the author's, in its own tokenization, at the sampling temperature, computed
    before any update of the step (Eq. 11).

    Attributes:
        prompt_index: Index of the prompt in the step's batch (``p`` in ``rewards_P_A_G``).
        author: Index of the agent that generated it (``a``).
        index: Which of the author's responses to this prompt it is (``g``).
        prompt: The user content the prompt was built from (question + instruction, unformatted).
        text: The decoded response text, special tokens skipped, terminal EOS stripped.
        prompt_ids: The author's tokenization of its formatted prompt.
        response_ids: The author's response token ids, including a terminal EOS when it finished.
        finish_reason: ``"eos"`` when it emitted EOS, ``"stop"`` when it reached a stop string of its author
            (cut before it), ``"length"`` when it hit the cap.
        reward: Verified reward in [0, 1]; NaN until graded.
        old_logp_sum: Sum of the author's old-policy token log-probs over ``response_ids``.
        old_logp_count: Number of tokens in that sum (``len(response_ids)``).
        grade_reason: Why the grader gave that reward (``"correct"``, ``"wrong"``, ``"no_answer"``...).
        sampler_logp_T: The sampling engine's own log-probs of ``response_ids`` (vLLM's, after temperature and
            top-p), one per token; None where the trained model sampled them itself (the built-in loop).
            Only measures the sampler/trainer gap: old log-probs are always the trainer's.
    """

    prompt_index: int
    author: int
    index: int
    prompt: str
    text: str
    prompt_ids: list[int]
    response_ids: list[int]
    finish_reason: str
    reward: float = math.nan
    old_logp_sum: float = math.nan
    old_logp_count: int = 0
    grade_reason: str = ""
    sampler_logp_T: list[float] | None = None

    @property
    def id(self) -> RolloutId:
        """``RolloutId(author, prompt_index, index)``."""
        return RolloutId(self.author, self.prompt_index, self.index)

    @property
    def length(self) -> int:
        """Response length in the author's tokens."""
        return len(self.response_ids)

    @property
    def old_logp_mean(self) -> float:
        """Author's per-token mean old log-prob (0.0 for an empty response, never NaN)."""
        return self.old_logp_sum / self.old_logp_count if self.old_logp_count else 0.0
