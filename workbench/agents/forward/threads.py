"""One torch thread for small work on CPU, where waking a second thread costs more than it saves.

torch runs each operator on all its intra-op (OpenMP) threads, however small the operator. Under
``OMP_WAIT_POLICY=PASSIVE`` (the workbench's default: spinning threads make runs many times slower next to any
other busy process on a 2-core machine) an idle thread sleeps, and every parallel operator pays to wake it.
For the tiny agents' operators (d = 128) that wake-up costs more than the second core gives back: measured on
2 cores, a decode step of 64 rows runs 21-28% faster on one thread, and a forward and backward pass of a
micro-batch of 300-500 response tokens 40% faster; from ≈ 1,400 response tokens on, two threads win.

`threads_for` runs a block on one thread when its work is below `SERIAL_WORK`, measured as tokens per forward
pass times the model's parameters, and on the caller's threads otherwise: SmolLM2-135M decodes 64 rows ≈ 12%
faster on two threads. On the tiny agents one thread and two give the same samples and log-probs; weight
gradients differ in rounding (a matrix product's sum over tokens splits differently), and so may a larger
model's samples.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from workbench.agents.forward.agent import Agent
    from workbench.agents.forward.tokens import TokenBatch

__all__ = ["SERIAL_WORK", "serial_work", "threads_for", "threads_for_pass"]

SERIAL_WORK = 600_000_000
"""Below this much work (tokens per forward pass × parameters) a block runs on one CPU thread: the crossover
of the tiny agents' (0.45M parameters) forward and backward passes on 2 cores, ≈ 1,400 response tokens."""

_PARAMETERS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
"""Parameter count per model object, counted once."""


def serial_work(agent: Agent, tokens: int) -> bool:
    """Whether a block of ``tokens`` tokens per forward pass of ``agent`` runs on one thread (CPU only)."""
    if agent.device.type != "cpu":
        return False
    if agent.model not in _PARAMETERS:
        _PARAMETERS[agent.model] = sum(p.numel() for p in agent.model.parameters())
    return tokens * _PARAMETERS[agent.model] < SERIAL_WORK


@contextlib.contextmanager
def threads_for(agent: Agent, tokens: int) -> Iterator[None]:
    """torch's intra-op threads set to 1 inside the block when `serial_work` holds, restored after."""
    previous = torch.get_num_threads()
    if previous == 1 or not serial_work(agent, tokens):
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def threads_for_pass(agent: Agent, view: TokenBatch) -> contextlib.AbstractContextManager[None]:
    """`threads_for` a forward pass over ``view``, its response tokens the measure of its work."""
    return threads_for(agent, int(view.response_mask_B_T.sum()))
