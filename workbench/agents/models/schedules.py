"""Learning-rate schedules: transformers' ``get_scheduler`` over a run's training steps.

``train.lr_schedule`` (``constant``, ``linear``, ``cosine``) with ``train.warmup_steps`` / ``warmup_ratio``
becomes one of transformers' schedulers (``constant`` with a warm-up is its ``constant_with_warmup``). The
trainer steps it once per training step, after the step's updates, so every mini-batch of a step uses one
rate; its ``state_dict`` is saved in every checkpoint, so a resumed run continues the schedule where it
stopped. A constant schedule without warm-up multiplies the rate by 1: the optimizer sees exactly the
configured float.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["SCHEDULER_NAMES", "lr_scheduler"]

SCHEDULER_NAMES = {"constant": "constant", "linear": "linear", "cosine": "cosine"}
"""``train.lr_schedule`` -> transformers' ``SchedulerType`` name (without warm-up)."""


def lr_scheduler(optimizer: torch.optim.Optimizer, schedule: str, *, warmup: int, steps: int) -> Any:
    """transformers' scheduler of ``schedule`` for ``optimizer`` over ``steps`` training steps.

    Args:
        optimizer: The agent's optimizer (its ``lr`` is the peak rate).
        schedule: A key of `SCHEDULER_NAMES`.
        warmup: Steps of linear warm-up from 0.
        steps: The run's training steps (``train.steps``).

    Raises:
        ValueError: An unknown schedule.
    """
    from transformers import get_scheduler

    if schedule not in SCHEDULER_NAMES:
        raise ValueError(f"lr_schedule = {schedule!r} is not allowed: one of {list(SCHEDULER_NAMES)}")
    name = "constant_with_warmup" if schedule == "constant" and warmup else SCHEDULER_NAMES[schedule]
    return get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=steps)
