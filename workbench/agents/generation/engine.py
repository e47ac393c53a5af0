"""The rollout-engine interface: what a sampling backend must give the trainer, and the one that exists.

An engine only *samples*. It returns, per response, the text and the token ids in the agent's own tokenizer;
it returns no log-probs the trainer would use. The author's old log-probs and the learner's log-probs are
always recomputed by the trained model itself (`workbench.train.scoring.score_self`), so an engine whose
numerics differ from the training forward (a vLLM kernel, another dtype) cannot bias the importance ratios:
it can only make the samples slightly off-policy, which the ratios then measure.

Contract of `RolloutEngine.generate` (checked for every engine by `check_rollouts`):

- ``len(prompts) * n`` rollouts, prompt-major: prompt 0's n samples, then prompt 1's, with ``prompt_index``
  and ``index`` (0..n-1) set and ``author`` copied;
- ``prompt_ids`` = ``agent.encode_prompt(prompt)`` (the chat template or plain template of the agent);
- ``response_ids`` in the agent's tokenizer, ending with one of ``agent.stop_token_ids`` exactly when
  ``finish_reason == "eos"`` (else ``"stop"``: cut before one of the agent's stop strings, or ``"length"``),
  at most ``max_new_tokens`` long;
- ``text`` = the response decoded with special tokens skipped, without the terminal stop token;
- sampling from softmax(logits / temperature) with nucleus ``top_p`` (temperature 0 = greedy), seeded by
  ``seed`` when given.

After its agent's updates of a step (and after a checkpoint is restored), before the next rollout, the trainer
calls `RolloutEngine.sync`: an engine that holds its own copy of the weights (vLLM) must load the new ones
there. `TransformersEngine` samples with the trained model object itself, so it has nothing to do.

`TransformersEngine` is the built-in engine; `workbench.agents.generation.vllm_engine.VLLMEngine` samples with
vLLM in its own environment (``train.engine: vllm``).
transformers' continuous-batching ``generate_batch`` (transformers 5.24) is not wrapped here: it draws with
``torch.multinomial`` from the global generator in an order its scheduler picks, so its samples cannot equal
`generate`'s seeded per-row inverse-CDF draws (what the compiled decode is tested against).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from workbench.agents.forward.agent import Agent
from workbench.agents.generation.rollout import generate
from workbench.core.types import Rollout

__all__ = ["RolloutEngine", "TransformersEngine", "check_rollouts"]


class RolloutEngine(Protocol):
    """A sampling backend for one agent (see the module docstring for the contract)."""

    def generate(
        self,
        prompts: list[str],
        n: int,
        *,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        author: int,
        seed: int | None,
    ) -> list[Rollout]:
        """``n`` responses per prompt, prompt-major, with text and the agent's token ids."""
        ...

    def sync(self) -> None:
        """Take up the agent's current weights (called after its updates, before its next rollout)."""
        ...


@dataclass
class TransformersEngine:
    """The built-in engine: `workbench.agents.generation.rollout.generate` on the trained model itself (KV
    cache)."""

    agent: Agent
    compile_decode: bool = False
    """Decode under ``torch.compile`` over a static KV cache
    (`workbench.agents.generation.rollout.generate`)."""
    memory_budget: int | None = None
    """Bytes a batch may use (the trainer's memory plan, `workbench.train.plan`); None = the agent alone."""

    def generate(
        self,
        prompts: list[str],
        n: int,
        *,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        author: int,
        seed: int | None,
    ) -> list[Rollout]:
        """See `RolloutEngine.generate`."""
        return generate(
            self.agent,
            prompts,
            n=n,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            author=author,
            seed=seed,
            memory_budget=self.memory_budget,
            compile_decode=self.compile_decode,
        )

    def sync(self) -> None:
        """Nothing to do: the engine samples with the model object the optimizer updates."""


def check_rollouts(
    agent: Agent, prompts: list[str], n: int, rollouts: list[Rollout], *, author: int, max_new_tokens: int
) -> None:
    """Raises ``ValueError`` naming the first rollout that breaks the engine contract (module docstring).

    Cheap (no model call): counts, order, prompt ids, stop tokens and lengths.
    """
    if len(rollouts) != len(prompts) * n:
        raise ValueError(f"engine returned {len(rollouts)} rollouts for {len(prompts)} prompts x n={n}")
    encoded: dict[int, list[int]] = {}
    stops = set(agent.stop_token_ids)
    for pos, r in enumerate(rollouts):
        where = f"agent {agent.name!r}, rollout {pos}"
        if (r.prompt_index, r.index, r.author) != (pos // n, pos % n, author):
            raise ValueError(
                f"{where}: (prompt_index, index, author) = {(r.prompt_index, r.index, r.author)}, expected "
                f"{(pos // n, pos % n, author)} (prompt-major order)"
            )
        if r.prompt_index not in encoded:
            encoded[r.prompt_index] = agent.encode_prompt(prompts[r.prompt_index])
        if list(r.prompt_ids) != encoded[r.prompt_index] or r.prompt != prompts[r.prompt_index]:
            raise ValueError(f"{where}: prompt or prompt_ids are not agent.encode_prompt(prompt)")
        ends_with_stop = bool(r.response_ids) and r.response_ids[-1] in stops
        if r.finish_reason not in ("eos", "stop", "length") or (r.finish_reason == "eos") != ends_with_stop:
            raise ValueError(
                f"{where}: finish_reason {r.finish_reason!r} does not match the last token "
                f"({'a' if ends_with_stop else 'no'} stop token)"
            )
        if len(r.response_ids) > max_new_tokens:
            raise ValueError(
                f"{where}: {len(r.response_ids)} response tokens > max_new_tokens={max_new_tokens}"
            )
