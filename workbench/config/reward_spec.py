"""One entry of ``task.rewards``: a reward function, its weight and the name its metrics carry.

```yaml
task:
  reward: math_verify              # accuracy: P̂, train/acc and every evaluation
  rewards:                         # what the run trains on: the weighted sum
    - {fn: math_verify, weight: 1.0}
    - {fn: format_boxed, weight: 0.2}
    - {fn: my_rewards:brevity, weight: 0.1, name: brevity}
```

The functions themselves, what they are passed and how they run: `workbench.tasks.reward_terms`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workbench.config.checks import ConfigError, coerce_fields, reject_unknown, require, require_name
from workbench.tasks.reward_terms import term_problem

__all__ = ["RESERVED_NAMES", "RewardSpec", "reward_specs"]

RESERVED_NAMES = ("total",)
"""Names a reward function may not take: ``reward/<agent>/total/`` is the weighted sum."""


@dataclass(frozen=True)
class RewardSpec:
    """One reward function of ``task.rewards`` and its weight in the reward the run trains on."""

    fn: str
    """``math_verify``, ``boxed_exact``, ``numeric`` (correctness, 1 or 0), ``format_boxed``,
    ``length_penalty`` (`workbench.tasks.reward_terms`), or your own ``package.module:function`` (imported and
    tried once when the config loads; run in the bounded grading processes)."""
    weight: float = 1.0
    """Its weight in the sum (any finite number; 0 logs the function without training on it)."""
    name: str | None = None
    """The name in its metrics ``reward/<agent>/<name>/mean``; None = the function's own name."""

    def __post_init__(self) -> None:
        coerce_fields(self, "task.rewards[i]")
        if self.name is None:
            object.__setattr__(self, "name", self.fn.rsplit(":", 1)[-1])
        require(math.isfinite(self.weight), "task.rewards[i].weight", self.weight, "a finite number")
        require_name(
            "task.rewards[i].name", self.name, "it becomes part of metric keys reward/<agent>/<name>"
        )
        require(self.name not in RESERVED_NAMES, "task.rewards[i].name", self.name, "not 'total' (the sum)")
        if problem := term_problem(self.fn, "task.rewards[i].fn"):
            raise ConfigError(problem, key="task.rewards")


def reward_specs(value: Any) -> tuple[RewardSpec, ...]:
    """``task.rewards`` as specs: from specs, mappings ``{fn, weight, name}`` or bare function names.

    Raises:
        ConfigError: Not a list, an entry with an unknown key or a bad value, or two entries of one name.
    """
    if not isinstance(value, list | tuple):
        raise ConfigError(
            f"task.rewards: expected a list of {{fn, weight}} mappings, got {value!r}", key="task.rewards"
        )
    specs = []
    for entry in value:
        if isinstance(entry, str):
            entry = {"fn": entry}
        if isinstance(entry, Mapping):
            reject_unknown(entry, RewardSpec, "task.rewards[i]")
            if "fn" not in entry:
                raise ConfigError(f"task.rewards: {dict(entry)!r} has no 'fn'", key="task.rewards")
            entry = RewardSpec(**entry)
        if not isinstance(entry, RewardSpec):
            raise ConfigError(f"task.rewards: {entry!r} is not a {{fn, weight}} mapping", key="task.rewards")
        specs.append(entry)
    names = [s.name for s in specs]
    require(len(set(names)) == len(names), "task.rewards", names, "one name per function (set 'name')")
    return tuple(specs)
