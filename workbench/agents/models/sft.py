"""Supervised warm starts on worked solutions, and the greedy accuracy a warm start is judged by.

One loop serves the tiny zoo (every weight trained) and the real models' LoRA warm starts (adapters only):
`supervised_steps` trains on ``(prompt ids, response ids)`` pairs with the loss on response tokens only, and
`greedy_accuracy` measures a model on held-out embedded problems exactly as rollouts will prompt it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from workbench.agents.forward.tokens import pack
from workbench.agents.generation.rollout import generate
from workbench.tasks.arithmetic import embedded_task
from workbench.tasks.prompts import build_prompt
from workbench.tasks.rewards import grade_batch

__all__ = ["WARMUP_STEPS", "greedy_accuracy", "lr_at", "solution_pairs", "supervised_steps"]

WARMUP_STEPS = 20
"""Linear learning-rate warm-up of every warm start, in steps (then constant)."""


def lr_at(step: int, lr: float) -> float:
    """Linear warm-up over `WARMUP_STEPS` steps, then constant: a warm start stops mid-curve, not annealed.

    The schedule does not depend on the total step count, so a shorter warm start is an exact prefix of a
    longer one with the same seed (``gpt2-char-early`` is a snapshot of ``gpt2-char``'s own trajectory).
    """
    return lr * min(1.0, (step + 1) / WARMUP_STEPS)


def solution_pairs(
    agent: Any, items: list[Any], instruction: str | None
) -> list[tuple[list[int], list[int]]]:
    """``(prompt ids, solution ids + EOS)`` of each item in the agent's own prompt format and tokenization."""
    return [
        (
            agent.encode_prompt(build_prompt(item.question, instruction)),
            [*agent.tokenizer.encode(item.solution, add_special_tokens=False), agent.eos_token_id],
        )
        for item in items
    ]


def supervised_steps(
    agent: Any,
    pairs: list[tuple[list[int], list[int]]],
    steps: int,
    *,
    lr: float,
    batch_size: int,
    betas: tuple[float, float] = (0.9, 0.98),
    weight_decay: float = 0.01,
    callback: Callable[[int, Any], None] | None = None,
    callback_every: int = 0,
) -> float:
    """``steps`` AdamW steps on consecutive batches of ``pairs``; loss on response tokens only.

    Trains `Agent.trainable_parameters` (the adapters of a LoRA agent, else every weight). Logits are
    computed only from the first response column on (a 262k-token vocabulary times every prompt position
    would dominate). ``callback(step, agent)`` is called every ``callback_every`` steps (calibration curves).

    Returns:
        The last step's loss (NaN for 0 steps).
    """
    params = agent.trainable_parameters()
    optimizer = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        batch = pack(pairs[step * batch_size : (step + 1) * batch_size], agent.pad_token_id)
        ids_B_T, response_B_T = batch.input_ids_B_T.to(agent.device), batch.response_mask_B_T.to(agent.device)
        keep = ids_B_T.shape[1] - int(response_B_T.any(dim=0).nonzero()[0]) + 1
        # An all-ones mask is exact here (right padding + causal attention: no real token sees a pad, and pads
        # carry no loss) and lets the fused causal attention path run (~10% faster on CPU).
        logits_B_K_V = agent.model(
            input_ids=ids_B_T, attention_mask=torch.ones_like(ids_B_T), logits_to_keep=keep
        ).logits[:, :-1]
        targets_B_K, mask_B_K = ids_B_T[:, -keep + 1 :], response_B_T[:, -keep + 1 :].bool()
        loss = torch.nn.functional.cross_entropy(logits_B_K_V[mask_B_K].float(), targets_B_K[mask_B_K])
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, lr)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if callback is not None and callback_every and (step + 1) % callback_every == 0:
            callback(step + 1, agent)
    return float(loss.detach())


def greedy_accuracy(
    agent: Any,
    n: int = 1000,
    *,
    seed: int = 0,
    instruction: str | None = None,
    knobs: Mapping[str, Any] | None = None,
) -> float:
    """Greedy accuracy on the first ``n`` held-out embedded problems (math-verify grading).

    Args:
        agent: The model, prompted in its own format.
        n: Held-out items (the draw for a smaller n is a prefix of the draw for a larger one).
        seed: Seed of the held-out draw.
        instruction: Appended to each question (`build_prompt`); None = the bare question.
        knobs: Embedded-task knobs (``regime`` and overrides); None = the default regime.
    """
    items = embedded_task("test", n, seed=seed, **dict(knobs or {}))
    prompts = [build_prompt(item.question, instruction) for item in items]
    rollouts = generate(agent, prompts, n=1, temperature=0.0)
    grades = grade_batch([r.text for r in rollouts], [item.answer for item in items])
    return sum(g.reward for g in grades) / len(grades)
