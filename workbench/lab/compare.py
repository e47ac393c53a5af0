"""Run one experiment under several algorithms and compare the agents' held-out accuracy.

This is the main job (``make demo``): HACPO against the GSPO baseline at the same rollout cost, on the same
agents, prompts and seed, then a table per agent of initial, GSPO and HACPO accuracy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.config.checks import ConfigError
from workbench.config.experiment import ExperimentConfig
from workbench.config.loading import load_experiment, parse_overrides
from workbench.config.methods import ALGORITHMS
from workbench.lab.frames import load_evals

__all__ = ["ShortRun", "accuracy_table", "run_comparison", "run_experiments"]


def run_comparison(
    config: str | Path,
    algorithms: Sequence[str] = ("hacpo", "gspo"),
    *,
    overrides: list[str] | dict[str, Any] | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Path]:
    """Train the experiment once per algorithm (resuming or skipping finished runs).

    Args:
        config: Experiment YAML.
        algorithms: Names in ``workbench.config.methods.ALGORITHMS``; each run overrides ``algorithm``.
        overrides: Extra ``key=value`` overrides applied to every run.
        on_step: Forwarded to :func:`workbench.train.run.train`, with ``algorithm`` added to each dict.

    Returns:
        ``{algorithm: run_dir}``.

    Raises:
        ConfigError: An unknown algorithm, or a config that is invalid under one of them (checked for all
            before the first run trains).
    """
    from workbench.train.run import train

    unknown = [a for a in algorithms if a not in ALGORITHMS]
    if unknown:
        raise ConfigError(f"unknown algorithm {unknown[0]!r}; valid: {list(ALGORITHMS)}")
    if not algorithms:
        return {}
    # The YAML is read once; each algorithm's config is a validated copy of it.
    cfg = load_experiment(config, parse_overrides(overrides) | {"algorithm": algorithms[0]})
    configs = {a: _with_algorithm(cfg, a, config) for a in algorithms}
    runs = {}
    for algorithm, algo_cfg in configs.items():
        callback = None if on_step is None else (lambda m, a=algorithm: on_step({"algorithm": a, **m}))
        runs[algorithm] = train(algo_cfg, on_step=callback)
    return runs


def _with_algorithm(cfg: ExperimentConfig, algorithm: str, path: str | Path) -> ExperimentConfig:
    try:
        return dataclasses.replace(cfg, algorithm=algorithm)
    except ConfigError as exc:
        raise ConfigError(f"{path} (algorithm: {algorithm}): {exc}") from None


def run_experiments(
    configs: Sequence[str | Path],
    *,
    overrides: list[str] | dict[str, Any] | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Path]:
    """Train several experiment YAMLs (e.g. the ablations) with shared overrides.

    Args:
        configs: YAML files, or folders whose ``*.yaml`` files are all taken (sorted by name).
        overrides: ``key=value`` overrides applied to every experiment.
        on_step: Forwarded to :func:`workbench.train.run.train`, with ``algorithm`` (the label) added.

    Returns:
        ``{method label: run_dir}`` (the label is ``label`` or the algorithm of each config).
    """
    from workbench.train.run import train

    base = parse_overrides(overrides)
    paths = [p for c in map(Path, configs) for p in (sorted(c.glob("*.yaml")) if c.is_dir() else [c])]
    by_method: dict[str, ExperimentConfig] = {}
    for path in paths:  # every config is validated before the first run trains
        cfg = load_experiment(path, base)
        if cfg.method in by_method:
            raise ConfigError(f"{path}: method label {cfg.method!r} is used twice; set a distinct 'label'")
        by_method[cfg.method] = cfg
    runs = {}
    for method, cfg in by_method.items():
        callback = None if on_step is None else (lambda m, a=method: on_step({"algorithm": a, **m}))
        runs[method] = train(cfg, on_step=callback)
    return runs


def accuracy_table(runs: dict[str, Path], metric: str = "greedy_acc") -> pd.DataFrame:
    """Per agent: initial accuracy (step 0) and the final accuracy after each algorithm.

    Args:
        runs: ``{algorithm: run_dir}`` from :func:`run_comparison`.
        metric: Eval metric (``greedy_acc`` by default).

    Returns:
        A DataFrame indexed by agent with columns ``initial`` and one per algorithm, plus
        ``<algorithm> − <first>`` gain columns when there are two or more algorithms.
    """
    evals = load_evals(list(runs.values()))
    evals = evals[evals["metric"] == metric]
    table = pd.DataFrame()
    for algorithm, run_dir in runs.items():
        rows = evals[evals["run_dir"].map(lambda d: Path(d).resolve()) == Path(run_dir).resolve()]
        if rows.empty:
            continue
        by_step = rows.groupby(["agent", "step"])["value"].mean().unstack("step")
        if "initial" not in table:
            table["initial"] = by_step[by_step.columns.min()]
        table[algorithm] = by_step[by_step.columns.max()]
    names = [a for a in runs if a in table]
    if len(names) >= 2:
        for algorithm in names[:-1]:
            table[f"{algorithm} − {names[-1]}"] = table[algorithm] - table[names[-1]]
    table.index.name = "agent"
    return table


_TUNING_KEYS = ("alpha", "delta", "delta_step", "window", "min_ratio", "max_ratio")


class ShortRun:
    """The "launch short run" callable of ``widgets.TuningPanel``: trains ``config`` with the panel's values.

    Args:
        config: Experiment YAML.
        overrides: Extra overrides (e.g. ``runner.run_overrides(smoke, results_root)``).
        on_step: Receives each step's metrics; :meth:`attach` sets it to a monitor's ``on_step``.
    """

    def __init__(
        self,
        config: str | Path,
        *,
        overrides: list[str] | dict[str, Any] | None = None,
        on_step: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.config, self.overrides, self.on_step = config, parse_overrides(overrides), on_step
        self.run_dir: Path | None = None

    def attach(self, monitor: Any) -> ShortRun:
        """Stream the run into ``monitor.on_step`` (a ``widgets.RunMonitor``)."""
        self.on_step = monitor.on_step
        return self

    def __call__(self, params: dict[str, Any]) -> Path:
        """Train with ``params`` (``hacpo`` keys from ``_TUNING_KEYS`` and ``steps``); returns the run dir."""
        from workbench.train.run import train

        chosen = {f"hacpo.{k}": params[k] for k in _TUNING_KEYS if k in params}
        if "steps" in params:
            chosen["train.steps"] = params["steps"]
        cfg = load_experiment(self.config, {**self.overrides, **chosen})
        self.run_dir = train(cfg, on_step=self.on_step)
        return self.run_dir
