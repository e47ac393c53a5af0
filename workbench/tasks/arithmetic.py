"""The embedded task: seeded multi-step integer arithmetic with short worked solutions (no download)."""

from __future__ import annotations

import random
from typing import Any

from workbench.core.types import TaskItem
from workbench.tasks.prompts import TEST_FRACTION_PERCENT, _check_split, split_of

EMBEDDED_OPS = "+-*"
"""Operators of the embedded task: all keep integer operands integer."""


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
