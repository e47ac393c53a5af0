"""`train`: pick or create the run directory of an experiment, lock it, resume from its checkpoint, and train.

A run directory is reused only for the same experiment and an identical resolved config (its hash): a finished
one is returned as it is, an unfinished one resumes from its latest intact checkpoint, with every log rolled
back to that step so nothing is written twice.

What a run survives (``docs/failures.md``):

- **one writer per run**: `train` holds the run's lock (``.run.lock``, `workbench.core.lock`) from the moment
  it picks the directory to the end; a second `train` of the same run (a notebook and a terminal,
  ``reproduce``) stops at once with `RunLockedError` naming the holder; ``resume=False`` starts a separate
  run instead;
- **storage failures** (disk full, read-only, permission denied, a file in the way) raise `StorageError`
  naming the path, the failure, the remedy and the last good checkpoint, which stays untouched. Checked before
  training too: the results root must be writable with room for one checkpoint plus a margin;
- **kills at any instant** (``kill -9``, OOM, pre-emption): the next `train` resumes from the last checkpoint;
  **Ctrl-C** does the same and logs the command that resumes.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.contrib.logging import logging_redirect_tqdm

from workbench.config.experiment import ExperimentConfig
from workbench.config.loading import config_hash, load_experiment
from workbench.core.lock import DirectoryLock
from workbench.core.machine import code_version
from workbench.core.progress import bar
from workbench.core.storage import as_storage_error, check_free_space, ensure_writable_dir, format_bytes
from workbench.train.checkpoint import (
    last_good_checkpoint,
    list_checkpoints,
    load_latest_checkpoint,
    tensor_bytes,
)
from workbench.train.rundir import RunWriter, create_run_dir, find_run, run_code_version
from workbench.train.trainer import Trainer, start_trainer

__all__ = ["RUN_LOCK", "RunPlan", "fit", "plan_run", "step_line", "train"]

log = logging.getLogger(__name__)

RUN_LOCK = ".run.lock"
"""Lock file inside a run directory, held while a process writes the run."""
_SPACE_MARGIN = 8 << 20  # bytes beyond one checkpoint: logs, samples, the filesystem's own overhead


def train(
    config: ExperimentConfig | str | Path,
    *,
    overrides: list[str] | dict[str, Any] | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    resume: bool = True,
    reuse_other_code: bool = False,
) -> Path:
    """Run an experiment and return its run directory ``results/<experiment>/<run-id>/``.

    With ``resume=True`` a run of the same experiment, identical resolved config and the same code version
    (`workbench.core.machine.code_version`: the package source) continues from its
    latest intact checkpoint, and a finished one is returned as it is (nothing is recomputed). A matching run
    made by other code is not reused: a new run starts, and a log line names the old one.

    Args:
        config: A config object or the path of an experiment YAML.
        overrides: ``["train.steps=5", ...]`` applied to a YAML path.
        on_step: Called with each step's metrics.
        resume: Continue/skip a matching run instead of starting a new one; False always starts a separate
            run (a new directory, never shared).
        reuse_other_code: Also resume or reuse a matching run made by other code (its tables then say which
            code version made it, `workbench.lab.selection.select_runs`).

    Returns:
        The run directory.

    Raises:
        RunLockedError: Another process (or call) is writing the run this call would resume; nothing written.
        StorageError: The results root is not writable, is too full, or a write failed; the message names
            the path, the failure, the remedy and the last good checkpoint (untouched).
        KeyboardInterrupt: Ctrl-C; the run is resumable and a WARNING says how.
    """
    cfg = config if isinstance(config, ExperimentConfig) else load_experiment(config, overrides)
    resume_how, separate_how = _how_to(sys.argv)
    run_dir: Path | None = None
    try:
        exp_dir = ensure_writable_dir(Path(cfg.output.root) / cfg.experiment)
        run_dir, lock = _claim_run(cfg, exp_dir, resume, separate_how, reuse_other_code)
        if lock is None:
            return run_dir
        with lock:
            return _run_locked(cfg, run_dir, on_step, resume_how)
    except OSError as err:
        storage = as_storage_error(err)
        if storage is None:
            raise
        raise storage.with_note(_checkpoint_note(run_dir)) from err


@dataclass(frozen=True)
class RunPlan:
    """What `train` would do with a config, found without writing anything (``run`` says it first)."""

    action: str
    """``start`` (a new run directory), ``resume`` (an unfinished run of this config), ``skip`` (finished)."""
    run_dir: Path
    """The run directory: the one to resume or skip, or the folder a new run goes into."""
    step: int | None = None
    """For ``resume``: the step of its last good checkpoint (None: none yet, it starts over at step 0)."""

    def describe(self, seed: int) -> str:
        """One line: ``seed 0: resume results/runs/quickstart/20261207T...-ab12 from step 20``."""
        if self.action == "skip":
            return f"seed {seed}: skip {self.run_dir} (finished with this config; --fresh starts another)"
        if self.action == "resume":
            where = f"from step {self.step}" if self.step is not None else "from step 0 (no checkpoint yet)"
            return f"seed {seed}: resume {self.run_dir} {where}"
        return f"seed {seed}: start a new run in {self.run_dir}/"


def plan_run(cfg: ExperimentConfig, *, resume: bool = True, reuse_other_code: bool = False) -> RunPlan:
    """Where `train` would write ``cfg`` and whether it would start, resume or skip (nothing is written)."""
    exp_dir = Path(cfg.output.root) / cfg.experiment
    run_dir = None
    if resume and exp_dir.is_dir():
        run_dir = _matching_run(exp_dir, cfg, config_hash(cfg.to_dict()), reuse_other_code)
    if run_dir is None:
        return RunPlan("start", exp_dir if cfg.output.run_id is None else exp_dir / cfg.output.run_id)
    if RunWriter(run_dir).is_done():
        return RunPlan("skip", run_dir)
    good = last_good_checkpoint(run_dir)
    return RunPlan("resume", run_dir, good[0] if good else None)


def _claim_run(
    cfg: ExperimentConfig, exp_dir: Path, resume: bool, separate_how: str, reuse_other_code: bool = False
) -> tuple[Path, DirectoryLock | None]:
    """Pick (resume: the newest run of this config) or create the run directory, and take its lock.

    The lock is taken before ``config.yaml`` is written, and `find_run` sees a run only through its
    ``config.yaml``: a run that another call can find is always locked by its writer first. (Two calls of a
    new config within the same few milliseconds may each create a run: two separate runs, never a shared one.)

    Returns:
        The run directory and its held lock, or ``(run_dir, None)`` for a finished run (nothing to do).
    """
    cfg_dict = cfg.to_dict()
    remedy = (
        "A run directory has one writer: wait for that run to finish, stop it, or start a separate run "
        f"({separate_how})."
    )
    run_dir = _matching_run(exp_dir, cfg, config_hash(cfg_dict), reuse_other_code) if resume else None
    if run_dir is None:
        run_dir = create_run_dir(exp_dir.parent, cfg.experiment, run_id=cfg.output.run_id)
    elif RunWriter(run_dir).is_done():
        log.info("run %s is complete with the same config; nothing to do", run_dir)
        return run_dir, None
    lock = DirectoryLock(run_dir, RUN_LOCK, what="run directory", remedy=remedy).acquire()
    try:
        if RunWriter(run_dir).is_done():  # its writer finished between our look and our lock
            lock.release()
            log.info("run %s is complete with the same config; nothing to do", run_dir)
            return run_dir, None
        RunWriter(run_dir).write_config(cfg_dict)
    except BaseException:
        lock.release()
        raise
    return run_dir, lock


def _matching_run(exp_dir: Path, cfg: ExperimentConfig, cfg_hash: str, reuse_other_code: bool) -> Path | None:
    """The run to resume or reuse: same config and, unless ``reuse_other_code``, the same code version."""
    version = None if reuse_other_code else code_version()
    run_dir = find_run(exp_dir.parent, cfg.experiment, cfg_hash, code_version=version)
    if run_dir is None and version is not None:
        other = find_run(exp_dir.parent, cfg.experiment, cfg_hash)
        if other is not None:
            log.info(
                "run %s has this config but was made by other code (code version %s, now %s): starting a new "
                "run; pass --reuse-other-code (reuse_other_code=True) to resume or reuse it instead",
                other,
                run_code_version(other),
                version,
            )
    return run_dir


def _run_locked(
    cfg: ExperimentConfig,
    run_dir: Path,
    on_step: Callable[[dict[str, Any]], None] | None,
    resume_how: str,
) -> Path:
    """Load the agents, check the free space, resume from the latest checkpoint and `fit` (lock held)."""
    writer = RunWriter(run_dir)
    writer.write_environment()
    trainer = None
    try:
        trainer = start_trainer(cfg, run_dir, on_step)
        writer.record_start({"start_weights": trainer.start_weights()})
        _check_space(trainer)
        checkpoint = load_latest_checkpoint(run_dir)
        if checkpoint is not None:
            step, state = checkpoint
            trainer.load_state_dict(state)
            writer.rollback_to(step)
            log.info("resumed %s from step %d", run_dir, step)
        else:  # killed before the step-0 checkpoint: start over, dropping any partial step-0 logs
            writer.rollback_to(-1)
        return fit(trainer)
    except KeyboardInterrupt:
        good = last_good_checkpoint(run_dir)
        kept = f"from its checkpoint of step {good[0]}" if good else "from step 0 (no checkpoint yet)"
        log.warning("interrupted: %s is resumable %s; to resume, %s", run_dir, kept, resume_how)
        raise
    finally:
        if trainer is not None:  # no agent still running when train() returns or raises
            trainer.close()


def _check_space(trainer: Trainer) -> None:
    """Refuse to train without room for one more checkpoint (+ margin); warn below what saving peaks at.

    The size is estimated from the trainable state: its tensors, plus AdamW's two moments per trainable
    weight, which exist only after the first step.
    """
    state = trainer.state_dict()
    weights = sum(tensor_bytes(v) for k, v in state.items() if k.startswith("agent_"))
    moments = sum(tensor_bytes(v) for k, v in state.items() if k.startswith("optimizer_"))
    one = tensor_bytes(state) + max(0, 2 * weights - moments)
    margin = max(_SPACE_MARGIN, one // 10)
    what = f"one checkpoint of this run ({format_bytes(one)}) plus a margin ({format_bytes(margin)})"
    free = check_free_space(trainer.run_dir, one + margin, what)
    keep = trainer.cfg.train.keep_checkpoints
    more = max(1, keep + 1 - len(list_checkpoints(trainer.run_dir))) * one
    if free < more + margin:
        log.warning(
            "%s has %s free: enough for one checkpoint (%s), but while saving the run holds %d at once "
            "(train.keep_checkpoints=%d, plus the one being written): it may stop later with a full disk",
            trainer.run_dir,
            format_bytes(free),
            format_bytes(one),
            keep + 1,
            keep,
        )


def _how_to(process_argv: list[str]) -> tuple[str, str]:
    """(how to resume, how to start a separate run), in the words of how this process was started."""
    if process_argv and (
        process_argv[0].endswith(os.path.join("workbench", "__main__.py"))
        or Path(process_argv[0]).name == "hacpo-workbench"
    ):
        args = [a for a in process_argv[1:] if a != "--fresh"]  # --fresh again would start yet another run
        command = shlex.join(["python", "-m", "workbench", *args])
        return f"run the same command again: {command}", "add --fresh to the command"
    return "call train() again with the same config", "train(..., resume=False)"


def _checkpoint_note(run_dir: Path | None) -> str:
    """Which checkpoint survives a failed write, for a `StorageError`'s message."""
    if run_dir is None:
        return "Nothing was written; fix the cause and run the same command again."
    good = last_good_checkpoint(run_dir)
    if good is None:
        return "No checkpoint was written yet; fix the cause and run the same command again."
    return (
        f"The last good checkpoint, step {good[0]} ({good[1]}), is untouched: fix the cause and run the same "
        "command again to resume from it."
    )


def fit(trainer: Trainer) -> Path:
    """Run or continue ``trainer``'s loop to ``train.steps`` (log, evaluate, checkpoint); return the run dir.

    Step 0 evaluates the initial agents and checkpoints them, so a run killed before its first save resumes
    from there; a trainer resumed from that checkpoint finds step 0 logged and goes on (each step is logged
    exactly once). Each step's metrics are logged, then (every ``save_every`` steps and at the end) a
    checkpoint is written, then ``on_step`` is called.
    """
    t, writer = trainer.cfg.train, trainer.writer
    with logging_redirect_tqdm():  # log lines print above the bars, never through them
        if trainer.step == 0 and writer.last_logged_step() < 0:
            metrics = _evaluate(trainer)
            writer.log_metrics(0, metrics)
            trainer.save()
            _notify(trainer, 0, metrics)
            log.info("%s", step_line(0, t.steps, metrics, trainer.names))
        progress = bar(t.steps, trainer.cfg.experiment, "step", initial=trainer.step, leave=True)
        while trainer.step < t.steps:
            metrics = trainer.train_step()
            last = trainer.step == t.steps
            if (t.eval_every and trainer.step % t.eval_every == 0) or last:
                metrics |= _evaluate(trainer)
            writer.log_metrics(trainer.step, metrics)
            if trainer.step % t.save_every == 0 or last:
                trainer.save()
            _notify(trainer, trainer.step, metrics)
            progress.update(1)
            progress.set_postfix({n: f"{metrics[f'train/acc/{n}']:.2f}" for n in trainer.names})
            log.info("%s", step_line(trainer.step, t.steps, metrics, trainer.names))
        progress.close()
    writer.mark_done({"steps": trainer.step, "agents": trainer.names})
    return trainer.run_dir


def _evaluate(trainer: Trainer) -> dict[str, float]:
    """`Trainer.evaluate`, with its wall time as ``time/eval_s``."""
    start = time.perf_counter()
    metrics = trainer.evaluate()
    return metrics | {"time/eval_s": time.perf_counter() - start}


def step_line(step: int, steps: int, metrics: dict[str, float], names: list[str]) -> str:
    """The step's one log line: how long each phase took, then each agent's rollout accuracy and held-out
    accuracy when evaluated (``step 3/40: rollout 12.1 s (generate 10.2, score 1.9), update 20.3 s, ...``)."""
    parts = []
    if "time/rollout_s" in metrics:
        parts.append(
            f"rollout {metrics['time/rollout_s']:.1f} s (generate {metrics['time/generate_s']:.1f}, "
            f"score {metrics['time/score_s']:.1f} agent-s), update {metrics['time/update_s']:.1f} s"
        )
    if "time/eval_s" in metrics:
        parts.append(f"eval {metrics['time/eval_s']:.1f} s")
    if "time/step_s" in metrics:
        parts.append(f"step {metrics['time/step_s'] + metrics.get('time/eval_s', 0.0):.1f} s")
    accuracy = [
        f"{n} {metrics[f'train/acc/{n}']:.2f}"
        + (f" (eval {metrics[f'eval/acc/{n}']:.3f})" if f"eval/acc/{n}" in metrics else "")
        for n in names
        if f"train/acc/{n}" in metrics
    ] or [f"{n} eval {metrics[f'eval/acc/{n}']:.3f}" for n in names if f"eval/acc/{n}" in metrics]
    return (
        f"step {step}/{steps}: "
        + ", ".join(parts)
        + ("; " if parts and accuracy else "")
        + ", ".join(accuracy)
    )


def _notify(trainer: Trainer, step: int, metrics: dict[str, float]) -> None:
    if trainer.on_step is not None:
        trainer.on_step({"step": step, **metrics})
