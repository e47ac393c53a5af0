"""Loading any set of run directories into pandas, and choosing which runs may be averaged together.

`load_runs` (one row per run and step), `load_evals` (``evals.csv`` rows with run ids) and `melt_metric`
(one key family in long form, its key segments named) read what `workbench.train.rundir.RunWriter` wrote.
`select_runs` decides which runs are seeds of one another: finished, same resolved config but for the seed,
same code version, same starting weights per agent (`workbench.lab.provenance`); everything else is listed as
excluded with its reason, never averaged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
import yaml

from workbench.config.loading import config_hash, read_run_config
from workbench.core import io as wio
from workbench.core.evalcsv import EVAL_COLUMNS
from workbench.core.machine import code_version
from workbench.lab.provenance import split_by_start_weights, start_weights

ID_COLUMNS = ("run", "experiment", "algorithm", "seed", "run_dir")
EXCLUDED_COLUMNS = ("run_dir", "experiment", "method", "seed", "reason")
"""Columns of `RunSelection.excluded`."""
GROUP_COLUMNS = ("experiment", "method", "code_version", "runs", "seeds", "chosen_because", "start_weights")
"""Columns of `RunSelection.groups`."""
SEED_KEYS = ("seed", "seeds", "output")
"""Top-level config keys in which seeds of one experiment may differ."""


# melt_metric: the named segments after each key family (generic fallback: one `key` column).
_KEY_SCHEMES: dict[str, tuple[str, ...]] = {
    "train/acc": ("agent",),
    "train/reward_std": ("agent",),
    "eval/acc": ("agent",),
    "capability": ("agent",),
    "omega": ("learner", "source"),
    "is": ("learner", "source", "stat"),
    "is_mb": ("learner", "source", "minibatch", "stat"),
    "cost": ("agent", "stat"),
    "loss": ("learner",),
    "kl": ("learner",),
    "grad_norm": ("learner",),
    "adv": ("learner", "stat"),
    "adv_src": ("learner", "source", "stat"),
    "grad_frac": ("learner", "source"),
    "length": ("learner", "source"),
    "loss_clipped": ("learner",),
    "omega_baseline": ("learner", "source"),
    "omega_loss": ("learner", "source"),
    "reward": ("agent", "fn", "stat"),
    "train/lr": ("agent",),
    "train/length": ("agent",),
    "train/length_chars": ("agent",),
    "train/truncated_frac": ("agent",),
    "eval_difficulty": ("difficulty", "metric", "agent"),
}

_EVAL_FAMILY = re.compile(r"eval/(?:[^/]+/)?(?:acc|avg@\d+)")
"""Held-out metric families (``eval/acc``, ``eval/avg@k``, and the same under an extra ``eval/<source>/``)."""


def _iter_paths(paths: Iterable[Path | str] | Path | str) -> list[Path]:
    if isinstance(paths, str | Path):
        return [Path(paths)]
    return [Path(p) for p in paths]


def find_run_dirs(paths: Iterable[Path | str] | Path | str, experiment: str | None = None) -> list[Path]:
    """Run directories (those holding ``config.yaml``) at or below each path, deduplicated, sorted.

    Args:
        paths: Run directories or folders of them.
        experiment: Keep only the runs of this experiment (the config's ``experiment``); None keeps all.

    Raises:
        FileNotFoundError: A path does not exist (names it).
    """
    found: dict[Path, None] = {}
    for path in _iter_paths(paths):
        if not path.exists():
            raise FileNotFoundError(f"results path {path} does not exist")
        if (path / "config.yaml").is_file():
            found[path.resolve()] = None
            continue
        for cfg in sorted(path.rglob("config.yaml")):
            if "checkpoints" not in cfg.relative_to(path).parts:
                found[cfg.parent.resolve()] = None
    runs = sorted(found)
    return runs if experiment is None else [r for r in runs if _run_ids(r)["experiment"] == experiment]


def _run_ids(run_dir: Path) -> dict[str, Any]:
    cfg = read_run_config(run_dir)
    seed = cfg.get("seed")
    return {
        "run": run_dir.name,
        "experiment": str(cfg.get("experiment", run_dir.parent.name)),
        # The method label (an ablation's name, e.g. "hacpo-adv") when set, else the algorithm.
        "algorithm": str(cfg.get("label") or cfg.get("algorithm", "")),
        "seed": seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
        "run_dir": str(run_dir),
    }


def _finish(frames: list[pd.DataFrame], columns: list[str], sort: list[str]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})
    df = pd.concat(frames, ignore_index=True)
    df["seed"] = df["seed"].astype("Int64")
    df["step"] = df["step"].astype("int64")
    return df.sort_values(sort, kind="stable").reset_index(drop=True)


def load_runs(paths: Iterable[Path | str] | Path | str) -> pd.DataFrame:
    """Metrics of any set of runs, WIDE: one row per (run, step).

    Args:
        paths: Run directories and/or directories containing run directories (searched recursively).

    Returns:
        Columns ``run, experiment, algorithm, seed, run_dir, step`` then every metric key (sorted), NaN
        where a run did not log it. Lines of the same step are merged (a later value wins). Sorted by
        run, step. A run without metrics contributes no rows.

    Raises:
        FileNotFoundError: A path does not exist.
    """
    frames, keys = [], set()
    for run_dir in find_run_dirs(paths):
        ids = _run_ids(run_dir)
        metrics = run_dir / "metrics.jsonl"
        by_step: dict[int, dict[str, Any]] = {}
        for row in wio.read_jsonl(metrics) if metrics.exists() else []:
            by_step.setdefault(int(row["step"]), {}).update(row)
        if not by_step:
            continue
        keys.update(k for row in by_step.values() for k in row if k != "step")
        frames.append(pd.DataFrame([ids | by_step[s] for s in sorted(by_step)]))
    columns = [*ID_COLUMNS, "step", *sorted(keys)]
    df = _finish(frames, columns, ["run", "run_dir", "step"])
    if len(df):
        df = df.reindex(columns=columns)
        df[sorted(keys)] = df[sorted(keys)].astype("float64")
    return df


def _eval_items(run_dir: Path) -> float:
    """Held-out items of a run: ``task.eval_size`` of its config (the number asked for), NaN if absent."""
    task = read_run_config(run_dir).get("task") or {}
    size = task.get("eval_size") if isinstance(task, dict) else None
    return float(size) if isinstance(size, int) and not isinstance(size, bool) and size > 0 else float("nan")


def load_evals(paths: Iterable[Path | str] | Path | str) -> pd.DataFrame:
    """``evals.csv`` of all runs, with ``run, experiment, algorithm, seed, run_dir`` prepended and ``items``
    (held-out items evaluated, from ``task.eval_size``; for standard errors) appended.

    Raises:
        FileNotFoundError: A path does not exist.
    """
    frames = []
    for run_dir in find_run_dirs(paths):
        path = run_dir / "evals.csv"
        if not path.exists():
            continue
        df = pd.read_csv(path, dtype={"agent": str, "benchmark": str, "metric": str})
        df["value"] = df["value"].astype("float64")
        for col, value in reversed(_run_ids(run_dir).items()):
            df.insert(0, col, value)
        df["items"] = _eval_items(run_dir)
        frames.append(df)
    columns = [*ID_COLUMNS, *EVAL_COLUMNS, "items"]
    return _finish(frames, columns, ["run", "run_dir", "step", "agent", "benchmark", "metric"])


def _segment_names(prefix: str) -> tuple[str, ...] | None:
    """Names of the key segments after ``prefix``, or None when the family is unknown."""
    if _EVAL_FAMILY.fullmatch(prefix):  # eval/acc, eval/avg@4, eval/<source>/acc ...: one agent segment
        return ("agent",)
    for base, names in _KEY_SCHEMES.items():
        if prefix == base or prefix.startswith(base + "/"):
            depth = prefix.count("/") - base.count("/")
            return names[depth:] or None
    return None


def melt_metric(df: pd.DataFrame, prefix: str) -> pd.DataFrame:
    """Long form of every column under ``prefix``, NaN values dropped.

    ``"eval/acc"`` gives columns ``agent, value``; ``"omega"`` gives ``learner, source``; ``"is"`` gives
    ``learner, source, stat``; ``"cost"`` gives ``agent, stat``; a deeper prefix (``"is/char-gpt2"``) gives
    the remaining segments; an unknown family (``"time"``) or a key of another shape gives one ``key``
    column with the rest of the name. The id columns of ``df`` (``run, experiment, algorithm, seed,
    run_dir``) and ``step`` come first.

    Raises:
        ValueError: No column of ``df`` lies under ``prefix`` (lists the prefixes that exist).
    """
    prefix = prefix.strip("/")
    cols = [c for c in df.columns if isinstance(c, str) and c.startswith(prefix + "/")]
    if not cols:
        families = sorted({c.split("/")[0] for c in df.columns if isinstance(c, str) and "/" in c})
        raise ValueError(f"melt_metric: no column under {prefix!r}; families present: {families}")
    ids = [c for c in (*ID_COLUMNS, "step") if c in df.columns]
    long = df.melt(id_vars=ids, value_vars=cols, var_name="_key", value_name="value")
    long = long.dropna(subset=["value"]).reset_index(drop=True)
    names = _segment_names(prefix)
    rests = [k[len(prefix) + 1 :] for k in cols]
    if names is None or any(r.count("/") + 1 != len(names) for r in rests):
        names = ("key",)
        parts = {k: (r,) for k, r in zip(cols, rests)}
    else:
        parts = {k: tuple(r.split("/")) for k, r in zip(cols, rests)}
    for i, name in enumerate(names):
        long.insert(len(ids) + i, name, long["_key"].map(lambda k, i=i: parts[k][i]))
    long = long.drop(columns="_key")
    order = [c for c in ("run", "run_dir", "step", *names) if c in long.columns]
    return long.sort_values(order, kind="stable").reset_index(drop=True)


# ---------------------------------------------------------------- which runs may be averaged


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
