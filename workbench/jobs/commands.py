"""The bodies of ``python -m workbench run`` and ``summarize`` (`workbench.__main__` parses the arguments).

- ``run``: every seed's run directory and whether it starts, resumes or is skipped, said before anything loads
  (also with ``--dry-run``); then training, each run's held-out table at the end (`held_out_table`);
- ``summarize``: the summary beside the runs (``RUNS/summary``) unless ``--out`` says otherwise, never over a
  summary committed to git without ``--force``; it prints the comparison table it wrote.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import subprocess
from pathlib import Path

import pandas as pd

from workbench.config.checks import ConfigError
from workbench.core.env import PROJECT_ROOT, project_path

__all__ = ["committed_files", "held_out_table", "run_command", "split_experiment", "summarize_command"]

log = logging.getLogger("workbench")


def split_experiment(experiment: str | None, overrides: list[str]) -> tuple[str, list[str]]:
    """The YAML path and the ``key=value`` overrides, whichever order they came in (``--set k=v PATH``:
    argparse hands the path to ``--set``).

    Raises:
        ConfigError: No path, or two after ``--set``.
    """
    if experiment:
        return experiment, list(overrides)  # a bad pair is named by `parse_overrides`
    paths = [item for item in overrides if "=" not in item]
    if len(paths) != 1:
        raise ConfigError(
            f"EXPERIMENT = {paths!r} is not allowed: one experiment YAML, before or after --set key=value ..."
        )
    return paths[0], [item for item in overrides if "=" in item]


def held_out_table(run_dir: Path) -> str:
    """A run's held-out results as Markdown: per agent, benchmark and metric, the value at step 0 and at its
    last evaluation (``evals.csv``); empty when it has none."""
    path = run_dir / "evals.csv"
    if not path.is_file():
        return ""
    evals = pd.read_csv(path)
    if evals.empty:
        return ""
    last = int(evals["step"].max())
    table = evals[evals["step"].isin([0, last])].pivot_table(
        index=["agent", "benchmark", "metric"], columns="step", values="value", aggfunc="first"
    )
    lines = [f"| agent | benchmark | metric | step 0 | step {last} |", "|---|---|---|---|---|"]
    for (agent, benchmark, metric), row in table.iterrows():
        cells = [f"{row.get(s):.3f}" if pd.notna(row.get(s)) else "—" for s in (0, last)]
        lines.append(f"| {agent} | {benchmark} | {metric} | {' | '.join(cells)} |")
    return "\n".join(lines)


def run_command(args: argparse.Namespace) -> int:
    """``run``: check the experiment, say what each seed's run does and where, train, show held-out tables."""
    import yaml

    from workbench.config.experiment import expand_seeds
    from workbench.config.loading import load_experiment
    from workbench.train.preflight import check_experiment
    from workbench.train.run import plan_run

    experiment, overrides = split_experiment(args.experiment, args.set)
    cfg = load_experiment(project_path(experiment), overrides)
    if args.seeds:
        cfg = dataclasses.replace(cfg, seeds=args.seeds)
    check_experiment(cfg)
    configs = expand_seeds(cfg)
    plans = [plan_run(c, resume=not args.fresh, reuse_other_code=args.reuse_other_code) for c in configs]
    if args.dry_run:
        log.info("%s", yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True).rstrip())
        log.info(
            "# checked: no bad input; would train %d run(s), seeds %s",
            len(configs),
            [c.seed for c in configs],
        )
    for seed_cfg, plan in zip(configs, plans):
        log.info("%s%s", "# " if args.dry_run else "", plan.describe(seed_cfg.seed))
    if args.dry_run:
        return 0
    from workbench.train.run import train
    from workbench.train.tracking import Tracker

    for seed_cfg in configs:
        with Tracker(seed_cfg) as tracker:
            run_dir = train(
                seed_cfg,
                on_step=tracker.on_step,
                resume=not args.fresh,
                reuse_other_code=args.reuse_other_code,
            )
        log.info("\nrun directory (seed %d): %s", seed_cfg.seed, run_dir)
        table = held_out_table(run_dir)
        if table:
            log.info("held-out accuracy:\n%s", table)
    return 0


def committed_files(folder: Path) -> list[str]:
    """Files under ``folder`` that git tracks in the project (none when it is outside it or git is absent)."""
    try:
        folder.resolve().relative_to(PROJECT_ROOT)
        out = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), "ls-files", "--", str(folder.resolve())],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
    except (ValueError, OSError, subprocess.SubprocessError):
        return []
    return out.stdout.split()


def summarize_command(args: argparse.Namespace) -> int:
    """``summarize``: write the summary (beside the runs by default), print its comparison table."""
    from workbench.lab.frames import find_run_dirs
    from workbench.lab.results_section import update_readme
    from workbench.lab.summary import write_summary

    roots = [project_path(r) for r in args.results_root]
    out = Path(args.out) if args.out else roots[0] / "summary"
    for given, root in zip(args.results_root, roots, strict=True):
        if not (root.is_dir() and find_run_dirs([root])):
            raise ConfigError(f"RESULTS_ROOT = {given!r} is not allowed: it holds no run directory")
    run_dirs = find_run_dirs(roots)
    same_code = [v.strip() for v in (args.same_code or "").split(",") if v.strip()]
    tracked = committed_files(out)
    if tracked and not args.force:
        raise ConfigError(
            f"--out = {str(out)!r} is not allowed: it holds a committed summary ({len(tracked)} files "
            f"tracked by git, e.g. {tracked[0]}); write elsewhere (--out DIR, default RESULTS_ROOT/summary) "
            "or pass --force to replace it"
        )
    committed = _committed_comparison(args.check_against, out) if args.check_against else None
    try:
        files = write_summary(run_dirs, out, same_code=same_code)
    except ValueError as exc:  # nothing finished, or one code version to pool: the message says which
        raise ConfigError(f"RESULTS_ROOT = {' '.join(args.results_root)!r}: {exc}") from None
    log.info("summary of %d run directories:", len(run_dirs))
    for path in files:
        log.info("  %s", path)
    if (out / "comparison.md").is_file():
        log.info("\n%s", (out / "comparison.md").read_text(encoding="utf-8").rstrip())
    if args.readme:
        log.info("updated %s", update_readme(project_path(args.readme), out))
    if committed is not None:
        from workbench.lab.rerun import rerun_check_line, rerun_check_markdown, write_rerun_check

        check, path = write_rerun_check(committed, out)
        log.info(
            "\nthis summary against %s (each mean within 2 SE of the committed one):\n", args.check_against
        )
        log.info("%s", "\n".join(rerun_check_markdown(check)))
        log.info("\n%s\nwrote %s", rerun_check_line(check), path)
    elif (out / "rerun_check.csv").is_file():  # a check of an earlier summary in this folder: stale now
        (out / "rerun_check.csv").unlink()
        log.info("removed %s (it checked the summary this one replaced)", out / "rerun_check.csv")
    return 0


def _committed_comparison(given: str, out: Path) -> pd.DataFrame:
    """The ``comparison.csv`` of ``--check-against`` (a file, or the summary folder holding it), read before
    anything is written; refused when it is missing, unreadable, or the very file this summary overwrites."""
    from workbench.lab.rerun import read_comparison

    path = project_path(given)
    path = path / "comparison.csv" if path.is_dir() else path
    if not path.is_file():
        where = "" if str(path) == given else f" ({path})"
        raise ConfigError(
            f"--check-against = {given!r} is not allowed: no such file{where}; a comparison.csv written by "
            "summarize, or its folder (e.g. results/summary/comparison.csv)"
        )
    if path.resolve() == (out / "comparison.csv").resolve():
        raise ConfigError(
            f"--check-against = {given!r} is not allowed: it is the comparison.csv this summary would "
            f"overwrite (--out {out}); summarize the rerun elsewhere, e.g. --out /tmp/rerun-summary"
        )
    try:
        return read_comparison(path)
    except ValueError as exc:  # empty, not a CSV (or not UTF-8), or not a comparison
        raise ConfigError(f"--check-against = {given!r} is not allowed: {exc}") from None
