"""Train experiments under several methods and seeds: the runs a comparison is made of.

This is the main job (``make demo``): HACPO against the GSPO baseline at the same rollout cost, on the same
agents and prompts, once per seed (one run directory each). The table of the comparison (initial and final
accuracy after each method, mean ± std over seeds) is read from the runs by
`workbench.lab.accuracy.accuracy_table`. `ShortRun` is the tuning panel's "launch short run".
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from workbench.config.checks import ConfigError
from workbench.config.experiment import ExperimentConfig, expand_seeds
from workbench.config.loading import load_experiment, parse_overrides
from workbench.config.methods import METHODS
from workbench.train.run import train

__all__ = ["ShortRun", "run_comparison", "run_experiments", "run_regime", "run_seeds"]

log = logging.getLogger(__name__)

OnStep = Callable[[dict[str, Any]], None]


def _with(cfg: ExperimentConfig, where: str | Path, **changes: Any) -> ExperimentConfig:
    try:
        return dataclasses.replace(cfg, **changes)
    except ConfigError as exc:
        described = ", ".join(f"{k}: {v}" for k, v in changes.items())
        raise ConfigError(f"{where} ({described}): {exc}") from None


def _seeded(cfg: ExperimentConfig, seeds: Sequence[int] | None, where: str | Path) -> list[ExperimentConfig]:
    """One config per seed: ``seeds`` if given, else the config's ``seeds``, else its ``seed``."""
    if seeds is not None:
        cfg = _with(cfg, where, seeds=tuple(seeds))
    return expand_seeds(cfg)


def _train_all(jobs: list[tuple[str, ExperimentConfig]], on_step: OnStep | None) -> dict[str, list[Path]]:
    """Train ``(method, config)`` jobs in order; ``on_step`` gets ``algorithm`` and ``seed`` added."""
    runs: dict[str, list[Path]] = {}
    for method, cfg in jobs:
        callback = None
        if on_step is not None:
            callback = lambda m, a=method, s=cfg.seed: on_step({"algorithm": a, "seed": s, **m})  # noqa: E731
        runs.setdefault(method, []).append(train(cfg, on_step=callback))
    return runs


def run_seeds(cfg: ExperimentConfig, *, on_step: OnStep | None = None) -> list[Path]:
    """Train one config once per seed of ``cfg.seeds`` (or once, with ``cfg.seed``); one run dir per seed.

    Each seed resumes or skips its own matching run (``workbench.train.run.train``).
    """
    return _train_all([(cfg.method, c) for c in expand_seeds(cfg)], on_step).get(cfg.method, [])


def run_comparison(
    config: str | Path,
    methods: Sequence[str] = ("hacpo", "gspo"),
    *,
    seeds: Sequence[int] | None = None,
    overrides: list[str] | dict[str, Any] | None = None,
    on_step: OnStep | None = None,
) -> dict[str, list[Path]]:
    """Train the experiment once per method and seed (resuming or skipping finished runs).

    A method is an algorithm (``hacpo``, ``gspo``...) or an ablation of one (``hacpo-adv``...): its run sets
    ``algorithm``, and for an ablation its ``label`` and ``hacpo`` switches too (`workbench.config.methods`).
    Seeds are the outer loop, so an interrupted comparison has every method of the first seeds.

    Args:
        config: Experiment YAML.
        methods: Names in ``workbench.config.methods.METHODS``.
        seeds: Seeds to run (``[0, 1, 2]``); None = the config's ``seeds``, else ``[seed]``.
        overrides: Extra ``key=value`` overrides applied to every run.
        on_step: Forwarded to :func:`workbench.train.run.train`, with ``algorithm`` (the method) and ``seed``
            added.

    Returns:
        ``{method: [run_dir per seed]}``.

    Raises:
        ConfigError: An unknown method, bad seeds, or a config that is invalid under one of the methods (all
            checked before the first run trains).
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"unknown method {unknown[0]!r}; valid: {list(METHODS)}")
    if not methods:
        return {}
    base = parse_overrides(overrides)
    per_method = {
        m: _seeded(load_experiment(config, base | _method_overrides(m)), seeds, config) for m in methods
    }
    n = len(per_method[methods[0]])
    return _train_all([(m, per_method[m][i]) for i in range(n) for m in methods], on_step)


def _method_overrides(name: str) -> dict[str, Any]:
    """The config keys a method sets: its ``algorithm``; for an ablation, its ``label`` and switches."""
    method = METHODS[name]
    if method.is_algorithm:
        return {"algorithm": name}
    return {"algorithm": method.algorithm, "label": name} | {
        f"hacpo.{k}": v for k, v in method.switches.items()
    }


def run_regime(
    config: str | Path,
    prompts: Sequence[int] = (4, 8, 16, 32),
    methods: Sequence[str] = ("hacpo", "gspo"),
    *,
    seeds: Sequence[int] | None = None,
    overrides: list[str] | dict[str, Any] | None = None,
    on_step: OnStep | None = None,
) -> dict[str, list[Path]]:
    """One comparison (`run_comparison`) per number of prompts a step P, the regime study of
    `workbench.lab.regime`: experiment ``<name>-p<P>`` (``<name>``: the config's experiment), ``P`` prompts a
    step in mini-batches of P/2 (the same number of updates at every P), everything else as the config and
    ``overrides`` say.

    Returns:
        ``{method: [run_dir per P and seed]}``.
    """
    base = parse_overrides(overrides)
    name = load_experiment(config, base).experiment
    runs: dict[str, list[Path]] = {}
    for P in prompts:
        chosen = base | {
            "experiment": f"{name}-p{P}",
            "train.prompts_per_step": P,
            "train.minibatch_prompts": max(1, P // 2),
        }
        for method, paths in run_comparison(
            config, methods, seeds=seeds, overrides=chosen, on_step=on_step
        ).items():
            runs.setdefault(method, []).extend(paths)
    return runs


def run_experiments(
    configs: Sequence[str | Path],
    *,
    seeds: Sequence[int] | None = None,
    overrides: list[str] | dict[str, Any] | None = None,
    on_step: OnStep | None = None,
) -> dict[str, list[Path]]:
    """Train several experiment YAMLs (e.g. the ablations) with shared overrides, once per seed.

    Args:
        configs: YAML files, or folders whose ``*.yaml`` files are all taken (sorted by name).
        seeds: Seeds to run for every experiment; None = each config's ``seeds``, else its ``seed``.
        overrides: ``key=value`` overrides applied to every experiment.
        on_step: Forwarded to :func:`workbench.train.run.train`, with ``algorithm`` (the label) and
            ``seed`` added.

    Returns:
        ``{method label: [run_dir per seed]}`` (the label is ``label`` or the algorithm of each config).
    """
    base = parse_overrides(overrides)
    paths = [p for c in map(Path, configs) for p in (sorted(c.glob("*.yaml")) if c.is_dir() else [c])]
    by_method: dict[str, list[ExperimentConfig]] = {}
    for path in paths:  # every config is validated before the first run trains
        cfg = load_experiment(path, base)
        if cfg.method in by_method:
            raise ConfigError(f"{path}: method label {cfg.method!r} is used twice; set a distinct 'label'")
        by_method[cfg.method] = _seeded(cfg, seeds, path)
    n = max((len(c) for c in by_method.values()), default=0)
    jobs = [(m, cfgs[i]) for i in range(n) for m, cfgs in by_method.items() if i < len(cfgs)]
    return _train_all(jobs, on_step)


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
        """Train with ``params`` (``hacpo`` keys from ``_TUNING_KEYS`` and ``steps``); returns the run dir.

        One run, with the config's ``seed`` (a short tuning run; ``seeds`` of the YAML are not expanded).
        """
        chosen = {f"hacpo.{k}": params[k] for k in _TUNING_KEYS if k in params}
        if "steps" in params:
            chosen["train.steps"] = params["steps"]
        cfg = load_experiment(self.config, {**self.overrides, **chosen, "seeds": None})
        self.run_dir = train(cfg, on_step=self.on_step)
        return self.run_dir
