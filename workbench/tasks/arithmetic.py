"""The embedded task: seeded multi-step integer arithmetic with short worked solutions (no download).

A *regime* fixes the distribution: operators, operand range, operation count, negative values allowed or
not (`ArithmeticRegime`; named presets in `REGIMES`, ``task.knobs: {regime: addsub}``; any field can be
overridden by a knob of the same name).

Train and held-out items come from the same distribution. A stable hash of the expression decides its split
(`split_of`), and both splits are sampled the same way: the operation count uniformly, then the answer from
the population's distribution of answers for that count, then an expression with that count and answer
uniformly from the split's own expressions. So the operation-count and answer distributions of the two splits
are identical by construction, not only in expectation over hash partitions (sampling expressions directly
made the 20% held-out partition of small strata visibly easier). Spaces too large to enumerate (more than
`ENUMERATION_LIMIT` expressions per operation count) are sampled directly, where the hash partition of a
large space is unbiased in practice. Items are independent draws: a small stratum (the 126 one-operation
``addsub`` expressions) repeats, as it does in the distribution itself.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import random
from dataclasses import dataclass, replace
from typing import Any

from workbench.core.types import TaskItem
from workbench.tasks.prompts import _check_split, split_of

__all__ = [
    "DEFAULT_REGIME",
    "EMBEDDED_OPS",
    "REGIMES",
    "ArithmeticRegime",
    "embedded_solution",
    "embedded_task",
    "resolve_regime",
    "solve_steps",
]

EMBEDDED_OPS = "+-*"
"""Operators the embedded task knows: all keep integer operands integer."""

ENUMERATION_LIMIT = 400_000
"""Expressions per operation count up to which the space is enumerated (and sampled by answer)."""


@dataclass(frozen=True)
class ArithmeticRegime:
    """One distribution of embedded problems (a named preset of `embedded_task`'s knobs, see `REGIMES`)."""

    ops: str = "+-"
    """Operators drawn uniformly per position, a subset of `EMBEDDED_OPS`."""
    min_operand: int = 1
    """Operands are drawn uniformly from ``min_operand..max_operand``."""
    max_operand: int = 9
    """Largest operand."""
    n_ops: tuple[int, int] = (1, 3)
    """Inclusive range of the number of operations, drawn uniformly per item."""
    allow_negative: bool = False
    """False: every step's result (intermediate and final) is >= 0."""
    description: str = ""
    """One line for listings."""


REGIMES: dict[str, ArithmeticRegime] = {
    "addsub": ArithmeticRegime(
        "+-", 1, 9, (1, 3), False,
        description="+ and - only, operands 1..9, 1-3 operations, no negative intermediate or final value "
        "(answers 0..36): the default, where RL from a 40-60% warm start has headroom",
    ),
    "addsub2": ArithmeticRegime(
        "+-", 10, 99, (1, 3), False,
        description="+ and - only, two-digit operands 10..99, 1-3 operations, no negative step "
        "(answers 0..396): the real models' task, where a 135M-270M model's carries and borrows often fail",
    ),
    "mixed": ArithmeticRegime(
        "+-*", 1, 9, (1, 3), True,
        description="+, - and * with precedence, operands 1..9, 1-3 operations, negatives allowed "
        "(answers -720..6561): harder, with a far wider answer range",
    ),
}  # fmt: skip
"""Named regimes of the embedded task (``task.knobs: {regime: addsub}``)."""

DEFAULT_REGIME = "addsub"
"""The regime of ``source: embedded`` without a ``regime`` knob (and of the tiny zoo's warm starts)."""


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


def resolve_regime(
    regime: str | ArithmeticRegime = DEFAULT_REGIME,
    *,
    ops: str | None = None,
    n_ops: tuple[int, int] | list[int] | None = None,
    min_operand: int | None = None,
    max_operand: int | None = None,
    allow_negative: bool | None = None,
) -> ArithmeticRegime:
    """A named regime (or a regime object) with any knob given explicitly overriding it, validated.

    Raises:
        ValueError: Unknown regime name (listing them) or a bad knob (naming it and what is allowed).
    """
    if isinstance(regime, str):
        if regime not in REGIMES:
            raise ValueError(f"regime = {regime!r} is not allowed: one of {sorted(REGIMES)}")
        regime = REGIMES[regime]
    given = {
        "ops": ops, "n_ops": None if n_ops is None else tuple(n_ops), "min_operand": min_operand,
        "max_operand": max_operand, "allow_negative": allow_negative,
    }  # fmt: skip
    r = replace(regime, **{key: value for key, value in given.items() if value is not None})
    if (
        not isinstance(r.ops, str)
        or not r.ops
        or len(set(r.ops)) != len(r.ops)
        or set(r.ops) - set(EMBEDDED_OPS)
    ):
        raise ValueError(f"ops = {r.ops!r} is not allowed: distinct characters of {EMBEDDED_OPS!r}")
    if len(r.n_ops) != 2 or not all(isinstance(x, int) for x in r.n_ops) or not 1 <= r.n_ops[0] <= r.n_ops[1]:
        raise ValueError(f"n_ops = {r.n_ops!r} is not allowed: a range [lo, hi] with 1 <= lo <= hi")
    if not isinstance(r.min_operand, int) or r.min_operand < 0:
        raise ValueError(f"min_operand = {r.min_operand!r} is not allowed: an integer >= 0")
    if not isinstance(r.max_operand, int) or r.max_operand < max(1, r.min_operand):
        raise ValueError(
            f"max_operand = {r.max_operand!r} is not allowed: an integer >= 1 and >= min_operand "
            f"({r.min_operand})"
        )
    if not isinstance(r.allow_negative, bool):
        raise ValueError(f"allow_negative = {r.allow_negative!r} is not allowed: true or false")
    return r


def _expression(operands: tuple[int, ...], operators: tuple[str, ...]) -> str:
    return str(operands[0]) + "".join(op + str(b) for op, b in zip(operators, operands[1:]))


def _valid_value(expression: str, allow_negative: bool) -> int | None:
    """The value of ``expression``, or None when a step goes negative and the regime forbids it."""
    steps, value = solve_steps(expression)
    if not allow_negative and any(step.rsplit("=", 1)[1].startswith("-") for step in steps):
        return None
    return value


@dataclass(frozen=True)
class _Cells:
    """The enumerated space of one operation count: answers with population weights, expressions per split."""

    answers: tuple[int, ...]
    cum_weights: tuple[int, ...]
    by_split: dict[str, dict[int, tuple[str, ...]]]


@functools.lru_cache(maxsize=32)
def _cells(regime: ArithmeticRegime, k: int) -> _Cells | None:
    """Every valid k-operation expression, grouped by answer and split; None above `ENUMERATION_LIMIT`.

    Only answers that occur in both splits are kept, so the two samplers draw answers from one distribution.

    Raises:
        ValueError: No answer occurs in both splits (a space of a handful of expressions).
    """
    n_operands = regime.max_operand - regime.min_operand + 1
    if n_operands ** (k + 1) * len(regime.ops) ** k > ENUMERATION_LIMIT:
        return None
    operand_range = range(regime.min_operand, regime.max_operand + 1)
    groups: dict[int, dict[str, list[str]]] = {}
    for operands in itertools.product(operand_range, repeat=k + 1):
        for operators in itertools.product(regime.ops, repeat=k):
            expression = _expression(operands, operators)
            value = _valid_value(expression, regime.allow_negative)
            if value is not None:
                groups.setdefault(value, {"train": [], "test": []})[split_of(expression)].append(expression)
    answers = tuple(v for v in sorted(groups) if groups[v]["train"] and groups[v]["test"])
    if not answers:
        n_valid = sum(len(g["train"]) + len(g["test"]) for g in groups.values())
        raise ValueError(
            f"embedded_task: the {n_valid} valid {k}-operation expressions of {regime} are too few to give "
            "both splits an expression with the same answer; widen the operand range or the operators"
        )
    weights = [len(groups[v]["train"]) + len(groups[v]["test"]) for v in answers]
    return _Cells(
        answers=answers,
        cum_weights=tuple(itertools.accumulate(weights)),
        by_split={s: {v: tuple(groups[v][s]) for v in answers} for s in ("train", "test")},
    )


def _draw(rng: random.Random, k: int, regime: ArithmeticRegime, split: str) -> str:
    """One k-operation expression of ``split``: by answer when the space is enumerable, else directly."""
    cells = _cells(regime, k)
    if cells is not None:
        value = cells.answers[bisect.bisect_right(cells.cum_weights, rng.random() * cells.cum_weights[-1])]
        return rng.choice(cells.by_split[split][value])
    for _ in range(100_000):
        operands = tuple(rng.randint(regime.min_operand, regime.max_operand) for _ in range(k + 1))
        expression = _expression(operands, tuple(rng.choice(regime.ops) for _ in range(k)))
        if split_of(expression) == split and _valid_value(expression, regime.allow_negative) is not None:
            return expression
    raise ValueError(
        f"embedded_task: no valid {split} expression with {k} operations in 100000 draws for {regime}; "
        "widen the operand range or allow negatives"
    )


def embedded_task(
    split: str = "train",
    n: int = 1000,
    *,
    seed: int = 0,
    regime: str | ArithmeticRegime = DEFAULT_REGIME,
    ops: str | None = None,
    n_ops: tuple[int, int] | list[int] | None = None,
    min_operand: int | None = None,
    max_operand: int | None = None,
    allow_negative: bool | None = None,
) -> list[TaskItem]:
    """Generates multi-step integer arithmetic problems with worked solutions, i.i.d. from one regime.

    A question is an expression such as ``"3+4-2"``; its solution shows one operation per step and ends in
    ``\\boxed{answer}``. Train and held-out never share an expression and follow the same distribution (see
    the module docstring). The list for a smaller ``n`` is a prefix of the list for a larger one.

    Args:
        split: ``"train"`` or ``"test"`` (about 20% of the expression space, by hash).
        n: Number of items.
        seed: Random seed.
        regime: A name of `REGIMES` (default `DEFAULT_REGIME`) or an `ArithmeticRegime`.
        ops: Overrides the regime's operators.
        n_ops: Overrides the regime's operation-count range.
        min_operand: Overrides the regime's smallest operand.
        max_operand: Overrides the regime's largest operand.
        allow_negative: Overrides whether negative step results are allowed.

    Returns:
        ``n`` items with ids ``"embedded-<split>-<i>"``, integer answers and ``source="embedded"``.

    Raises:
        ValueError: A bad knob or regime name, or a split with no valid expression of some length.
    """
    _check_split(split)
    r = resolve_regime(
        regime, ops=ops, n_ops=n_ops, min_operand=min_operand, max_operand=max_operand,
        allow_negative=allow_negative,
    )  # fmt: skip
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n = {n!r} is not allowed: an integer >= 0")
    rng = random.Random(f"embedded/{seed}/{split}")
    items = []
    for i in range(n):
        n_ops = rng.randint(*r.n_ops)
        expression = _draw(rng, n_ops, r, split)
        solution, value = embedded_solution(expression)
        items.append(
            TaskItem(
                id=f"embedded-{split}-{i}", question=expression, answer=str(value), solution=solution,
                source="embedded", difficulty=str(n_ops),
            )
        )  # fmt: skip
    return items
