"""`train`: pick or create the run directory of an experiment, resume it from its checkpoint, and train.

A run directory is reused only for the same experiment and an identical resolved config (its hash): a finished
one is returned as it is, an unfinished one resumes from its latest intact checkpoint, with every log rolled
back to that step so nothing is written twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from workbench.config.experiment import ExperimentConfig
from workbench.config.loading import load_experiment
from workbench.train.checkpoint import load_latest_checkpoint
from workbench.train.rundir import RunWriter, config_hash, create_run_dir, find_run
from workbench.train.trainer import Trainer

__all__ = ["fit", "train"]

log = logging.getLogger(__name__)


def train(
    config: ExperimentConfig | str | Path,
    *,
    overrides: list[str] | dict[str, Any] | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    resume: bool = True,
) -> Path:
    """Run an experiment and return its run directory ``results/<experiment>/<run-id>/``.

    With ``resume=True`` a run of the same experiment and identical resolved config continues from its
    latest intact checkpoint, and a finished one is returned as it is (nothing is recomputed).

    Args:
        config: A config object or the path of an experiment YAML.
        overrides: ``["train.steps=5", ...]`` applied to a YAML path.
        on_step: Called with each step's metrics.
        resume: Continue/skip a matching run instead of starting a new one.

    Returns:
        The run directory.
    """
    cfg = config if isinstance(config, ExperimentConfig) else load_experiment(config, overrides)
    cfg_dict = cfg.to_dict()
    root = Path(cfg.output.root)
    run_dir = find_run(root, cfg.experiment, config_hash(cfg_dict)) if resume else None
    if run_dir is not None and RunWriter(run_dir).is_done():
        log.info("run %s is complete with the same config; nothing to do", run_dir)
        return run_dir
    if run_dir is None:
        run_dir = create_run_dir(root, cfg.experiment, run_id=cfg.output.run_id)
    writer = RunWriter(run_dir)
    writer.write_config(cfg_dict)
    writer.write_environment()
    trainer = Trainer(cfg, run_dir, on_step=on_step)
    checkpoint = load_latest_checkpoint(run_dir)
    if checkpoint is not None:
        step, state = checkpoint
        trainer.load_state_dict(state)
        writer.rollback_to(step)
        log.info("resumed %s from step %d", run_dir, step)
    else:  # killed before the step-0 checkpoint: start over, dropping any partial step-0 logs
        writer.rollback_to(-1)
    return fit(trainer)


def fit(trainer: Trainer) -> Path:
    """Run or continue ``trainer``'s loop to ``train.steps`` (log, evaluate, checkpoint); return the run dir.

    Step 0 evaluates the initial agents and checkpoints them, so a run killed before its first save resumes
    from there. Each step's metrics are logged, then (every ``save_every`` steps and at the end) a checkpoint
    is written, then ``on_step`` is called.
    """
    t, writer = trainer.cfg.train, trainer.writer
    if trainer.step == 0:
        metrics = trainer.evaluate()
        writer.log_metrics(0, metrics)
        trainer.save()
        _notify(trainer, 0, metrics)
    progress = tqdm(total=t.steps, initial=trainer.step, desc=trainer.cfg.experiment, unit="step")
    while trainer.step < t.steps:
        metrics = trainer.train_step()
        last = trainer.step == t.steps
        if (t.eval_every and trainer.step % t.eval_every == 0) or last:
            metrics |= trainer.evaluate()
        writer.log_metrics(trainer.step, metrics)
        if trainer.step % t.save_every == 0 or last:
            trainer.save()
        _notify(trainer, trainer.step, metrics)
        progress.update(1)
        progress.set_postfix({n: f"{metrics[f'train/acc/{n}']:.2f}" for n in trainer.names})
    progress.close()
    writer.mark_done({"steps": trainer.step, "agents": trainer.names})
    return trainer.run_dir


def _notify(trainer: Trainer, step: int, metrics: dict[str, float]) -> None:
    if trainer.on_step is not None:
        trainer.on_step({"step": step, **metrics})
