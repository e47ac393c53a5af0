"""Task sources and prompt construction.

One interface for every source: a list of `workbench.types.TaskItem` (``id``, ``question``, ``answer``,
optional ``solution``, ``source``), obtained through `load_tasks`:

| source name | what it is |
|---|---|
| ``"embedded"`` | seeded multi-step integer arithmetic (`embedded_task`), the default; needs nothing |
| ``"gym:<generator>"`` | a reasoning-gym generator: ``gym:gsm_symbolic``, ``gym:basic_arithmetic``, ... |
| ``"file:<path>"`` | a local JSONL / JSON / parquet file, layout auto-detected (`workbench.loaders`) |
| ``"math"``, ``"math500"``, ``"gsm8k"``, ``"aime2025"``, | the paper's training set and benchmarks (§6): |
| ``"amc23"``, ``"minerva"``, ``"olympiadbench"`` | a local file, or ``datasets`` + a reachable hub |

Prompts are the question followed by the paper's instruction (`build_prompt`); applying a chat template is
the agent's job (``agent.format_prompt``).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from workbench.types import TaskItem

PAPER_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
"""The instruction appended to every question in the paper (spec §6)."""

EMBEDDED_OPS = "+-*"
"""Operators of the embedded task: all keep integer operands integer."""

TEST_FRACTION_PERCENT = 20
"""Share of the embedded (and gym) problem space, by stable hash of the question, that is held out."""

_SPLITS = ("train", "test")


def build_prompt(question: str, instruction: str | None = PAPER_INSTRUCTION) -> str:
    """Builds the user content of a prompt: the question, then the instruction.

    Args:
        question: The problem text.
        instruction: Appended after a space; ``None`` or ``""`` gives the question alone (tiny char-level
            agents use this on the embedded task).

    Returns:
        The user content, not yet formatted with any chat template.
    """
    if not instruction:
        return question
    return f"{question} {instruction}"


def split_of(text: str) -> str:
    """Assigns a problem to ``"train"`` or ``"test"`` by a stable hash of its canonical text.

    The same text always lands in the same split, so train and held-out sets can never share an item,
    whatever the seed or size asked for.
    """
    digest = hashlib.sha1(text.strip().encode("utf-8")).digest()
    return "test" if int.from_bytes(digest[:4], "big") % 100 < TEST_FRACTION_PERCENT else "train"


def _check_split(split: str) -> None:
    if split not in _SPLITS:
        raise ValueError(f"split={split!r} is not valid; expected one of {list(_SPLITS)}")


def _random_expression(rng: random.Random, n_ops: int, max_operand: int, ops: str) -> str:
    operands = [str(rng.randint(1, max_operand)) for _ in range(n_ops + 1)]
    operators = [rng.choice(ops) for _ in range(n_ops)]
    parts = [operands[0]]
    for op, operand in zip(operators, operands[1:]):
        parts += [op, operand]
    return "".join(parts)


def _tokenize(expression: str) -> list[str]:
    """Splits ``"3+4*-2"``-free expressions (no unary minus) into numbers and operators."""
    tokens: list[str] = []
    number = ""
    for ch in expression:
        if ch.isdigit():
            number += ch
        else:
            tokens += [number, ch]
            number = ""
    return [*tokens, number]


def solve_steps(expression: str) -> tuple[list[str], int]:
    """Evaluates ``+ - *`` with usual precedence, one operation at a time.

    Multiplications go first, left to right; then additions and subtractions, left to right.

    Args:
        expression: Operands and operators without spaces or parentheses, e.g. ``"3+4*2"``.

    Returns:
        The steps (``["4*2=8", "3+8=11"]``) and the integer value.
    """
    tokens: list[Any] = _tokenize(expression)
    values = [int(t) for t in tokens[0::2]]
    operators = list(tokens[1::2])
    steps = []
    while operators:
        i = operators.index("*") if "*" in operators else 0
        a, b, op = values[i], values[i + 1], operators[i]
        result = a * b if op == "*" else a + b if op == "+" else a - b
        steps.append(f"{a}{op}{b}={result}")
        values[i : i + 2] = [result]
        del operators[i]
    return steps, values[0]


def embedded_solution(expression: str) -> tuple[str, int]:
    """Returns the short worked solution of an expression and its value.

    ``"3+4*2"`` gives ``"4*2=8, 3+8=11. \\boxed{11}"``: short enough for a character-level model to learn.
    """
    steps, value = solve_steps(expression)
    return f"{', '.join(steps)}. \\boxed{{{value}}}", value


def embedded_task(
    split: str = "train",
    n: int = 1000,
    *,
    seed: int = 0,
    n_ops: tuple[int, int] = (1, 3),
    max_operand: int = 9,
) -> list[TaskItem]:
    """Generates distinct multi-step integer arithmetic problems with worked solutions.

    A question is an expression such as ``"3+4*2"``; its solution shows one operation per step and ends in
    ``\\boxed{answer}``. Which split an expression belongs to is decided by a stable hash of its text
    (`split_of`), so train and test never share an item. Items are distinct within a list, and the list for a
    smaller ``n`` is a prefix of the list for a larger one (same split, seed and knobs).

    Args:
        split: ``"train"`` or ``"test"`` (about `TEST_FRACTION_PERCENT` % of the expression space).
        n: Number of items.
        seed: Random seed.
        n_ops: Inclusive range of the number of operations, drawn uniformly per item.
        max_operand: Operands are drawn uniformly from ``1..max_operand``.

    Returns:
        ``n`` items with ids ``"embedded-<split>-<i>"``, integer answers and ``source="embedded"``.

    Raises:
        ValueError: On a bad knob, or when the split holds fewer than ``n`` distinct expressions.
    """
    _check_split(split)
    lo, hi = n_ops
    if not (1 <= lo <= hi):
        raise ValueError(f"n_ops={n_ops!r} must be a range (lo, hi) with 1 <= lo <= hi")
    if max_operand < 1:
        raise ValueError(f"max_operand={max_operand!r} must be >= 1")
    if n < 0:
        raise ValueError(f"n={n!r} must be >= 0")
    space = sum(max_operand ** (k + 1) * len(EMBEDDED_OPS) ** k for k in range(lo, hi + 1))
    rng = random.Random(f"embedded/{seed}/{split}")
    seen: set[str] = set()
    items: list[TaskItem] = []
    attempts, max_attempts = 0, 200 * n + 10_000
    while len(items) < n:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(
                f"embedded_task: only {len(items)} distinct {split} problems found for n_ops={n_ops}, "
                f"max_operand={max_operand} (about {space} expressions in all, ~{TEST_FRACTION_PERCENT}% "
                f"of them test); ask for fewer than n={n} or widen n_ops / max_operand"
            )
        expression = _random_expression(rng, rng.randint(lo, hi), max_operand, EMBEDDED_OPS)
        if expression in seen or split_of(expression) != split:
            continue
        seen.add(expression)
        solution, value = embedded_solution(expression)
        items.append(
            TaskItem(
                id=f"embedded-{split}-{len(items)}",
                question=expression,
                answer=str(value),
                solution=solution,
                source="embedded",
            )
        )
    return items


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
            `workbench.loaders.BENCHMARKS` (``"math"``, ``"math500"``, ``"gsm8k"``, ``"aime2025"``,
            ``"amc23"``, ``"minerva"``, ``"olympiadbench"``).
        split: ``"train"`` or ``"test"`` for sources that have both (embedded, gym, math, gsm8k); the
            evaluation-only benchmarks have one split and ignore it.
        n: Number of items; ``None`` gives 1000 for generators and the whole file for data sets. For data
            sets a smaller ``n`` takes a seeded random subset, kept in file order.
        seed: Generator seed, or the subset seed for data sets.
        **knobs: Passed on: `embedded_task` knobs (``n_ops``, ``max_operand``), reasoning-gym options, or
            ``path=`` (a local file for a benchmark) for data sets.

    Returns:
        The items.

    Raises:
        ValueError: Unknown source name (listing the valid ones), bad knob, malformed file.
        FileNotFoundError: A benchmark with no local file and no reachable hub (naming where it looked).
    """
    from workbench import loaders  # file reading and the hub fallback live there

    if source == "embedded":
        return embedded_task(split, 1000 if n is None else n, seed=seed, **knobs)
    if source.startswith("gym:"):
        return gym_task(source[len("gym:") :], split, 1000 if n is None else n, seed=seed, **knobs)
    if source.startswith("file:"):
        _check_knobs(source, knobs, {"name"})
        items = loaders.read_items(source[len("file:") :], source=knobs.get("name"))
        return loaders.subset(items, n, seed)
    if source in loaders.BENCHMARKS:
        _check_knobs(source, knobs, {"path"})
        return loaders.subset(loaders.load_benchmark(source, split=split, path=knobs.get("path")), n, seed)
    valid = ["embedded", "gym:<generator>", "file:<path>", *loaders.BENCHMARKS]
    raise ValueError(f"unknown task source {source!r}; valid sources: {valid}")
