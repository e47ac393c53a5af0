"""Loading any set of run directories into pandas.

`load_runs` (one row per run and step), `load_evals` (``evals.csv`` rows with run ids) and `melt_metric`
(one key family in long form, its key segments named) read what `workbench.train.rundir.RunWriter` wrote;
which of them may be averaged together is `workbench.lab.selection.select_runs`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.config.loading import read_run_config
from workbench.core import io as wio
from workbench.core.evalcsv import EVAL_COLUMNS

ID_COLUMNS = ("run", "experiment", "algorithm", "seed", "run_dir")


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
