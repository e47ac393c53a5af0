"""Reports aggregate only comparable runs (seeds of one config and code) and list the rest in excluded.csv."""

from __future__ import annotations

import pandas as pd
from fake_runs import write_run

from workbench.lab import report


def test_benchmark_report_tables_have_mean_std_n_and_exclusions(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        write_run(
            runs, algorithm="hacpo", seed=seed, final=(0.5 + 0.1 * seed, 0.7), avg=(0.4, 0.6), train_acc=False
        )
        write_run(
            runs, algorithm="gspo", seed=seed, final=(0.4, 0.6 + 0.1 * seed), avg=(0.3, 0.5), train_acc=False
        )
    write_run(runs, algorithm="gspo", seed=2, version="01d000000000", train_acc=False)  # other code: left out
    out = tmp_path / "out"
    bench = report.benchmark_report([runs], out)
    assert {"table1", "table1_avg4"} <= set(bench.tables) and "figure3" in bench.charts
    table1 = pd.read_csv(out / "table1.csv", index_col=[0, 1])
    assert table1.loc[("a", "a (HACPO)"), "AVG_mean"] == 0.55 and table1.loc[("a", "a (HACPO)"), "AVG_n"] == 2
    assert table1.loc[("b", "b (GSPO)"), "arith_std"] == 0.071
    assert "over 2 seeds" in (out / "table1.tex").read_text()
    excluded = pd.read_csv(out / "excluded.csv")
    assert len(excluded) == 1 and excluded.loc[0, "reason"].startswith("code version 01d000000000 differs")
    assert len(bench.excluded) == 1
    by_method = report.quickstart_report({"hacpo": [runs / "model"]}, tmp_path / "quick")
    assert "train_acc" not in by_method.charts  # the fake runs log no train/acc: skipped, not an error
    assert "cost" in by_method.charts
