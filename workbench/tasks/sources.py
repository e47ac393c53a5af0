"""Task sources: one `load_tasks` for generated problems, local files and the paper's benchmarks.

One interface for every source: a list of `workbench.core.types.TaskItem` (``id``, ``question``, ``answer``,
optional ``solution``, ``source``), obtained through `load_tasks`:

| source name | what it is |
|---|---|
| ``"embedded"`` | seeded multi-step integer arithmetic in named regimes (`embedded_task`), the default |
| ``"gym:<generator>"`` | a reasoning-gym generator: ``gym:gsm_symbolic``, ``gym:basic_arithmetic``, ... |
| ``"file:<path>"`` | a local JSONL / JSON / parquet file, layout auto-detected (`workbench.tasks.loaders`) |
| ``"math"``, ``"math500"``, ``"gsm8k"``, ``"aime2025"``, | the paper's training set and benchmarks (§6): |
| ``"amc23"``, ``"minerva"``, ``"olympiadbench"`` | a local file, or ``datasets`` + a reachable hub |

Prompts are the question followed by the paper's instruction (`build_prompt`); applying a chat template is
the agent's job (``agent.format_prompt``).
"""

from __future__ import annotations

from typing import Any

from workbench.core.types import TaskItem
from workbench.tasks.arithmetic import embedded_task
from workbench.tasks.gym import gym_task
from workbench.tasks.loaders import BENCHMARKS, load_benchmark, read_items, subset

EMBEDDED_KNOBS = frozenset({"regime", "ops", "n_ops", "min_operand", "max_operand", "allow_negative"})
"""Knobs of ``source: embedded`` (`workbench.tasks.arithmetic.embedded_task`)."""


def _check_knobs(source: str, knobs: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(knobs) - allowed)
    if unknown:
        raise ValueError(f"{source}: unknown option(s) {unknown}; accepted: {sorted(allowed)}")


def load_tasks(
    source: str, *, split: str = "train", n: int | None = None, seed: int = 0, **knobs: Any
) -> list[TaskItem]:
    """Loads task items from any source by name.

    Args:
        source: ``"embedded"``, ``"gym:<generator>"``, ``"file:<path>"``, or a benchmark name from
            `workbench.BENCHMARKS` (``"math"``, ``"math500"``, ``"gsm8k"``, ``"aime2025"``,
            ``"amc23"``, ``"minerva"``, ``"olympiadbench"``).
        split: ``"train"`` or ``"test"`` for sources that have both (embedded, gym, math, gsm8k); the
            evaluation-only benchmarks have one split and ignore it.
        n: Number of items; ``None`` gives 1000 for generators and the whole file for data sets. For data
            sets a smaller ``n`` takes a seeded random subset, kept in file order.
        seed: Generator seed, or the subset seed for data sets.
        **knobs: Passed on: `embedded_task` knobs (``regime`` and its fields), reasoning-gym options, or
            ``path=`` (a local file for a benchmark) for data sets.

    Returns:
        The items.

    Raises:
        ValueError: Unknown source name (listing the valid ones), bad knob, malformed file.
        FileNotFoundError: A benchmark with no local file and no reachable hub (naming where it looked).
    """
    if source == "embedded":
        _check_knobs(source, knobs, EMBEDDED_KNOBS)
        return embedded_task(split, 1000 if n is None else n, seed=seed, **knobs)
    if source.startswith("gym:"):
        return gym_task(source[len("gym:") :], split, 1000 if n is None else n, seed=seed, **knobs)
    if source.startswith("file:"):
        _check_knobs(source, knobs, {"name"})
        items = read_items(source[len("file:") :], source=knobs.get("name"))
        return subset(items, n, seed)
    if source in BENCHMARKS:
        _check_knobs(source, knobs, {"path"})
        return subset(load_benchmark(source, split=split, path=knobs.get("path")), n, seed)
    valid = ["embedded", "gym:<generator>", "file:<path>", *BENCHMARKS]
    raise ValueError(f"unknown task source {source!r}; valid sources: {valid}")
