"""reasoning-gym generators as a task source, offline, with the same hash split as the embedded task."""

from __future__ import annotations

from typing import Any

from workbench.core.types import TaskItem
from workbench.tasks.prompts import TEST_FRACTION_PERCENT, _check_split, split_of


def _boxed_cot(cot: str | None, answer: str) -> str | None:
    """Turns a GSM8K-style worked solution ending in ``#### x`` into one ending in ``\\boxed{x}``."""
    if not cot:
        return None
    head, sep, _ = cot.rpartition("####")
    return f"{head.rstrip()}\n\\boxed{{{answer}}}" if sep else f"{cot.rstrip()}\n\\boxed{{{answer}}}"


def gym_task(
    name: str, split: str = "train", n: int = 1000, *, seed: int = 0, **config: Any
) -> list[TaskItem]:
    """Generates problems offline with a reasoning-gym generator.

    reasoning-gym has no splits, so, as for the embedded task, a stable hash of each question decides its
    split (`split_of`) and duplicates are dropped: train and test never share a question.

    Args:
        name: A reasoning-gym dataset name (``"gsm_symbolic"``, ``"basic_arithmetic"``, ...).
        split: ``"train"`` or ``"test"``.
        n: Number of items.
        seed: Seed passed to ``reasoning_gym.create_dataset``.
        **config: Further generator options passed through (``min_terms=2``, ...).

    Returns:
        ``n`` items with ids ``"gym:<name>-<split>-<i>"`` and ``source="gym:<name>"``.

    Raises:
        ValueError: Unknown generator name (listing the valid ones), or too few distinct questions.
        ImportError: reasoning-gym is not installed.
    """
    _check_split(split)
    import reasoning_gym  # lazy: importing it costs ~1 s
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        raise ValueError(f"unknown reasoning-gym generator {name!r}; valid names: {sorted(DATASETS)}")
    items: list[TaskItem] = []
    seen: set[str] = set()
    size = max(16, int(n / (TEST_FRACTION_PERCENT / 100 if split == "test" else 0.75)) + 16)
    for _ in range(4):  # the generator's own duplicates can leave us short: retry with a bigger draw
        items, seen = [], set()
        for entry in reasoning_gym.create_dataset(name, size=size, seed=seed, **config):
            question, answer = str(entry["question"]), str(entry["answer"])
            if question in seen or split_of(question) != split:
                continue
            seen.add(question)
            cot = entry.get("metadata", {}).get("answer_cot")
            items.append(
                TaskItem(
                    id=f"gym:{name}-{split}-{len(items)}",
                    question=question,
                    answer=answer,
                    solution=_boxed_cot(cot, answer),
                    source=f"gym:{name}",
                )
            )
            if len(items) == n:
                return items
        size *= 2
    raise ValueError(
        f"gym:{name}: only {len(items)} distinct {split} questions in {size // 2} draws; ask n < {n}"
    )
