"""Verdicts of a comparison: HACPO against GSPO, GSPO×2 and Naive, HACPO with byte-normalized cross ratios
(``hacpo-bytes``) against HACPO's token-normalized default, and HACPO against each of the paper's ablations of
it (``hacpo-adv``, ``hacpo-omega``, ... of `workbench.config.methods.METHODS`) that has runs, per pair, agent
and metric.

Each claim ("HACPO ≥ GSPO") *holds* when Δ = method − baseline ≥ 0 and is *resolved* when the 95% interval of
Δ excludes 0 (a Δ that cannot be computed, e.g. no seed in common, holds nothing). When every run of both
methods kept its per-item results (``eval_items.csv``), the test is paired: runs of the two methods with the
same seed answered the same held-out items, so Δ and its interval come from a hierarchical bootstrap over
seeds and items of the per-item difference (`workbench.lab.paired.paired_bootstrap`). Otherwise (runs made
before per-item results were kept) it falls back to the seeds' final values: Δ and its standard error from the
per-seed gains (`workbench.lab.accuracy.seed_gains`, the gain the demo's table shows), the interval Δ ± 2 SE
(`workbench.lab.paired.unpaired_difference`), and the verdict's ``test`` column says ``unpaired`` (items not
paired). ``docs/statistics.md`` explains both.
"""

from __future__ import annotations

import math

import pandas as pd

from workbench.config.methods import METHODS
from workbench.lab.accuracy import seed_gains
from workbench.lab.items import item_scores
from workbench.lab.paired import paired_bootstrap, unpaired_difference
from workbench.lab.stats import binomial_se, combine, format_cell

__all__ = ["CLAIMS", "VERDICT_COLUMNS", "verdict_line", "verdicts"]

CLAIMS = (
    ("hacpo", "gspo", "HACPO ≥ GSPO"),
    ("hacpo", "gspo_x2", "HACPO ≥ GSPO×2"),
    ("hacpo", "naive", "HACPO ≥ Naive"),
    ("hacpo", "naive-sym", "HACPO ≥ Naive (sym.)"),
    ("hacpo-bytes", "hacpo", "HACPO (bytes) ≥ HACPO (tokens)"),
    *(
        ("hacpo", m.name, f"HACPO ≥ {m.label}")
        for m in METHODS.values()
        if m.algorithm == "hacpo"
        and not m.is_algorithm
        and m.paper  # the paper's ablations (Tables 2-4, Fig. 4)
    ),
)
"""The claims checked per agent and metric: (method, baseline, claim), where both methods have runs."""
VERDICT_COLUMNS = (
    "experiment", "agent", "metric", "method", "claim", "hacpo_mean", "hacpo_std", "hacpo_n", "other",
    "other_mean", "other_std", "other_n", "delta", "delta_se", "ci_low", "ci_high", "p_value", "test",
    "paired_seeds", "paired_items", "holds", "resolved", "rollout_ratio",
)  # fmt: skip
"""Columns of ``verdicts.csv``; ``hacpo_*`` describe ``method`` (HACPO or a HACPO variant)."""
N_BOOT = 10_000
"""Bootstrap replicates of each paired test (seeded: the same files give the same verdicts)."""


def _paired(
    per_seed: pd.DataFrame,
    items: pd.DataFrame,
    experiment: str,
    agent: str,
    metric: str,
    method: str,
    baseline: str,
) -> dict | None:
    """The paired test of one verdict, or None when a run of either method lacks per-item results."""
    runs = per_seed[
        (per_seed["experiment"] == experiment)
        & (per_seed["agent"] == agent)
        & (per_seed["metric"] == metric)
        & per_seed["method"].isin([method, baseline])
    ][["method", "seed", "run"]]
    if items.empty or runs.empty:
        return None
    mine = items[(items["experiment"] == experiment) & (items["agent"] == agent)]
    scores = item_scores(mine[mine["run"].isin(runs["run"])], metric)
    if not set(runs["run"]) <= set(scores["run"]):
        return None
    scores = scores.merge(runs, on="run").assign(item=lambda df: df["benchmark"] + "/" + df["item"])
    result = paired_bootstrap(scores[["method", "seed", "item", "value"]], method, baseline, n_boot=N_BOOT)
    return result if result["seeds"] else None


def _unpaired(
    per_seed: pd.DataFrame, experiment: str, agent: str, metric: str, method: str, baseline: str
) -> dict:
    """The fallback test of one verdict: Δ and its standard error from the per-seed gains, Δ ± 2 SE."""
    runs = per_seed[
        (per_seed["experiment"] == experiment) & (per_seed["agent"] == agent) & (per_seed["metric"] == metric)
    ]
    runs = runs.assign(value=runs["final"], se=binomial_se(runs["final"], runs["items"]))
    gains = combine(*(seed_gains(runs, method, baseline).loc[:, c].tolist() for c in ("value", "se")))
    test = unpaired_difference(gains["mean"], gains["se"])
    return test | {"test": "unpaired", "seeds": math.nan, "items": math.nan}


def verdicts(table: pd.DataFrame, per_seed: pd.DataFrame, items: pd.DataFrame) -> pd.DataFrame:
    """One verdict per (experiment, agent, metric) and claim of `CLAIMS` whose two methods both have runs.

    Args:
        table: The comparison (``comparison.csv``): means, stds, standard errors, n and rollouts generated
            per experiment, method and agent.
        per_seed: One row per run, agent and metric (``per_seed.csv``: ``experiment, method, seed, agent,
            metric, run``...).
        items: Per-item results at each run's final evaluation (``items.csv.gz``: ``experiment, run, agent,
            benchmark, item, greedy, sampled, k``); may be empty.

    Returns:
        Columns `VERDICT_COLUMNS`; ``delta`` is the paired Δ for ``test == "paired"`` rows, else the
        difference of the means.
    """
    rows = []
    for (exp, agent), group in table.groupby(["experiment", "agent"], sort=False):
        by_method = group.set_index("method")
        for method, baseline, claim in CLAIMS:
            if method not in by_method.index or baseline not in by_method.index:
                continue
            mine, other = by_method.loc[method], by_method.loc[baseline]
            for metric, prefix in (("greedy_acc", "greedy"), (mine["avgk"], "avgk")):
                if not isinstance(metric, str) or not metric or pd.isna(mine.get(f"{prefix}_mean", math.nan)):
                    continue
                paired = _paired(per_seed, items, exp, agent, metric, method, baseline)
                ratio = mine["generated"] / other["generated"] if other["generated"] else math.nan
                if paired is None:
                    test = _unpaired(per_seed, exp, agent, metric, method, baseline)
                else:
                    test = paired | {"test": "paired"}
                rows.append(
                    {
                        "experiment": exp, "agent": agent, "metric": metric, "method": method, "claim": claim,
                        "hacpo_mean": mine[f"{prefix}_mean"], "hacpo_std": mine[f"{prefix}_std"],
                        "hacpo_n": mine["n"], "other": baseline, "other_mean": other[f"{prefix}_mean"],
                        "other_std": other[f"{prefix}_std"], "other_n": other["n"], "delta": test["delta"],
                        "delta_se": test["se"], "ci_low": test["ci_low"], "ci_high": test["ci_high"],
                        "p_value": test["p_value"], "test": test["test"], "paired_seeds": test["seeds"],
                        "paired_items": test["items"], "holds": bool(test["delta"] >= -1e-9),
                        "resolved": bool(test["resolved"]),
                        "rollout_ratio": ratio,
                    }
                )  # fmt: skip
    out = pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))
    return out.astype({"paired_seeds": "Int64", "paired_items": "Int64"})


def _noise(v: pd.Series) -> str:
    """The test's outcome in words."""
    if pd.isna(v["delta_se"]):
        return "SE unknown"
    if v["test"] == "paired":
        seeds, items = int(v["paired_seeds"]), int(v["paired_items"])
        plural = "s" if seeds != 1 else ""
        where = (
            f"{seeds} seed{plural} × {items // seeds}"
            if items % seeds == 0
            else f"{seeds} seed{plural}, {items}"
        )
        p = "p < 0.001" if v["p_value"] < 0.001 else f"p = {v['p_value']:.3f}"
        outcome = (
            "resolved (the interval excludes 0)"
            if v["resolved"]
            else "within noise (the interval includes 0)"
        )
        return f"95% CI [{v['ci_low']:+.3f}, {v['ci_high']:+.3f}], {p}, paired over {where} items; {outcome}"
    if v["resolved"]:
        return "unpaired test (no per-item results); resolved: |Δ| > 2 SE"
    return f"unpaired test (no per-item results); within noise: |Δ| ≤ 2 SE = {2 * v['delta_se']:.3f}"


def verdict_line(v: pd.Series) -> str:
    """One verdict as a Markdown bullet, in words (for README's Results section)."""
    left, right = v["claim"].split(" ≥ ")
    metric = "greedy" if v["metric"] == "greedy_acc" else v["metric"]
    mine = format_cell(v["hacpo_mean"], v["hacpo_std"], int(v["hacpo_n"]))
    theirs = format_cell(v["other_mean"], v["other_std"], int(v["other_n"]))
    if pd.isna(v["delta"]):
        return f"- {v['agent']}, {metric}: {left} vs {right}: no Δ (no seed in common) — {mine} vs {theirs}"
    sign = "≥" if v["holds"] else "<"
    ratio = "" if pd.isna(v["rollout_ratio"]) else f", at {v['rollout_ratio']:.2f}× {right}'s rollouts"
    return (
        f"- {v['agent']}, {metric}: {left} {sign} {right} on the mean — {mine} vs {theirs} "
        f"(Δ = {v['delta']:+.3f}, {_noise(v)}{ratio})"
    )
