"""Final held-out accuracy per method over seeds, and the gain of one method over another.

Every summary of a comparison starts from the same two numbers per run, agent and metric: its last
evaluation after step 0 and its step-0 evaluation (`workbench.lab.stats.final_and_initial`), aggregated over
seeds into mean ± std with n and se by `final_accuracy`. The demo's table (`accuracy_table`), the committed
summary (``comparison.csv``, `workbench.lab.summary`) and the verdicts' unpaired fallback
(`workbench.lab.verdicts`) all read them from here.

The gain of a method over a baseline (`seed_gains`) is one definition everywhere: per seed both ran,
Δ = the method's final value − the baseline's, with the standard error sqrt(se² + se_baseline²) of the two
runs' held-out errors (conservative: runs of one seed answer the same items); over seeds it is aggregated
like any other column (`workbench.lab.stats.combine`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from workbench.lab.frames import load_evals
from workbench.lab.selection import select_runs
from workbench.lab.stats import aggregate, final_and_initial, stat_table

__all__ = ["accuracy_table", "final_accuracy", "seed_gains"]

log = logging.getLogger(__name__)


def final_accuracy(
    evals: pd.DataFrame, by: Sequence[str] = ("method",), initial_by: Sequence[str] = ()
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Final and initial held-out accuracy per group, agent and metric, mean ± std over seeds with n and se.

    Args:
        evals: ``load_evals`` rows plus the ``by`` columns.
        by: Columns naming a run's group (its method; the experiment too when several).
        initial_by: The part of ``by`` that changes the initial agent (the experiment, not the method).

    Returns:
        ``(final, initial)``: columns ``*by, agent, metric, mean, std, n, se`` and ``*initial_by, agent,
        metric, mean, std, n, se`` (`workbench.lab.stats.aggregate`).
    """
    final, initial = final_and_initial(evals, by, initial_by)
    return aggregate(final, [*by, "agent", "metric"]), aggregate(initial, [*initial_by, "agent", "metric"])


def seed_gains(
    final: pd.DataFrame, treatment: str, baseline: str, keys: Sequence[str] = ("agent", "metric")
) -> pd.DataFrame:
    """The gain of ``treatment`` over ``baseline`` per seed both ran: Δ and its held-out standard error.

    Args:
        final: One row per run: ``method, seed, *keys, value, se`` (`workbench.lab.stats.final_and_initial`'s
            ``final``, or ``per_seed.csv`` with ``value`` and ``se`` columns).
        treatment: The ``method`` whose gain is measured.
        baseline: The ``method`` it is measured against.
        keys: Columns that, with the seed, pair a run of one method with a run of the other.

    Returns:
        ``seed, *keys, value, se`` with value = Δ and se = sqrt(se_treatment² + se_baseline²).
    """
    index = ["seed", *keys]
    mine = final[final["method"] == treatment].set_index(index)[["value", "se"]]
    theirs = final[final["method"] == baseline].set_index(index)[["value", "se"]]
    both = mine.join(theirs, rsuffix="_ref", how="inner")
    gains = pd.DataFrame(
        {"value": both["value"] - both["value_ref"], "se": (both["se"] ** 2 + both["se_ref"] ** 2) ** 0.5}
    )
    return gains.reset_index()


def _as_lists(runs: Mapping[str, Path | str | Sequence[Path | str]]) -> dict[str, list[Path]]:
    return {m: [Path(r)] if isinstance(r, str | Path) else [Path(p) for p in r] for m, r in runs.items()}


def accuracy_table(
    runs: Mapping[str, Path | str | Sequence[Path | str]],
    metrics: Sequence[str] | None = None,
    *,
    decimals: int = 3,
) -> pd.DataFrame:
    """Per agent and metric: initial accuracy, final accuracy after each method, and the gains over the last.

    Only runs that may be averaged are used (``workbench.lab.selection.select_runs``: finished, same config
    but for the seed, same code); the others are logged and listed in ``table.attrs["excluded"]``. Each cell
    is mean ± std over seeds with n and se (``workbench.lab.stats``); ``initial`` is the step-0 evaluation,
    once per seed; ``<method> − <last>`` is `seed_gains` over the seeds both share.

    Args:
        runs: ``{method: [run_dir per seed]}`` from ``workbench.jobs.compare.run_comparison`` (or one run
            dir per method).
        metrics: Eval metrics (default: ``greedy_acc`` and every ``avg@k`` logged).
        decimals: Rounding of mean, std and se.

    Returns:
        A stat table indexed by (agent, metric), columns ``(initial | <method> | <gain>, stat)``.
    """
    lists = _as_lists(runs)
    selection = select_runs([p for paths in lists.values() for p in paths])
    if len(selection.excluded):
        log.warning(
            "accuracy_table: left out %d runs:\n%s", len(selection.excluded), selection.excluded.to_string()
        )
    chosen = {p.resolve() for p in selection.runs}
    method_of = {p.resolve(): m for m, paths in lists.items() for p in paths if p.resolve() in chosen}
    evals = load_evals(sorted(method_of))
    evals = evals.assign(method=evals["run_dir"].map(lambda d: method_of.get(Path(d).resolve())))
    if metrics is None:
        present = set(evals["metric"])
        metrics = [
            m for m in ["greedy_acc", *sorted(m for m in present if m.startswith("avg@"))] if m in present
        ]
    evals = evals[evals["metric"].isin(list(metrics))]
    final, initial = final_accuracy(evals)
    names = [m for m in lists if m in set(final["method"])]
    parts = [initial.assign(column="initial"), final.rename(columns={"method": "column"})]
    per_run, _ = final_and_initial(evals)
    for name in names[:-1]:
        gains = seed_gains(per_run, name, names[-1])
        if len(gains):
            parts.append(aggregate(gains, ["agent", "metric"]).assign(column=f"{name} − {names[-1]}"))
    agg = pd.concat(parts, ignore_index=True)
    agents = list(dict.fromkeys(evals["agent"]))
    rows = [(a, m) for a in agents for m in metrics if ((agg["agent"] == a) & (agg["metric"] == m)).any()]
    present = set(agg["column"])
    columns = [c for c in ["initial", *names, *(f"{m} − {names[-1]}" for m in names[:-1])] if c in present]
    table = stat_table(
        agg, ["agent", "metric"], "column", index_order=rows, column_order=columns, decimals=decimals
    )
    table.attrs["excluded"] = selection.excluded
    return table
