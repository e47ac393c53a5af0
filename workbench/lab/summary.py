"""The committed summary of a comparison: small CSV files and their Markdown (``comparison.md``).

`write_summary` reads finished run directories (never trains), keeps the runs that may be averaged
(``workbench.lab.selection.select_runs``) and writes under ``out_dir`` (e.g. ``results/summary/``):

- ``comparison.csv``, one row per pair × method × agent: final held-out greedy and avg@k accuracy (mean,
  std, se, n seeds), the initial accuracy, rollouts generated, responses trained on, wall time;
- ``verdicts.csv``, per pair × agent × metric × claim: HACPO ≥ GSPO, ≥ GSPO×2 and ≥ Naive, Δ, its standard
  error, 95% interval and p-value (a paired test over seeds and items when per-item results exist,
  `workbench.lab.verdicts`), the rollout ratio;
- ``per_seed.csv``, one row per run × agent × metric: experiment, method, seed, the initial and final value,
  held-out items, run id, code version and the agent's starting-weights digest (every mean and std of the
  other tables can be recomputed from it);
- ``items.csv.gz``, one row per run × agent × held-out item at the run's final evaluation: greedy
  correctness and correct samples out of k (what the paired verdicts are computed from, `recompute_verdicts`);
- ``ratios_by_minibatch.csv``: mean sequence ratio and in-band share per direction and mini-batch index m
  (`workbench.lab.ratios.ratio_by_minibatch`);
- ``tokens_vs_bytes.csv`` (when ``hacpo-bytes`` runs exist), per pair × normalization × learner: in-band
  fraction of cross samples and final accuracy;
- ``excluded.csv``: runs left out and why; ``groups.csv``: per method, the code version, runs and seeds
  averaged and why that group was chosen (pooled code versions say so);
- ``curves.csv`` and ``curves_<pair>.svg``: learning curves, mean ± std over seeds (`workbench.lab.curves`);
- ``verdicts.svg``: every claim's Δ with its 95% interval (`workbench.lab.plots.verdict_chart`);
- ``comparison.md``: all of it as Markdown (`workbench.lab.results_section.render_results_section`).

`workbench.lab.rerun` then compares such a summary of a rerun with the committed ``comparison.csv`` (each mean
within 2 standard errors) into ``rerun_check.csv``.

Means and stds are over seeds; standard errors as in ``workbench.lab.stats``. A claim "holds" when Δ ≥ 0; it
is called *resolved* only when the 95% interval of Δ excludes 0, otherwise *within noise*: no significance is
claimed that the seeds and items do not show (``docs/statistics.md``). The same Markdown goes between
``<!-- results:start -->`` and ``<!-- results:end -->`` of a Markdown file (``make pairs``:
``docs/results.md``, `workbench.lab.results_section.update_readme`).
"""

from __future__ import annotations

import gzip
import logging
import math
from collections.abc import Collection, Iterable
from pathlib import Path

import pandas as pd

from workbench.config.methods import method_sort_key
from workbench.core.io import atomic_write_bytes, atomic_write_text
from workbench.lab.accuracy import final_accuracy
from workbench.lab.curves import write_curves
from workbench.lab.frames import load_evals, load_runs
from workbench.lab.items import final_items, load_eval_items, read_items_csv
from workbench.lab.plots import save_chart, verdict_chart
from workbench.lab.provenance import read_environment, start_weights
from workbench.lab.ratios import ratio_by_minibatch
from workbench.lab.results_section import render_results_section
from workbench.lab.selection import select_runs
from workbench.lab.stats import aggregate, combine, final_and_initial
from workbench.lab.verdicts import verdicts

__all__ = ["recompute_verdicts", "tokens_vs_bytes", "write_summary"]

log = logging.getLogger(__name__)

PER_SEED_COLUMNS = (
    "experiment", "method", "seed", "agent", "metric", "initial", "final", "items", "run", "code_version",
    "start_weights",
)  # fmt: skip
"""Columns of ``per_seed.csv``."""
ITEMS_FILE_COLUMNS = ("experiment", "run", "agent", "benchmark", "item", "greedy", "sampled", "k")
"""Columns of ``items.csv.gz``."""


def _metrics(evals: pd.DataFrame) -> tuple[str, str | None]:
    """``greedy_acc`` and the avg@k logged (the largest k), if any."""
    avgs = sorted((m for m in set(evals["metric"]) if m.startswith("avg@")), key=lambda m: int(m[4:]))
    return "greedy_acc", (avgs[-1] if avgs else None)


def _last_metric(runs: pd.DataFrame, key: str) -> pd.Series:
    """Per run dir: the last logged value of ``key`` (NaN when never logged)."""
    if key not in runs.columns:
        return pd.Series(dtype="float64")
    return runs.dropna(subset=[key]).groupby("run_dir")[key].last()


def _comparison(evals: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (experiment, method, agent): accuracies over seeds, cost and wall time."""
    greedy, avg = _metrics(evals)
    evals = evals.rename(columns={"algorithm": "method"})
    groups = {"by": ("experiment", "method"), "initial_by": ("experiment",)}
    accuracy, initial = final_accuracy(evals, **groups)
    final, _ = final_and_initial(evals, **groups)
    keys = ["experiment", "method", "agent"]
    table = _one_metric(accuracy, greedy, "greedy")
    table = table.merge(_one_metric(initial, greedy, "initial_greedy"), how="left")
    if avg is not None:
        table = table.merge(_one_metric(accuracy, avg, "avgk").drop(columns="avgk_n"), how="left")
        table = table.merge(_one_metric(initial, avg, "initial_avgk"), how="left")
    table.insert(3, "avgk", avg or "")
    table = table.rename(columns={"greedy_n": "n"})
    table["seeds"] = [
        " ".join(
            str(s) for s in sorted(final.loc[(final[keys] == row).all(axis=1), "seed"].unique(), key=str)
        )
        for row in table[keys].itertuples(index=False, name=None)
    ]
    method_of = final.drop_duplicates("run_dir").set_index("run_dir")["method"]
    wall = runs.groupby("run_dir")["time/step_s"].sum(min_count=1) if "time/step_s" in runs else pd.Series()
    for col, stat in (("generated_responses", "generated"), ("trained_responses", "trained")):
        values = []
        for exp, method, agent in table[keys].itertuples(index=False, name=None):
            dirs = final.loc[(final["experiment"] == exp) & (final["method"] == method), "run_dir"].unique()
            last = _last_metric(runs, f"cost/{agent}/{col}").reindex(dirs)
            values.append(last.mean())
        table[stat] = values
    walls = []
    for exp, method in table[["experiment", "method"]].itertuples(index=False, name=None):
        dirs = [d for d, m in method_of.items() if m == method and (final["run_dir"] == d).any()]
        dirs = [d for d in dirs if final.loc[final["run_dir"] == d, "experiment"].iloc[0] == exp]
        walls.append(combine(wall.reindex(dirs).tolist()) if len(wall) else combine([]))
    table["wall_s_mean"] = [w["mean"] for w in walls]
    table["wall_s_std"] = [w["std"] for w in walls]
    order = sorted(
        range(len(table)), key=lambda i: (table["experiment"][i], method_sort_key(table["method"][i]))
    )
    first = [*keys, "n", "seeds", "greedy_mean", "greedy_std", "greedy_se", "avgk"]
    return table.iloc[order].reset_index(drop=True)[[*first, *(c for c in table if c not in first)]]


def _one_metric(accuracy: pd.DataFrame, metric: str, prefix: str) -> pd.DataFrame:
    """The rows of one metric of `final_accuracy`, their statistics named ``<prefix>_mean``..."""
    chosen = accuracy[accuracy["metric"] == metric].drop(columns="metric").reset_index(drop=True)
    return chosen.rename(columns=lambda c: f"{prefix}_{c}" if c in ("mean", "std", "n", "se") else c)


def tokens_vs_bytes(
    run_dirs: Iterable[Path | str] | Path | str, *, same_code: Collection[str] = ()
) -> pd.DataFrame:
    """HACPO with token- vs byte-normalized cross ratios, per pair, normalization and learner.

    The in-band fraction (``is/<learner>/<source>/in_range_frac``: cross samples inside [lb, 1], those that
    give gradient) is averaged over each run's steps, then mean ± std over seeds; beside it the learner's
    final greedy and avg@k accuracy (mean ± std over seeds). Runs of ``hacpo`` count as ``tokens``, runs of
    ``hacpo-bytes`` as ``bytes``.

    Returns:
        Columns ``experiment, normalization, learner, source, in_band_mean, in_band_std, n, greedy_mean,
        greedy_std`` and, when logged, ``avgk, avgk_mean, avgk_std``; empty without ``hacpo-bytes`` runs
        or in-range metrics.
    """
    runs = select_runs(run_dirs, same_code=same_code).runs
    names = {"hacpo": "tokens", "hacpo-bytes": "bytes"}
    df = load_runs(runs)
    if df.empty or "hacpo-bytes" not in set(df["algorithm"]):
        return pd.DataFrame()
    df = df[df["algorithm"].isin(list(names))]
    long = df.melt(id_vars=["experiment", "algorithm", "run_dir", "step"], value_vars=_in_range_keys(df))
    long = long.dropna(subset=["value"])
    if long.empty:
        return pd.DataFrame()
    parts = long["variable"].str.split("/", expand=True)
    long = long.assign(learner=parts[1], source=parts[2])
    per_run = long.groupby(["experiment", "algorithm", "learner", "source", "run_dir"], sort=False)[
        "value"
    ].mean()
    table = aggregate(per_run.reset_index(), ["experiment", "algorithm", "learner", "source"], se=None)
    table = table.rename(columns={"mean": "in_band_mean", "std": "in_band_std"}).drop(columns="se")
    evals = load_evals(sorted({Path(d) for d in df["run_dir"]}))
    accuracy = _comparison(evals, df).rename(columns={"method": "algorithm", "agent": "learner"})
    wanted = [c for c in ("greedy_mean", "greedy_std", "avgk", "avgk_mean", "avgk_std") if c in accuracy]
    table = table.merge(accuracy[["experiment", "algorithm", "learner", *wanted]], how="left")
    table.insert(1, "normalization", table.pop("algorithm").map(names))
    return table.sort_values(["experiment", "learner", "normalization"], ascending=[True, True, False])


def _in_range_keys(df: pd.DataFrame) -> list[str]:
    return [
        c for c in df.columns if c.startswith("is/") and c.endswith("/in_range_frac") and c.count("/") == 3
    ]


def _per_seed(evals: pd.DataFrame) -> pd.DataFrame:
    """One row per run, agent and metric: its step-0 and final values (each the mean over the held-out sets,
    as `final_and_initial` takes them), held-out items per set, run id, code version, starting weights."""
    keys = ["experiment", "method", "seed", "agent", "metric", "run", "run_dir"]
    evals = evals.rename(columns={"algorithm": "method"})
    per_step = evals.groupby([*keys, "step"], dropna=False)[["value", "items"]].mean().reset_index()
    last = per_step.groupby(["run_dir", "agent", "metric"])["step"].transform("max")
    final = per_step[(per_step["step"] == last) & (last > 0)].rename(columns={"value": "final"})
    initial = per_step.loc[per_step["step"] == 0, ["run_dir", "agent", "metric", "value"]]
    table = final.merge(
        initial.rename(columns={"value": "initial"}), how="left", on=["run_dir", "agent", "metric"]
    )
    envs = {d: read_environment(d) for d in table["run_dir"].unique()}
    weights = {d: start_weights(env)[0] or {} for d, env in envs.items()}
    table["code_version"] = table["run_dir"].map(lambda d: envs[d].get("code_version"))
    table["start_weights"] = [weights[d].get(a) for d, a in zip(table["run_dir"], table["agent"])]
    table["items"] = table["items"].round().astype("Int64")
    seeds = table["seed"].astype("float64").fillna(math.inf)
    order = sorted(
        range(len(table)),
        key=lambda i: (table["experiment"].iat[i], method_sort_key(table["method"].iat[i]), seeds.iat[i]),
    )
    return table.iloc[order].reset_index(drop=True)[list(PER_SEED_COLUMNS)]


def _final_items(run_dirs: list[Path]) -> pd.DataFrame:
    """Per-item results at each run's final evaluation, `ITEMS_FILE_COLUMNS` (empty: no run kept them)."""
    items = final_items(load_eval_items(run_dirs))
    return items.reindex(columns=list(ITEMS_FILE_COLUMNS))


def recompute_verdicts(summary_dir: str | Path) -> pd.DataFrame:
    """``verdicts.csv`` recomputed from the summary's own files (``comparison.csv``, ``per_seed.csv`` and
    ``items.csv.gz``): what a reader runs to check the committed verdicts without any run directory."""
    summary_dir = Path(summary_dir)
    table = pd.read_csv(summary_dir / "comparison.csv", keep_default_na=False, na_values=[""])
    per_seed = pd.read_csv(summary_dir / "per_seed.csv", dtype={"experiment": str, "run": str, "agent": str})
    path = summary_dir / "items.csv.gz"
    items = read_items_csv(path) if path.is_file() else pd.DataFrame(columns=list(ITEMS_FILE_COLUMNS))
    return verdicts(table, per_seed, items)


def write_summary(
    run_dirs: Iterable[Path | str] | Path | str, out_dir: str | Path, *, same_code: Collection[str] = ()
) -> list[Path]:
    """Write ``comparison.csv``, ``per_seed.csv``, ``items.csv.gz`` (when runs kept per-item results),
    ``verdicts.csv``, ``excluded.csv``, ``groups.csv``, ``tokens_vs_bytes.csv`` (when such runs exist), the
    curves and ``comparison.md`` under ``out_dir``; returns the paths written. ``same_code``: code versions
    whose runs are pooled (`workbench.lab.selection.select_runs`).

    Raises:
        ValueError: No finished run to summarize (the excluded ones are named).
    """
    out_dir = Path(out_dir)
    selection = select_runs(run_dirs, same_code=same_code)
    if not selection.runs:
        reasons = (
            selection.excluded[["run_dir", "reason"]].to_string(index=False)
            if len(selection.excluded)
            else ""
        )
        raise ValueError(f"no finished run to summarize in {run_dirs}; excluded:\n{reasons}")
    evals, runs = load_evals(selection.runs), load_runs(selection.runs)
    table, per_seed, items = _comparison(evals, runs), _per_seed(evals), _final_items(selection.runs)
    files = {
        "comparison.csv": table,
        "per_seed.csv": per_seed,
        "items.csv.gz": items,
        "verdicts.csv": verdicts(table, per_seed, items),
        "excluded.csv": selection.excluded,
        "groups.csv": selection.groups.assign(
            seeds=selection.groups["seeds"].map(lambda s: " ".join(map(str, s)))
        ),
        "tokens_vs_bytes.csv": tokens_vs_bytes(selection.runs, same_code=same_code),
        "ratios_by_minibatch.csv": ratio_by_minibatch(runs),
    }
    written = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, frame in files.items():
        path = out_dir / name
        if name in ("tokens_vs_bytes.csv", "items.csv.gz", "ratios_by_minibatch.csv") and frame.empty:
            path.unlink(missing_ok=True)  # no such runs this time: no stale file either
            continue
        text = frame.round(6).to_csv(index=False)
        if name.endswith(".gz"):  # mtime 0: the same rows give the same bytes (a stable file in git)
            atomic_write_bytes(path, gzip.compress(text.encode("utf-8"), mtime=0))
        else:
            atomic_write_text(path, text)
        written.append(path)
    written += write_curves(evals, runs, out_dir)
    if not files["verdicts.csv"].dropna(subset=["delta"]).empty:
        chart = verdict_chart(
            files["verdicts.csv"], title="Δ of each claim, 95% interval (paired over seeds × items)"
        )
        written += save_chart(chart, out_dir / "verdicts", formats=("svg",))
    markdown = out_dir / "comparison.md"
    atomic_write_text(markdown, render_results_section(out_dir))
    log.info("wrote %s", ", ".join(str(p) for p in [*written, markdown]))
    return [*written, markdown]
