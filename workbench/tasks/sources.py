"""Task sources: one `load_tasks` for generated problems, local files and the paper's benchmarks.

One interface for every source: a list of `workbench.core.types.TaskItem` (``id``, ``question``, ``answer``,
optional ``solution``, ``source``), obtained through `load_tasks`:

| source name | what it is |
|---|---|
| ``"embedded"`` | seeded multi-step integer arithmetic in named regimes (`embedded_task`), the default |
| ``"gym:<generator>"`` | a reasoning-gym generator: ``gym:gsm_symbolic``, ``gym:basic_arithmetic``, ... |
| ``"file:<path>"`` | a local JSONL / JSON / parquet file, layout auto-detected (`workbench.tasks.loaders`), |
| | split into disjoint train / test parts by a stable hash of each question (`split_file_items`) |
| ``"math"``, ``"math500"``, ``"gsm8k"``, ``"aime2025"``, | the paper's training set and benchmarks: |
| ``"amc23"``, ``"minerva"``, ``"olympiadbench"`` | a local file, or ``datasets`` + a reachable hub |

Prompts are the question followed by the paper's instruction (`build_prompt`); applying a chat template is
the agent's job (``agent.format_prompt``).

A file asked for by split never leaks: its ``train`` and ``test`` parts are disjoint by question (20 % of the
questions, by hash, are held out), so a ``file:`` task without ``eval_source`` evaluates on questions it never
trained on. To train on a whole file and evaluate on another, give both ``holdout: none`` (``knobs`` and
``eval_knobs``); `check_disjoint` then refuses held-out questions that also appear in training.
"""

from __future__ import annotations

from typing import Any

from workbench.core.types import TaskItem
from workbench.tasks.arithmetic import embedded_task
from workbench.tasks.loaders import BENCHMARKS, load_benchmark, read_items, subset
from workbench.tasks.prompts import TEST_FRACTION_PERCENT, _check_split, split_of

__all__ = [
    "EMBEDDED_KNOBS",
    "FILE_KNOBS",
    "HOLDOUT_MODES",
    "check_disjoint",
    "knobs_of",
    "load_tasks",
    "split_file_items",
]


EMBEDDED_KNOBS = frozenset({"regime", "ops", "n_ops", "min_operand", "max_operand", "allow_negative"})
"""Knobs of ``source: embedded`` (`workbench.tasks.arithmetic.embedded_task`)."""
FILE_KNOBS = frozenset({"name", "holdout"})
"""Knobs of ``file:<path>``: ``name`` (recorded as each item's source), ``holdout`` (`HOLDOUT_MODES`)."""
BENCHMARK_KNOBS = frozenset({"path"})
"""Knobs of a benchmark name: ``path`` (a local file instead of ``$HACPO_DATA_DIR``)."""
HOLDOUT_MODES = {
    "hash": f"train and test are disjoint parts of the file ({TEST_FRACTION_PERCENT}% of questions held out)",
    "none": "every split is the whole file (a file used only for training, or only for evaluation)",
}
"""How a ``file:`` source is split (its ``holdout`` knob; default ``hash``)."""


def knobs_of(source: str) -> frozenset[str] | None:
    """The knobs ``source`` accepts, or None when they cannot be listed (reasoning-gym generators take their
    generator's own options)."""
    if source == "embedded":
        return EMBEDDED_KNOBS
    if source.startswith("file:"):
        return FILE_KNOBS
    if source in BENCHMARKS:
        return BENCHMARK_KNOBS
    return None


def _check_knobs(source: str, knobs: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(knobs) - allowed)
    if unknown:
        raise ValueError(f"{source}: unknown option(s) {unknown}; accepted: {sorted(allowed)}")


def split_file_items(items: list[TaskItem], split: str, where: str) -> list[TaskItem]:
    """The ``split`` part of a file's items, by a stable hash of each question (`split_of`).

    Raises:
        ValueError: ``split`` is not train/test, or its part is empty (the file is too small to hold out).
    """
    if split not in ("train", "test"):
        raise ValueError(f"{where}: split = {split!r} is not allowed: 'train' or 'test'")
    part = [item for item in items if split_of(item.question) == split]
    if not part:
        raise ValueError(
            f"{where}: none of its {len(items)} questions falls in the {split!r} part of the hash split "
            f"({TEST_FRACTION_PERCENT}% held out); add items, or give a separate held-out source "
            "(task.eval_source) and set holdout: none in knobs and eval_knobs"
        )
    return part


def check_disjoint(train: list[TaskItem], held_out: list[TaskItem], where: str) -> None:
    """Refuse held-out items whose question is also a training question.

    Raises:
        ValueError: Naming how many questions are shared and one of them.
    """
    seen = {item.question.strip() for item in train}
    shared = [item for item in held_out if item.question.strip() in seen]
    if shared:
        raise ValueError(
            f"{where}: {len(shared)} of {len(held_out)} held-out questions are also training questions "
            f"(e.g. {shared[0].question[:80]!r}); held-out items must be unseen: use a disjoint file, or "
            "drop task.eval_source to hold out part of task.source by hash"
        )


def load_tasks(
    source: str, *, split: str | None = None, n: int | None = None, seed: int = 0, **knobs: Any
) -> list[TaskItem]:
    """Loads task items from any source by name.

    Args:
        source: ``"embedded"``, ``"gym:<generator>"``, ``"file:<path>"``, or a benchmark name from
            `workbench.BENCHMARKS` (``"math"``, ``"math500"``, ``"gsm8k"``, ``"aime2025"``,
            ``"amc23"``, ``"minerva"``, ``"olympiadbench"``).
        split: ``"train"`` or ``"test"`` for sources that have both (embedded, gym, math, gsm8k, and
            ``file:`` sources by hash unless ``holdout: none``); the evaluation-only benchmarks have one
            split and ignore it. None: ``"train"``, and a ``file:`` source's whole file.
        n: Number of items; ``None`` gives 1000 for generators and the whole file for data sets. For data
            sets a smaller ``n`` takes a seeded random subset, kept in file order.
        seed: Generator seed, or the subset seed for data sets.
        **knobs: Passed on: `embedded_task` knobs (``regime`` and its fields), reasoning-gym options,
            ``path=`` (a local file for a benchmark), or ``name=`` / ``holdout=`` for ``file:`` sources.

    Returns:
        The items.

    Raises:
        ValueError: Unknown source name (listing the valid ones), bad knob, malformed file.
        FileNotFoundError: A benchmark with no local file and no reachable hub (naming where it looked).
    """
    if source == "embedded":
        _check_knobs(source, knobs, EMBEDDED_KNOBS)
        return embedded_task(split or "train", 1000 if n is None else n, seed=seed, **knobs)
    if source.startswith("gym:"):
        return _gym(source[len("gym:") :], split or "train", 1000 if n is None else n, seed, knobs)
    if source.startswith("file:"):
        _check_knobs(source, knobs, set(FILE_KNOBS))
        holdout = knobs.get("holdout", "hash")
        if holdout not in HOLDOUT_MODES:
            modes = "; ".join(f"{k!r}: {v}" for k, v in HOLDOUT_MODES.items())
            raise ValueError(f"{source}: holdout = {holdout!r} is not allowed: {modes}")
        items = read_items(source[len("file:") :], source=knobs.get("name"))
        if split is not None and holdout == "hash":
            items = split_file_items(items, split, source)
        return subset(items, n, seed)
    if source in BENCHMARKS:
        _check_knobs(source, knobs, set(BENCHMARK_KNOBS))
        return subset(load_benchmark(source, split=split or "train", path=knobs.get("path")), n, seed)
    valid = ["embedded", "gym:<generator>", "file:<path>", *BENCHMARKS]
    raise ValueError(f"unknown task source {source!r}; valid sources: {valid}")


def _gym(name: str, split: str, n: int, seed: int, options: dict[str, Any]) -> list[TaskItem]:
    """`gym_task`, with a generator's refusal of an option turned into a message that names it."""
    try:
        return gym_task(name, split, n, seed=seed, **options)
    except (TypeError, AssertionError, KeyError) as exc:  # reasoning-gym's own checks of its options
        raise ValueError(
            f"the generator refused these options ({type(exc).__name__}: {exc}); see reasoning_gym's "
            f"{name} config class for the accepted ones"
        ) from None


# reasoning-gym generators as a task source, offline, with the same hash split as the embedded task.


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
