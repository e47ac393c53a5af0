"""A run's problems: the training items, the step's prompt batch, and the held-out sets it is evaluated on.

`TaskData.load` draws everything a config names before any model loads: ``task.train_size`` training items
(the step batches cycle through them in seeded permutations, one per epoch, so a resumed run sees the same
batches) and the held-out sets (`held_out_sets`: the main one, then one per ``task.eval_sources`` entry).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from workbench.config.experiment import ExperimentConfig
from workbench.core.types import TaskItem
from workbench.tasks.prompts import build_prompt
from workbench.tasks.sources import load_tasks

__all__ = ["HeldOutSet", "TaskData", "held_out_sets", "source_key"]


@dataclass
class TaskData:
    """The training items and held-out sets of a run (`load`), and its prompt batches (`prompt_batch`)."""

    train_items: list[TaskItem]
    """The training problems, in the order drawn."""
    held_out: list[HeldOutSet]
    """The held-out sets (none when ``task.eval_size`` is 0)."""
    seed: int
    """Seeds each epoch's permutation of the training items."""
    prompts_per_step: int
    """P, prompts per step."""
    _orders: dict[int, list[int]] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, cfg: ExperimentConfig) -> TaskData:
        """Draw the training items and held-out sets of ``cfg``."""
        task = cfg.task
        items = load_tasks(task.source, split="train", n=task.train_size, seed=cfg.seed, **task.knobs)
        return cls(items, held_out_sets(cfg), cfg.seed, cfg.train.prompts_per_step)

    def prompt_batch(self, step: int) -> list[TaskItem]:
        """Prompts of ``step`` (from 1): epochs of seeded permutations, so a resumed run sees the same
        batches."""
        n, size = len(self.train_items), self.prompts_per_step
        start = (step - 1) * size
        return [self.train_items[self._epoch_order(pos // n)[pos % n]] for pos in range(start, start + size)]

    def sample_prompts(self, instruction: str | None, n: int = 64) -> list[str]:
        """The first ``n`` training prompts as the agents see them (what the memory plan measures)."""
        return [build_prompt(item.question, instruction) for item in self.train_items[:n]]

    def _epoch_order(self, epoch: int) -> list[int]:
        """The seeded permutation of the training items for one epoch (the last two are kept)."""
        if epoch not in self._orders:
            order = list(range(len(self.train_items)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {e: o for e, o in self._orders.items() if e == epoch - 1} | {epoch: order}
        return self._orders[epoch]


@dataclass(frozen=True)
class HeldOutSet:
    """One held-out set the trainer evaluates (see `held_out_sets`)."""

    benchmark: str
    """The task source, as written in the config: the ``benchmark`` column of ``evals.csv``."""
    items: list[TaskItem]
    """Its ``test`` split: ``task.eval_size`` items."""
    prefix: str
    """Metric keys start with it: ``eval`` for the main set, ``eval/<source_key>`` for each further one."""


_NOT_IN_KEYS = re.compile(r"[^A-Za-z0-9_.+-]+")


def source_key(source: str) -> str:
    """A task source as one metric-key segment: a file's stem (``file:data/my_set.jsonl`` → ``my_set``),
    else the name with each run of characters other than letters, digits and ``_.+-`` made ``_``
    (``gym:basic_arithmetic`` → ``gym_basic_arithmetic``)."""
    name = PurePosixPath(source[len("file:") :]).stem if source.startswith("file:") else source
    return _NOT_IN_KEYS.sub("_", name).strip("_") or "source"


def held_out_sets(cfg: ExperimentConfig) -> list[HeldOutSet]:
    """The held-out sets of a run: the main one (``task.eval_source``, else the training source's ``test``
    split), then one per ``task.eval_sources`` entry; each ``task.eval_size`` items drawn with
    ``task.eval_seed`` (None: the run's seed). None when ``task.eval_size`` is 0.

    Sources are resolved as the pre-flight checks them (`TaskConfig.held_out_sources`).
    Two further sources with the same `source_key`, or one named ``acc`` (the main set's key family), get a
    ``_2``, ``_3`` ... suffix, so no two sets share a metric key.
    """
    task = cfg.task
    if not task.eval_size:
        return []
    seed = cfg.seed if task.eval_seed is None else task.eval_seed
    sets, used = [], {"acc"}
    for i, (_, source, knobs) in enumerate(task.held_out_sources()):
        items = load_tasks(source, split="test", n=task.eval_size, seed=seed, **knobs)
        if i == 0:
            sets.append(HeldOutSet(source, items, "eval"))
            continue
        key = base = source_key(source)
        n = 1
        while key in used:
            n += 1
            key = f"{base}_{n}"
        used.add(key)
        sets.append(HeldOutSet(source, items, f"eval/{key}"))
    return sets
