"""The allowed ranges of HACPO's knobs, defined once.

Config validation (``hacpo`` section, `workbench.config.sections.HacpoConfig`), the tuning widgets
(`workbench.lab.explore.validate_tuning`) and the math that takes them (`workbench.core.advantages`) all
check a value with `knob_problem`, so the three can never disagree. Standard library only.

| knob | range | why |
|---|---|---|
| ``alpha`` | ≥ 0 | α of the exponential importance sampling (Eq. 12); 0 = plain ratio |
| ``delta`` | [0, 1) | the cross lower bound 1 − δ must be positive (Eqs. 13-14) |
| ``delta_step`` | ≥ 0 | the bound only tightens over a step's mini-batches (Eq. 14) |
| ``window`` | integer ≥ 1 | K steps in the capability average (Eq. 9) |
| ``min_ratio`` | (0, 1] | lower clamp of ω (the authors' code); ω = 1 must stay inside |
| ``max_ratio`` | ≥ 1 | upper clamp of ω |
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["HACPO_KNOBS", "KnobRange", "knob_problem"]


@dataclass(frozen=True)
class KnobRange:
    """A closed or half-open interval of finite numbers (integers only, when ``integer``)."""

    low: float
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    why: str = ""
    """Said after the range in a message (``"the lower bound 1 − δ must be positive"``)."""

    def allows(self, value: Any) -> bool:
        """Whether ``value`` is a finite number (an int for an integer knob; never a bool) in the range."""
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            return False
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        kind = "an integer " if self.integer else ""
        if math.isinf(self.high):
            text = f"{kind}{'>' if self.low_open else '>='} {self.low:g}"
        else:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            text = f"{kind}in {left}{self.low:g}, {self.high:g}{right}"
        return f"{text} ({self.why})" if self.why else text


HACPO_KNOBS: dict[str, KnobRange] = {
    "alpha": KnobRange(0.0),
    "delta": KnobRange(0.0, 1.0, high_open=True, why="the lower bound 1 − δ must be positive"),
    "delta_step": KnobRange(0.0),
    "window": KnobRange(1, integer=True),
    "min_ratio": KnobRange(0.0, 1.0, low_open=True),
    "max_ratio": KnobRange(1.0),
}
"""Every HACPO knob with a range, by its name in the ``hacpo`` section."""


def knob_problem(name: str, value: Any, key: str | None = None) -> str | None:
    """None when ``value`` is allowed for the knob ``name``; else the message
    ``"<key> = <value> is not allowed: <range>"`` (``key`` defaults to ``name``; the config passes
    ``hacpo.<name>``)."""
    allowed = HACPO_KNOBS[name]
    if allowed.allows(value):
        return None
    return f"{key or name} = {value!r} is not allowed: {allowed}"
