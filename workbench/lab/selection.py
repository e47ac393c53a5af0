"""Which runs may be averaged together: `select_runs`.

Runs are seeds of one another when they finished, have the same resolved config but for the seed, were made
by the same code version (or versions the user pools by name) and started every agent from the same weights
(`workbench.lab.provenance`); everything else is listed as excluded with its reason, never averaged.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
import yaml

from workbench.config.loading import config_hash, read_run_config
from workbench.core.machine import code_version
from workbench.lab.frames import _run_ids, find_run_dirs
from workbench.lab.provenance import split_by_start_weights, start_weights

__all__ = ["EXCLUDED_COLUMNS", "GROUP_COLUMNS", "RunSelection", "select_runs"]

EXCLUDED_COLUMNS = ("run_dir", "experiment", "method", "seed", "reason")
"""Columns of `RunSelection.excluded`."""
GROUP_COLUMNS = ("experiment", "method", "code_version", "runs", "seeds", "chosen_because", "start_weights")
"""Columns of `RunSelection.groups`."""
SEED_KEYS = ("seed", "seeds", "output")
"""Top-level config keys in which seeds of one experiment may differ."""


class RunSelection(NamedTuple):
    """What `select_runs` decided: the runs to aggregate, the runs left out and why, the groups chosen."""

    runs: list[Path]
    """Finished runs that are seeds of one another within each (experiment, method), sorted."""
    excluded: pd.DataFrame
    """One row per run left out: ``run_dir, experiment, method, seed, reason``."""
    groups: pd.DataFrame
    """One row per (experiment, method): ``code_version, runs, seeds, chosen_because``."""


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out |= _flatten(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def _pooled(version: str, same_code: Collection[str]) -> str:
    """A run's code version for grouping: the versions named in ``same_code`` count as one."""
    return "+".join(sorted(same_code)) if version in same_code else version


def _run_facts(run_dir: Path, same_code: Collection[str] = ()) -> dict[str, Any]:
    """What grouping needs to know of a run; ``reason`` is set when it cannot be aggregated at all."""
    facts: dict[str, Any] = {
        "run_dir": run_dir,
        "experiment": run_dir.parent.name,
        "method": "",
        "seed": None,
    }
    try:
        cfg = read_run_config(run_dir)
    except (OSError, ValueError, yaml.YAMLError) as err:
        return facts | {"reason": f"config.yaml unreadable: {err}"}
    ids = _run_ids(run_dir)
    facts |= {"experiment": ids["experiment"], "method": ids["algorithm"], "seed": ids["seed"]}
    if not (run_dir / "DONE").is_file():
        return facts | {"reason": "not finished (no DONE marker)"}
    done = _read_json(run_dir / "DONE")
    env = _read_json(run_dir / "environment.json") or {}
    starts = [env, *(r for r in env.get("resumes", []) if isinstance(r, dict))]
    versions = {s.get("code_version") for s in starts}
    if not env or None in versions:
        return facts | {"reason": "code version unknown (environment.json lacks code_version: older code)"}
    made_by = sorted(versions)
    versions = {_pooled(v, same_code) for v in versions}
    if len(versions) > 1:
        return facts | {"reason": f"resumed under other code (code versions {sorted(versions)})"}
    weights, problem = start_weights(env)
    if problem:
        return facts | {"reason": problem}
    rest = {k: v for k, v in cfg.items() if k not in SEED_KEYS}
    finished = str((done or {}).get("finished_at") or "")
    mtime = (run_dir / "DONE").stat().st_mtime
    return facts | {
        "reason": None,
        "config": _flatten(rest),
        "config_key": config_hash(rest),
        "code_version": versions.pop(),
        "made_by": made_by,
        "finished": (finished, mtime),
        "weights": weights,
    }


def _choose(candidates: dict[tuple[str, str], list[dict]], current: str) -> tuple[tuple[str, str], str]:
    """The (config key, code version) group to aggregate, and why it was chosen."""
    newest = {key: max(r["finished"] for r in runs) for key, runs in candidates.items()}
    pooled = [key for key in candidates if "+" in key[1]]
    if pooled:
        key = max(pooled, key=newest.get)
        return key, f"code versions {key[1].replace('+', ', ')} pooled by the user (same_code)"
    mine = [key for key in candidates if key[1] == current]
    if mine:
        return max(mine, key=newest.get), "made by the current code version"
    key = max(candidates, key=newest.get)
    why = "the current code has no finished run here: the most recently finished group"
    return key, why if len(candidates) > 1 else "the only group (made by another code version)"


def _why_not(run: dict, chosen: dict, why: str) -> str:
    if run["config_key"] != chosen["config_key"]:
        a, b = run["config"], chosen["config"]
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        shown = ", ".join(keys[:5]) + (f" (+{len(keys) - 5})" if len(keys) > 5 else "")
        return f"config differs from the chosen runs in {shown}"
    return f"code version {run['code_version']} differs from the chosen {chosen['code_version']} ({why})"


def select_runs(
    paths: Iterable[Path | str] | Path | str,
    *,
    current_version: str | None = None,
    same_code: Collection[str] = (),
) -> RunSelection:
    """Which runs may be averaged over seeds, and which are left out and why.

    Within each (experiment, method): only finished runs (``DONE``) whose resolved config matches except for
    ``seed``, ``seeds`` and ``output.*``, and whose ``code_version`` (``environment.json``) matches. Runs
    without a code version (made before it was recorded) are excluded as unknown. When several groups
    exist, the one made by the current code version is chosen if there is one, else the most recently
    finished; ``groups`` says which and why. Within it, runs must also share each agent's starting-weights
    digest (the digests most runs share are kept, `workbench.lab.provenance.split_by_start_weights`); runs
    made before digests were recorded are kept unchecked, and ``groups.start_weights`` says so. Of two
    finished runs with the same seed the newer is kept.

    ``same_code`` names code versions the user vouches train alike (e.g. versions that differ only in logging
    or docs): their runs count as one version, that group is preferred, and ``groups`` says so.

    Args:
        paths: Run directories and/or folders holding them (as :func:`find_run_dirs`).
        current_version: The code version to prefer (default: this code's, ``workbench.train.environment``).
        same_code: Code versions (``environment.json`` ``code_version``) to pool; at least two when given.

    Raises:
        FileNotFoundError: A path does not exist.
        ValueError: ``same_code`` names fewer than two versions.

    """
    same_code = frozenset(same_code)
    if len(same_code) == 1:
        raise ValueError(f"same_code = {sorted(same_code)} is not allowed: name two code versions or more")
    current = current_version if current_version is not None else code_version()
    excluded, by_method = [], {}
    for run_dir in find_run_dirs(paths):
        facts = _run_facts(run_dir, same_code)
        if facts["reason"]:
            excluded.append({c: facts[c] for c in EXCLUDED_COLUMNS})
            continue
        by_method.setdefault((facts["experiment"], facts["method"]), []).append(facts)
    chosen_runs, groups = [], []
    for (experiment, method), runs in by_method.items():
        candidates: dict[tuple[str, str], list[dict]] = {}
        for run in runs:
            candidates.setdefault((run["config_key"], run["code_version"]), []).append(run)
        key, why = _choose(candidates, current)
        same_start, other_start, weights_note = split_by_start_weights(candidates[key])
        for run, reason in other_start:
            excluded.append({**{c: run[c] for c in EXCLUDED_COLUMNS[:-1]}, "reason": reason})
        kept: dict[Any, dict] = {}
        for run in sorted(same_start, key=lambda r: r["finished"], reverse=True):
            if run["seed"] in kept:
                reason = (
                    f"seed {run['seed']} also in {kept[run['seed']]['run_dir'].name} (newer, same config)"
                )
                excluded.append({**{c: run[c] for c in EXCLUDED_COLUMNS[:-1]}, "reason": reason})
                continue
            kept[run["seed"]] = run
        reference = next(iter(kept.values()))
        for other in (k for k in candidates if k != key):
            for run in candidates[other]:
                reason = _why_not(run, reference, why)
                excluded.append({**{c: run[c] for c in EXCLUDED_COLUMNS[:-1]}, "reason": reason})
        chosen_runs += [r["run_dir"] for r in kept.values()]
        seeds = sorted((s for s in kept if s is not None), key=int)
        if "+" in key[1]:  # pooled: name the versions these runs were made by
            made_by = sorted({v for r in kept.values() for v in r["made_by"]})
            key = (key[0], "+".join(made_by))
            why = (
                f"code versions {', '.join(made_by)} pooled by the user (same_code)"
                if len(made_by) > 1
                else f"made by code version {made_by[0]}, one of those pooled by the user (same_code)"
            )
        groups.append([experiment, method, key[1], len(kept), seeds, why, weights_note])
    excluded_df = pd.DataFrame(excluded, columns=list(EXCLUDED_COLUMNS))
    excluded_df["run_dir"] = excluded_df["run_dir"].astype(str)
    return RunSelection(
        sorted(chosen_runs),
        excluded_df.sort_values(["experiment", "method", "run_dir"], kind="stable").reset_index(drop=True),
        pd.DataFrame(groups, columns=list(GROUP_COLUMNS)),
    )
