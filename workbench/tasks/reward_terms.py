"""Several reward functions per response (``task.rewards``), as TRL's ``reward_funcs`` and ``reward_weights``.

Each function is called once per response with the completion first and every column of its item as keyword
arguments (`columns`: the task's own fields ``id, question, answer, solution, source, difficulty``, and the
rollout's ``prompt``, ``completion_length`` in the author's tokens, ``finish_reason`` and the run's
``max_new_tokens``); it takes those it names, or all with ``**kwargs``. It returns a float, an int, a bool, or
None when it does not apply to the item (as in TRL: None adds nothing to the weighted sum and is left out of
the function's logged mean). The reward a run trains on is the weighted sum (`workbench.train.rewarding`).

| ``fn`` | value |
|---|---|
| ``math_verify``, ``boxed_exact``, ``numeric`` | correctness, 1 or 0 (`workbench.tasks.rewards`) |
| ``format_boxed`` | 1 when the response's last ``\\boxed{}`` holds something, else 0 |
| ``length_penalty`` | ``-completion_length / max_new_tokens``, in [-1, 0] |
| ``package.module:function`` | your own (`workbench.tasks.term_call`), run in the bounded worker |
| | processes of `workbench.tasks.verifier`, under the deadline of every grading call |

A function that raises, returns NaN or infinity, or returns something that is not a number stops the step with
`RewardFunctionError` naming the function and the item, before any update: the run's last checkpoint and
its logs are untouched, and the run resumes from them once the function is fixed. A call that overruns the
deadline counts as None (not applicable) and is logged as a WARNING.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from workbench.core.types import TaskItem
from workbench.tasks.rewards import REWARD_METHODS, grade_batch, last_boxed
from workbench.tasks.term_call import TermValueError, call_term, import_function, term_value

__all__ = [
    "BUILTIN_TERMS",
    "TERM_NAMES",
    "RewardFunctionError",
    "columns",
    "format_boxed",
    "length_penalty",
    "score_term",
    "term_problem",
]

logger = logging.getLogger(__name__)


def format_boxed(completion: str, **_: Any) -> float:
    """1.0 when the response's last ``\\boxed{}`` holds something (the format the graders read), else 0.0."""
    boxed = last_boxed(completion)
    return float(bool(boxed and boxed.strip()))


def length_penalty(completion: str, completion_length: int, max_new_tokens: int, **_: Any) -> float:
    """``-completion_length / max_new_tokens``: 0 for an empty response, -1 for one cut at the cap."""
    return -completion_length / max(max_new_tokens, 1)


BUILTIN_TERMS: dict[str, Callable[..., float]] = {
    "format_boxed": format_boxed,
    "length_penalty": length_penalty,
}
"""The shipped reward functions besides the graders, by name."""
TERM_NAMES = (*REWARD_METHODS, *BUILTIN_TERMS)
"""Every ``fn`` that is a name rather than ``package.module:function``."""
_EXAMPLE = TaskItem(id="example-0", question="What is 2 + 2?", answer="4", source="example", difficulty="1")


class RewardFunctionError(RuntimeError):
    """A function of ``task.rewards`` failed on an item: the message names the function and the item."""


def columns(
    item: TaskItem, prompt: str, completion_length: int, finish_reason: str, max_new_tokens: int
) -> dict:
    """The keyword arguments of a reward function for one response (see the module docstring)."""
    return {
        **asdict(item),
        "prompt": prompt,
        "completion_length": completion_length,
        "finish_reason": finish_reason,
        "max_new_tokens": max_new_tokens,
    }


def term_problem(fn: str, field: str) -> str | None:
    """What is wrong with a ``task.rewards[i].fn``, or None: a name of `TERM_NAMES`, or a function that
    imports and returns a reward when called once on a worked example (in this process)."""
    if fn in TERM_NAMES:
        return None
    if isinstance(fn, str) and ":" not in fn:
        near = difflib.get_close_matches(fn, TERM_NAMES, n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]}?" if near else ""
        return (
            f"{field} = {fn!r} is not allowed: one of {list(TERM_NAMES)} or 'package.module:function'{hint}"
        )
    try:
        function = import_function(fn, field)
    except ValueError as exc:
        return str(exc)
    example = columns(_EXAMPLE, _EXAMPLE.question, 12, "eos", 32)
    try:
        call_term(function, "so the answer is \\boxed{4}", example)
    except Exception as exc:
        return (
            f"{field} = {fn!r}: calling it on (completion='... \\boxed{{4}}', answer='4', ...) failed with "
            f"{type(exc).__name__}: {exc}; a reward function takes the completion first and any of "
            f"{sorted(example)} as keyword arguments (or **kwargs), and returns a float, a bool or None"
        )
    return None


def score_term(
    fn: str, name: str, completions: Sequence[str], cols: Sequence[Mapping[str, Any]], where: Sequence[str]
) -> list[float | None]:
    """The value of one reward function on every response (``where[i]`` names response i in an error).

    Raises:
        RewardFunctionError: The function raised, or returned something that is not a reward.
    """
    if fn in REWARD_METHODS:
        return [g.reward for g in grade_batch(list(completions), [str(c["answer"]) for c in cols], fn)]
    if fn in BUILTIN_TERMS:
        values = []
        for completion, col, place in zip(completions, cols, where):
            try:
                values.append(call_term(BUILTIN_TERMS[fn], completion, col))
            except Exception as exc:
                raise RewardFunctionError(_failure(name, fn, place, exc)) from exc
        return values
    from workbench.tasks.verifier import call_function  # lazy: starts the worker processes on first use

    answers = call_function(fn, [(c, dict(col)) for c, col in zip(completions, cols)])
    values, late = [], []
    for answer, place in zip(answers, where):
        if "e" in answer:
            raise RewardFunctionError(_failure(name, fn, place, answer["e"]))
        if "t" in answer:
            late.append(place)
            values.append(None)
            continue
        try:
            values.append(term_value(answer.get("v")))
        except TermValueError as exc:
            raise RewardFunctionError(_failure(name, fn, place, exc)) from None
    if late:
        logger.warning(
            "reward function %s (%s) overran its deadline on %d of %d responses (first: %s): counted as None",
            name, fn, len(late), len(answers), late[0],
        )  # fmt: skip
    return values


def _failure(name: str, fn: str, place: str, error: object) -> str:
    if isinstance(error, BaseException):
        error = error if isinstance(error, TermValueError) else f"{type(error).__name__}: {error}"
    return (
        f"task.rewards function {name!r} ({fn}) failed on {place}: {error}. Nothing of this step was "
        "applied: the run resumes from its last checkpoint once the function is fixed"
    )
