"""Verifiable rewards: answer extraction, then a 0/1 verdict with a reason.

`grade` / `grade_batch` never raise and are bounded in time from any thread: an answer is first extracted in
plain Python (linear time), screened (length, control characters, brace depth), then compared by a fast exact
path (identical text, or two plain numbers compared exactly); only what remains goes to math-verify, which
runs in worker processes (`workbench.tasks.verifier`) that are killed when they overrun their deadline.

| method | what it compares |
|---|---|
| ``"math_verify"`` | extracted answer vs gold: fast path, then math-verify (symbolic, numeric, sets...) |
| ``"boxed_exact"`` | last ``\\boxed{}`` vs gold after MATH-style normalization (authors' grader, App. A) |
| ``"numeric"`` | extracted answer vs gold as exact numbers, no math-verify |

Reasons: ``"correct"``, ``"wrong"``, ``"no_answer"`` (nothing extracted), ``"timeout"`` (verification ran
past its deadline), ``"malformed"`` (an answer was found but cannot be read: too long, control characters,
absurd nesting, unparsable).

**Your own reward**: ``task.reward: "package.module:function"`` (the TRL / verl way of naming one). The
function takes ``(completion, answer)`` — verl's ``compute_score(data_source, solution_str, ground_truth)``
is accepted too — and returns a reward in [0, 1] (a bool or a `Grade` also do); above 0.5 counts as correct
in accuracies. `reward_problem` imports it and calls it once on a worked example when the config loads, so a
typo or a wrong signature is named before any model loads. A module in the project root is found from a
notebook too (the root is added to ``sys.path`` when the first import fails)::

    # my_rewards.py
    from workbench.tasks.rewards import as_number, extract_answer

    def within_one(completion: str, answer: str) -> float:
        got = extract_answer(completion)
        value = as_number(got) if got else None
        return float(value is not None and abs(value - as_number(answer)) <= 1)
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from workbench.tasks.term_call import CUSTOM_FUNCTION, import_function

logger = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 500
"""Longer extracted answers are "malformed": no benchmark answer comes close, and parsing them is slow."""

MAX_BRACE_DEPTH = 24
"""Deeper brace nesting in an answer is "malformed" (legitimate answers nest a few levels)."""

REASONS = ("correct", "wrong", "no_answer", "timeout", "malformed")


@dataclass(frozen=True)
class Grade:
    """A verdict on one completion.

    Attributes:
        reward: 1.0 when correct, else 0.0.
        reason: One of `REASONS`.
    """

    reward: float
    reason: str


CORRECT, WRONG = Grade(1.0, "correct"), Grade(0.0, "wrong")
NO_ANSWER, TIMEOUT, MALFORMED = Grade(0.0, "no_answer"), Grade(0.0, "timeout"), Grade(0.0, "malformed")
_BY_REASON = {g.reason: g for g in (CORRECT, WRONG, NO_ANSWER, TIMEOUT, MALFORMED)}

# ----------------------------------------------------------------------------------------------------------
# Extraction


def last_boxed(text: str) -> str | None:
    """Returns the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces included.

    ``\\boxed 5`` (no braces) gives ``"5"``. An unclosed last box gives None. Linear time.
    """
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":
        match = re.match(r"[^\s$]+", text[i : i + MAX_ANSWER_CHARS + 1])
        return match.group(0) if match and i > start + 5 and text[i - 1] == " " else None
    depth = 0
    for m in re.finditer(r"[{}]", text[i:]):
        depth += 1 if m.group(0) == "{" else -1
        if depth == 0:
            return text[i + 1 : i + m.start()]
    return None


def extract_answer(text: str) -> str | None:
    """Extracts the final answer: the last ``\\boxed{}``, else the last ``#### x``, else "the answer is x".

    Returns:
        The answer text, stripped (surrounding ``$`` and a final period removed), or None when there is none.
    """
    found = last_boxed(text)
    if found is None:
        at = text.rfind("####")
        if at >= 0:
            found = text[at + 4 :].split("\n", 1)[0]
        else:
            at = text.lower().rfind("answer is")
            if at >= 0:
                found = text[at + 9 :].split("\n", 1)[0].split(". ", 1)[0]  # its line, its sentence
                found = found[1:] if found.startswith(":") else found
    if found is None:
        return None
    found = found.strip().rstrip(".").strip().strip("$").strip()
    return found or None


# ----------------------------------------------------------------------------------------------------------
# Normalization and the fast exact path

_SPACING = re.compile(r"\\[!,;:]|\\left|\\right|\\displaystyle|\s+|\$")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")


def squash(text: str) -> str:
    """Removes spacing commands, whitespace and ``$``; ``\\dfrac``/``\\tfrac`` become ``\\frac``."""
    text = _SPACING.sub("", text).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return text.replace("−", "-").rstrip(".")


def as_number(text: str) -> Fraction | None:
    """Reads a plain number exactly (``"-12"``, ``"0.50"``, ``"1,234"``, ``"1{,}234"``), else None."""
    text = squash(text).replace("{,}", ",")
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    if not _NUMBER.fullmatch(text):
        return None
    return Fraction(text)


def _screen(answer: str) -> Grade | None:
    """Rejects answers too long, binary or too deeply nested to be worth parsing."""
    if len(answer) > MAX_ANSWER_CHARS or _CONTROL.search(answer):
        return MALFORMED
    depth = deepest = 0
    for ch in answer:
        if ch in "{}":
            depth += 1 if ch == "{" else -1
            deepest = max(deepest, depth)
    return MALFORMED if deepest > MAX_BRACE_DEPTH else None


def _fast(answer: str, gold: str) -> Grade | None:
    """Decides identical texts and pairs of plain numbers; None when math-verify is needed."""
    a, g = squash(answer), squash(gold)
    if a == g:
        return CORRECT
    a_num, g_num = as_number(a), as_number(g)
    if a_num is not None and g_num is not None:
        return CORRECT if a_num == g_num else WRONG
    return None


# ----------------------------------------------------------------------------------------------------------
# The authors' strict boxed exact match (MATH-style normalization, then string equality)

_UNIT_TEXT = re.compile(r"\\(?:text|mbox|mathrm)\{\s*[a-zA-Z ]*\}$")


def _fix_fracs(text: str) -> str:
    r"""``\frac12`` -> ``\frac{1}{2}``, ``\frac1{2}`` -> ``\frac{1}{2}``."""
    return re.sub(
        r"\\frac(\d|\{[^{}]*\})(\d|\{[^{}]*\})",
        lambda m: f"\\frac{{{m[1].strip('{}')}}}{{{m[2].strip('{}')}}}",
        text,
    )


def math_normalize(text: str) -> str:
    """Normalizes an answer the way MATH graders do, for string comparison.

    Drops spacing, ``\\left``/``\\right``, degrees, dollars, percent signs, a trailing unit in ``\\text{}``,
    a short ``x =`` prefix; writes ``\\dfrac``/``\\tfrac`` as ``\\frac``, ``\\frac12`` as ``\\frac{1}{2}``,
    ``\\sqrt3`` as ``\\sqrt{3}``, ``a/b`` of integers as ``\\frac{a}{b}``, ``.5`` as ``0.5``.
    """
    text = text.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    text = (
        text.replace("^{\\circ}", "")
        .replace("^\\circ", "")
        .replace("\\$", "")
        .replace("\\%", "")
        .replace("%", "")
    )
    text = _UNIT_TEXT.sub("", text.strip()).strip()
    text = re.sub(r"^[a-zA-Z]\s*=\s*", "", text)
    text = squash(text)
    text = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", text)
    text = _fix_fracs(text)
    text = re.sub(r"^(-?\d+)/(\d+)$", r"\\frac{\1}{\2}", text)
    text = re.sub(r"(^|[^\d])\.(\d)", r"\g<1>0.\2", text)
    return text


def _grade_boxed_exact(completion: str, answer: str) -> Grade:
    boxed = last_boxed(completion)
    if boxed is None or not boxed.strip():
        return NO_ANSWER
    screened = _screen(boxed)
    if screened is not None:
        return screened
    return CORRECT if math_normalize(boxed) == math_normalize(answer) else WRONG


def _grade_numeric(completion: str, answer: str) -> Grade:
    extracted = extract_answer(completion)
    if extracted is None:
        return NO_ANSWER
    screened = _screen(extracted)
    if screened is not None:
        return screened
    fast = _fast(extracted, answer)
    return fast if fast is not None else MALFORMED


def _grade_math_verify(completion: str, answer: str) -> Grade:
    return grade_batch([completion], [answer], method="math_verify")[0]


REWARD_METHODS: dict[str, Callable[[str, str], Grade]] = {
    "math_verify": _grade_math_verify,
    "boxed_exact": _grade_boxed_exact,
    "numeric": _grade_numeric,
}
"""Grading methods by name: each maps ``(completion, gold answer)`` to a `Grade`."""


_ALLOWED = f"one of {list(REWARD_METHODS)}, or 'package.module:function' naming your own reward function"


@functools.cache
def reward_function(spec: str) -> Callable[[str, str], Grade]:
    """The grading function of a built-in method name or a custom ``package.module:function`` spec.

    Raises:
        ValueError: Not a method name nor a spec, a module that does not import, or no such function.
    """
    if spec in REWARD_METHODS:
        return REWARD_METHODS[spec]
    if not isinstance(spec, str) or not CUSTOM_FUNCTION.match(spec):
        raise ValueError(f"task.reward = {spec!r} is not allowed: {_ALLOWED}")
    fn = import_function(spec, "task.reward")
    params = inspect.signature(fn).parameters
    if "solution_str" in params and "ground_truth" in params:  # verl's compute_score
        return functools.partial(
            _call_custom, lambda c, a: fn(data_source="workbench", solution_str=c, ground_truth=a)
        )
    return functools.partial(_call_custom, fn)


def _call_custom(fn: Callable[[str, str], Any], completion: str, answer: str) -> Grade:
    """A custom reward's value as a `Grade` (reason ``correct`` above 0.5); a value outside [0, 1] raises."""
    value = fn(completion, answer)
    if isinstance(value, Grade):
        return value
    reward = float(value)
    if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
        raise ValueError(f"a reward function returned {value!r}; rewards must be in [0, 1]")
    return Grade(reward, "correct" if reward > 0.5 else "wrong")


def reward_problem(spec: str) -> str | None:
    """What is wrong with a reward spec, or None; a custom function is called once on a worked example.

    The message names ``task.reward``, the value and what is allowed (one paragraph).
    """
    try:
        fn = reward_function(spec)
    except ValueError as exc:
        return str(exc)
    if spec in REWARD_METHODS:
        return None
    try:
        grade = fn("so the answer is \\boxed{4}", "4")
    except Exception as exc:
        return (
            f"task.reward = {spec!r}: calling it on (completion='... \\boxed{{4}}', answer='4') failed with "
            f"{type(exc).__name__}: {exc}; a reward function takes (completion: str, answer: str) and "
            "returns a float in [0, 1] (or a bool, or a Grade)"
        )
    return None if isinstance(grade, Grade) else f"task.reward = {spec!r}: returned {grade!r}, not a reward"


def grade(completion: str, answer: str, method: str = "math_verify") -> Grade:
    """Grades one completion against a gold answer; never raises on bad completions.

    Args:
        completion: The model's response text.
        answer: The gold final answer (bare, e.g. ``"\\frac{1}{2}"``; ``$`` not needed).
        method: A key of `REWARD_METHODS`.

    Returns:
        A `Grade` with reward 1.0 or 0.0 and its reason.

    Raises:
        ValueError: Unknown method name (a programming error, raised before any grading).
    """
    return grade_batch([completion], [answer], method=method)[0]


def grade_batch(completions: list[str], answers: list[str], method: str = "math_verify") -> list[Grade]:
    """Grades many completions; the fast path runs inline, the rest in bounded worker processes.

    Args:
        completions: Response texts.
        answers: Gold answers, one per completion.
        method: A key of `REWARD_METHODS`, or a custom ``package.module:function`` (see the module doc).

    Returns:
        One `Grade` per completion, in order. Each math-verify comparison is bounded by
        `workbench.tasks.verifier.HARD_TIMEOUT_S`; anything unexpected becomes ``"malformed"``, never an
        exception.

    Raises:
        ValueError: Unknown method, or lists of different lengths (programming errors).
    """
    fn = reward_function(method)
    if len(completions) != len(answers):
        raise ValueError(f"{len(completions)} completions but {len(answers)} answers; they must pair up")
    if method != "math_verify":
        return [_safe(fn, c, a) for c, a in zip(completions, answers)]
    grades: list[Grade | None] = [None] * len(completions)
    slow: dict[tuple[str, str], list[int]] = {}  # identical pairs are verified once
    for i, (completion, gold) in enumerate(zip(completions, answers)):
        try:
            extracted = extract_answer(str(completion))
            if extracted is None:
                grades[i] = NO_ANSWER
                continue
            grades[i] = _screen(extracted) or _fast(extracted, str(gold))
            if grades[i] is None:
                slow.setdefault((extracted, str(gold)), []).append(i)
        except Exception:  # grading must never take down a run
            logger.exception("grading failed; counted as malformed")
            grades[i] = MALFORMED
    if slow:
        from workbench.tasks.verifier import verify_pairs  # lazy: starts worker processes on first use

        pairs = list(slow)
        for pair, reason in zip(pairs, verify_pairs(pairs)):
            for i in slow[pair]:
                grades[i] = _BY_REASON.get(reason, MALFORMED)
    return [g if g is not None else MALFORMED for g in grades]


def _safe(fn: Callable[[str, str], Grade], completion: str, answer: str) -> Grade:
    try:
        return fn(str(completion), str(answer))
    except Exception:
        logger.exception("grading failed; counted as malformed")
        return MALFORMED
