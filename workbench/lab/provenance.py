"""Where a run's numbers come from: its code version and its agents' starting weights (``environment.json``).

Every start of a run records ``code_version`` and, once its agents are loaded, ``start_weights``: per agent,
the sha256 digest of its weights before any update (`workbench.agents.forward.agent.state_digest`; LoRA
adapters included). A resume records its own entry under ``resumes``. `split_by_start_weights` keeps, of the
runs that `workbench.lab.selection.select_runs` would average, those that started from the same weights; runs
made before digests were recorded count as unknown and are kept, as they were before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["read_environment", "short", "split_by_start_weights", "start_weights"]

UNKNOWN = "unknown (older run: no digest recorded)"
"""How a missing digest is shown."""


def read_environment(run_dir: Path | str) -> dict[str, Any]:
    """A run's ``environment.json`` as a dict; empty when it is missing or unreadable."""
    try:
        doc = json.loads((Path(run_dir) / "environment.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def short(digest: str | None) -> str:
    """The first 12 hex digits of a digest (enough to tell two apart in a sentence), or `UNKNOWN`."""
    return digest[:12] if isinstance(digest, str) else UNKNOWN


def start_weights(env: dict[str, Any]) -> tuple[dict[str, str] | None, str | None]:
    """The starting-weights digest of each agent of a run, and what is wrong with them, if anything.

    Args:
        env: The run's ``environment.json`` (`read_environment`).

    Returns:
        ``(digests, problem)``: ``digests`` maps agent names to digests (None when the first start recorded
        none: an older run); ``problem`` names an agent whose weights at a resume differ from those of the
        first start (the run then trained from two starting points), else None.
    """
    first = env.get("start_weights")
    if not isinstance(first, dict):
        return None, None
    for resume in env.get("resumes") or []:
        later = resume.get("start_weights") if isinstance(resume, dict) else None
        for agent, digest in (later or {}).items():
            if agent in first and digest != first[agent]:
                return first, (
                    f"starting weights of agent {agent} changed on resume: {short(first[agent])} then "
                    f"{short(digest)}"
                )
    return {str(k): str(v) for k, v in first.items()}, None


def _signature(run: dict[str, Any]) -> tuple[tuple[str, str], ...] | None:
    weights = run.get("weights")
    return None if weights is None else tuple(sorted(weights.items()))


def _difference(run: dict[str, Any], chosen: dict[str, str]) -> str:
    mine = run["weights"]
    for agent in sorted(set(mine) | set(chosen)):
        if mine.get(agent) != chosen.get(agent):
            return (
                f"starting weights of agent {agent} differ: {short(mine.get(agent))} vs "
                f"{short(chosen.get(agent))} in the chosen runs"
            )
    raise AssertionError("runs with equal signatures do not differ")


def split_by_start_weights(runs: list[dict[str, Any]]) -> tuple[list[dict], list[tuple[dict, str]], str]:
    """Of runs that may otherwise be averaged, those with the same starting weights per agent.

    The digests that most runs share are chosen (ties: the group with the most recently finished run).
    Runs with other digests are left out, with a reason naming the first agent that differs; runs without
    digests (older code) are kept, unchecked.

    Args:
        runs: Dicts with ``weights`` (agent → digest, or None) and ``finished`` (a sortable finish time).

    Returns:
        ``(kept, [(run, reason), ...], note)``, ``note`` saying what was checked: ``"same in 3 runs"``,
        ``"not recorded (older runs)"``, or ``"same in 2 runs; not recorded in 1 (older run): unchecked"``.
    """
    known: dict[tuple, list[dict]] = {}
    for run in runs:
        if _signature(run) is not None:
            known.setdefault(_signature(run), []).append(run)
    unknown = [run for run in runs if _signature(run) is None]
    if not known:
        return list(runs), [], "not recorded (older runs)"
    best = max(known, key=lambda s: (len(known[s]), max(r["finished"] for r in known[s])))
    chosen = dict(best)
    left_out = [
        (run, _difference(run, chosen)) for sig, group in known.items() if sig != best for run in group
    ]
    note = f"same in {len(known[best])} runs"
    if unknown:
        note += f"; not recorded in {len(unknown)} (older run{'s' if len(unknown) > 1 else ''}): unchecked"
    return [r for r in runs if _signature(r) in (best, None)], left_out, note
