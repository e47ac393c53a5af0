"""Why a learner did what it did: a run's per-source signals over steps, beside the samples of one prompt.

When a run surprises (an agent falls under HACPO), these read what its logs hold, per learner and source:

| panel | what it shows (keys of ``docs/metrics.md``) |
|---|---|
| advantage sum | Σ of the learner's advantages of each source's rows per step (``adv_src/…/sum``): own rows |
| | under Eq. 6 need not sum to 0 |
| gradient share | share of each source's rows that carried gradient (``grad_frac/``; runs logged before it: |
| | ``is/…/in_range_frac`` of the forwarded shared rows) |
| ω and P̂ | the coefficient of the partner's rows in each learner's loss (``omega_loss/``; before it: the |
| | capability ratio ``omega/``) and every agent's P̂ (``capability/``) |
| length ratio | each agent's mean response length over its partner's, in characters |
| | (``train/length_chars/``) |
| held-out by difficulty | greedy accuracy per difficulty value (embedded task: number of operations), from |
| | ``eval_items.csv`` and the task's items |

`signals_frame` gathers them in one long frame (``panel, series, step, value`` per run), `difficulty_frame`
the held-out accuracy by difficulty (from each run's per-item results, so runs logged before the
``eval_difficulty/`` keys existed have it too), `workbench.lab.plots.diagnostics_chart` draws them as one
figure (a column per run, a row per panel) and `prompt_samples` lists every logged answer to one prompt of
one step with each learner's advantage and ratio. Runs logged before a key existed show the panels they have.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from workbench.config.checks import ConfigError
from workbench.config.experiment import from_dict
from workbench.config.loading import read_run_config
from workbench.config.methods import method_label
from workbench.core import io as wio
from workbench.lab.frames import find_run_dirs, load_runs
from workbench.lab.items import load_eval_items
from workbench.tasks.metrics import accuracy_by_difficulty
from workbench.tasks.sources import load_tasks

__all__ = [
    "PANELS",
    "arm_table",
    "difficulty_frame",
    "item_difficulty",
    "pick_runs",
    "prompt_samples",
    "run_label",
    "run_labels",
    "signals_frame",
]

log = logging.getLogger(__name__)

PANELS = ("advantage sum", "gradient share", "ω and P̂", "length ratio", "held-out by difficulty")
"""The panels of `signals_frame`, in the order `workbench.lab.plots.diagnostics_chart` draws them."""

_FRAME_COLUMNS = ["run", "label", "step", "panel", "series", "value"]


def run_label(run_dir: Path | str) -> str:
    """``"<method label>, seed <s>"`` of a run (a column title of `workbench.lab.plots.diagnostics_chart`)."""
    cfg = read_run_config(run_dir)
    return f"{method_label(str(cfg.get('label') or cfg.get('algorithm', '')))}, seed {cfg.get('seed')}"


def pick_runs(run_dirs: Iterable[Path], methods: Iterable[str] = (), seed: int | None = None) -> list[Path]:
    """The runs of ``methods`` (config ``label``, else ``algorithm``: ``hacpo``, ``hacpo-adv``, ``gspo``...;
    empty keeps every method) and of training ``seed`` (None keeps every seed), in that order of methods."""
    wanted = list(methods)
    chosen = []
    for run_dir in run_dirs:
        cfg = read_run_config(run_dir)
        method = str(cfg.get("label") or cfg.get("algorithm", ""))
        if (not wanted or method in wanted) and (seed is None or cfg.get("seed") == seed):
            chosen.append((wanted.index(method) if wanted else 0, run_dir))
    return [run_dir for _, run_dir in sorted(chosen, key=lambda pair: pair[0])]


def run_labels(run_dirs: Iterable[Path]) -> dict[str, str]:
    """`run_label` of each run by its directory name; runs that share a label (a rerun beside the run it
    repeats) get their run id appended, so that every column and row names one run."""
    run_dirs = list(run_dirs)
    labels = {d.name: run_label(d) for d in run_dirs}
    shared = {label for label in labels.values() if list(labels.values()).count(label) > 1}
    return {name: f"{label} · {name}" if label in shared else label for name, label in labels.items()}


def item_difficulty(run_dir: Path | str) -> tuple[str, dict[str, str]]:
    """The main held-out source of a run (its ``benchmark`` in the evaluation CSVs) and each of its items'
    difficulty key (`workbench.core.types.TaskItem.difficulty`), the items drawn again as the trainer drew
    them (`workbench.train.evaluate.held_out_sets`); an empty mapping when the task gives none or the run's
    config cannot be read."""
    try:
        cfg = from_dict(read_run_config(run_dir))
    except (ConfigError, OSError, ValueError) as exc:
        log.warning("%s: no difficulty per item (%s)", run_dir, exc)
        return "", {}
    task = cfg.task
    _, source, knobs = task.held_out_sources()[0]
    if not task.eval_size:
        return source, {}
    seed = cfg.seed if task.eval_seed is None else task.eval_seed
    items = load_tasks(source, split="test", n=task.eval_size, seed=seed, **knobs)
    return source, {item.id: item.difficulty for item in items if item.difficulty}


def difficulty_frame(paths: Iterable[Path | str] | Path | str) -> pd.DataFrame:
    """Held-out accuracy by difficulty of every run at every evaluation step, from its ``eval_items.csv``.

    Returns:
        Columns ``run, label, step, agent, difficulty, items, greedy_acc`` and ``avg@k`` where the runs
        sampled; empty when no run's task gives a difficulty.
    """
    rows = []
    run_dirs = find_run_dirs(paths)
    labels = run_labels(run_dirs)
    for run_dir in run_dirs:
        source, difficulty_of = item_difficulty(run_dir)
        if not difficulty_of:
            continue
        items = load_eval_items(run_dir)
        label = labels[run_dir.name]
        for (step, agent), group in items[items["benchmark"] == source].groupby(["step", "agent"], sort=True):
            records = group.astype(object).where(group.notna(), None).to_dict("records")
            for difficulty, values in accuracy_by_difficulty(records, difficulty_of).items():
                row = {"run": run_dir.name, "label": label, "step": int(step), "agent": agent}
                rows.append(row | {"difficulty": difficulty} | values)
    return pd.DataFrame(rows)


def _pairs(df: pd.DataFrame, prefix: str) -> list[tuple[str, str, str]]:
    """``(column, first, second)`` of every ``<prefix>/<first>/<second>[/...]`` column of ``df``."""
    out = []
    for column in df.columns:
        if isinstance(column, str) and column.startswith(prefix + "/"):
            parts = column[len(prefix) + 1 :].split("/")
            if len(parts) >= 2:
                out.append((column, parts[0], parts[1]))
    return out


def _series(wide: pd.DataFrame, panel: str, columns: dict[str, str]) -> list[pd.DataFrame]:
    """Long rows of one panel: each ``{series name: column}`` of ``wide`` with its values per step."""
    parts = []
    for series, column in columns.items():
        part = wide[["run", "step", column]].dropna().rename(columns={column: "value"})
        parts.append(part.assign(panel=panel, series=series))
    return parts


def _source_name(learner: str, source: str) -> str:
    return f"{learner} ← own" if learner == source else f"{learner} ← {source}"


def signals_frame(paths: Iterable[Path | str] | Path | str) -> pd.DataFrame:
    """Every panel (`PANELS`) as one long frame, one row per run, step, panel and series.

    Returns:
        Columns ``run, label, step, panel, series, value`` (`PANELS`; ``series`` names a learner and source,
        an agent, or an agent and difficulty value).
    """
    run_dirs = find_run_dirs(paths)
    wide = load_runs(run_dirs)
    parts: list[pd.DataFrame] = []
    if len(wide):
        cols = set(wide.columns)
        sums = {_source_name(k, s): c for c, k, s in _pairs(wide, "adv_src") if c.endswith("/sum")}
        parts += _series(wide, PANELS[0], sums)
        grad = {_source_name(k, s): c for c, k, s in _pairs(wide, "grad_frac")}
        if not grad:  # logged before grad_frac: the in-band share of the forwarded shared rows
            in_band = [(c, k, s) for c, k, s in _pairs(wide, "is") if c.endswith("/in_range_frac")]
            grad = {_source_name(k, s) + " (forwarded rows)": c for c, k, s in in_band}
        parts += _series(wide, PANELS[1], grad)
        omega = {f"ω in {k}'s loss ← {s}": c for c, k, s in _pairs(wide, "omega_loss") if k != s}
        if not omega:  # logged before omega_loss: the capability ratio the loss would take, P̂_s / P̂_k
            omega = {f"P̂ {s} / P̂ {k}": c for c, s, k in _pairs(wide, "omega") if k != s}
        agents = sorted(c.split("/", 1)[1] for c in cols if c.startswith("capability/"))
        parts += _series(wide, PANELS[2], omega | {f"P̂ {a}": f"capability/{a}" for a in agents})
        lengths = sorted(c for c in cols if c.startswith("train/length_chars/"))
        for column in lengths:
            agent = column.rsplit("/", 1)[1]
            others = [c for c in lengths if c != column]
            if others:
                ratio = wide[column] / wide[others].mean(axis=1)
                part = wide[["run", "step"]].assign(value=ratio).dropna()
                parts.append(part.assign(panel=PANELS[3], series=f"{agent} / partner"))
    by_difficulty = difficulty_frame(run_dirs)
    if len(by_difficulty):
        part = by_difficulty.rename(columns={"greedy_acc": "value"})
        part["series"] = part["agent"] + " · " + part["difficulty"].astype(str)
        parts.append(part[["run", "step", "series", "value"]].assign(panel=PANELS[4]))
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=_FRAME_COLUMNS)
    frame = pd.concat(parts, ignore_index=True)
    frame["label"] = frame["run"].map(run_labels(run_dirs))
    return frame[_FRAME_COLUMNS].sort_values(["run", "panel", "series", "step"], kind="stable")


def prompt_samples(run_dir: Path | str, step: int, prompt: int = 0) -> pd.DataFrame:
    """Every logged answer to one prompt of one step (``samples/step_*.jsonl``), every author's.

    Returns:
        Columns ``author, text, reward, grade, length`` and, per learner that trained on it,
        ``<learner> advantage`` and ``<learner> ratio``; sorted by author. Empty when the step logged no
        answer to that prompt.
    """
    path = Path(run_dir) / "samples" / f"step_{step:06d}.jsonl"
    rows = [r for r in wio.read_jsonl(path) if int(str(r.get("id", "0/0/0")).split("/")[1]) == prompt]
    out = []
    for row in rows:
        shown = {k: row.get(k) for k in ("author", "text", "reward", "grade", "length")}
        for key, values in row.items():
            if key.startswith("learner/") and isinstance(values, dict):
                learner = key.split("/", 1)[1]
                shown[f"{learner} advantage"] = values.get("advantage")
                shown[f"{learner} ratio"] = values.get("ratio")
        out.append(shown)
    return (
        pd.DataFrame(out).sort_values("author", kind="stable").reset_index(drop=True)
        if out
        else pd.DataFrame()
    )


def arm_table(paths: Iterable[Path | str] | Path | str, agent: str) -> pd.DataFrame:
    """One row per run: ``agent``'s final held-out accuracy, overall and per difficulty value, beside the
    signals a collapse would show in its logs (means over the run's steps).

    Returns:
        Columns ``label, run, step`` (the final evaluation), ``greedy``, ``avg@k`` and ``greedy <d>`` /
        ``avg@k <d>`` per difficulty value ``d``, ``length_ratio`` (the agent's mean response length in
        characters over its partners', mean over steps), and per source ``adv_sum <source>`` (Σ of the agent's
        advantages of that source's rows per step), ``grad_adv_sum <source>`` (the part that carried gradient,
        times ω in the loss) and ``grad_frac <source>`` (its share of that source's rows with gradient); NaN
        where a run did not log a key.
    """
    by_difficulty = difficulty_frame(paths)
    wide = load_runs(paths)
    rows = []
    run_dirs = find_run_dirs(paths)
    labels = run_labels(run_dirs)
    for run_dir in run_dirs:
        mine = by_difficulty[(by_difficulty["run"] == run_dir.name) & (by_difficulty["agent"] == agent)]
        run = wide[wide["run"] == run_dir.name]
        row: dict[str, object] = {"label": labels[run_dir.name], "run": run_dir.name}
        if len(mine):
            last = mine[mine["step"] == mine["step"].max()]
            row["step"] = int(last["step"].iloc[0])
            sampled = [c for c in last.columns if c.startswith("avg@")]
            weights = last["items"] / last["items"].sum()
            row["greedy"] = float((last["greedy_acc"] * weights).sum())
            for column in sampled:
                row[column] = float((last[column] * weights).sum())
            for item in last.itertuples():
                row[f"greedy {item.difficulty}"] = item.greedy_acc
                for column in sampled:
                    row[f"{column} {item.difficulty}"] = getattr(last.loc[item.Index], column)
        lengths = [c for c in run.columns if c.startswith("train/length_chars/")]
        own = f"train/length_chars/{agent}"
        if own in lengths and len(lengths) > 1:
            partners = run[[c for c in lengths if c != own]].mean(axis=1)
            row["length_ratio"] = float((run[own] / partners).mean())
        for column in run.columns:
            if column.startswith(f"adv_src/{agent}/") and column.endswith(("/sum", "/grad_sum")):
                source, stat = column.split("/")[2], column.split("/")[3]
                name = "adv_sum" if stat == "sum" else "grad_adv_sum"
                row[f"{name} {source}"] = float(run[column].mean())
            elif column.startswith(f"grad_frac/{agent}/"):
                row[f"grad_frac {column.split('/')[2]}"] = float(run[column].mean())
        rows.append(row)
    return pd.DataFrame(rows)
