"""Experiment tracking: each step's metrics sent to TensorBoard, Trackio or Weights & Biases, on request.

``output.report_to`` names the sinks (default: none, so nothing leaves the run directory unless asked). A
`Tracker` is a step callback: it receives the same flat metric dict that goes to ``metrics.jsonl`` and
forwards the numbers::

    with Tracker(cfg) as tracker:
        train(cfg, on_step=tracker.on_step)

Every sink stays on this machine by default:

| sink | install | where the data goes |
|---|---|---|
| ``tensorboard`` | installed with the workbench | ``<run_dir>/tensorboard/`` (``tensorboard --logdir``) |
| ``trackio`` | ``pip install trackio`` | Trackio's local database (``$TRACKIO_DIR``, default |
| | | ``~/.cache/huggingface/trackio``; ``trackio show``); a Space only with ``TRACKIO_SPACE_ID`` |
| ``wandb`` | ``pip install wandb`` | ``<run_dir>/wandb/``, offline; online only with ``WANDB_MODE=online`` |

The run directory is found on the first step (the newest run of the experiment with this exact config, the
one ``train`` just created or resumed) unless it is given.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from workbench.config.experiment import ExperimentConfig
from workbench.config.loading import config_hash
from workbench.train.rundir import find_run

__all__ = ["SINKS", "Tracker", "report_to_problem"]

log = logging.getLogger(__name__)

SINKS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "pip install -e . installs it: it is a dependency in pyproject.toml"),
    "trackio": ("trackio", "pip install trackio"),
    "wandb": ("wandb", "pip install wandb"),
}
"""Sink name -> (module that must import, how to install it). TensorBoard is a dependency of the workbench;
Trackio and W&B stay optional: a run that names one that is not installed stops before any model loads with
this hint (`report_to_problem`)."""


def report_to_problem(names: Iterable[str], field: str = "output.report_to") -> str | None:
    """What is wrong with a list of sinks (unknown, or not installed), or None."""
    names = list(names)
    unknown = [n for n in names if n not in SINKS]
    if unknown:
        return f"{field} = {names!r} is not allowed: {unknown[0]!r} is not one of {sorted(SINKS)}"
    missing = [n for n in names if importlib.util.find_spec(SINKS[n][0]) is None]
    if missing:
        return (
            f"{field} = {names!r}: {missing[0]!r} is not installed ({SINKS[missing[0]][1]}); install it or "
            f"remove it from {field}"
        )
    return None


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric metrics (``step`` and labels such as ``algorithm`` left out)."""
    out = {}
    for key, value in metrics.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


class Tracker:
    """Forwards each step's metrics to the sinks of ``cfg.output.report_to`` (or ``report_to``).

    Args:
        cfg: The experiment (names the project, the run and its config).
        run_dir: The run directory; None = found on the first step (see the module docstring).
        report_to: Sinks to use instead of ``cfg.output.report_to``.

    Raises:
        ValueError: An unknown or missing sink (`report_to_problem`).
    """

    def __init__(
        self, cfg: ExperimentConfig, run_dir: Path | None = None, *, report_to: Iterable[str] | None = None
    ) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.report_to = list(getattr(cfg.output, "report_to", ()) if report_to is None else report_to)
        problem = report_to_problem(self.report_to)
        if problem:
            raise ValueError(problem)
        self._sinks: dict[str, Any] | None = None

    def _open(self) -> dict[str, Any]:
        if self.run_dir is None:
            found = find_run(Path(self.cfg.output.root), self.cfg.experiment, config_hash(self.cfg.to_dict()))
            if found is None:
                raise RuntimeError(
                    f"no run directory of {self.cfg.experiment!r} under {self.cfg.output.root}"
                )
            self.run_dir = found
        sinks: dict[str, Any] = {}
        name, config = f"{self.cfg.method}-{self.run_dir.name}", self.cfg.to_dict()
        for sink in self.report_to:
            if sink == "tensorboard":
                from torch.utils.tensorboard import SummaryWriter

                sinks[sink] = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
            elif sink == "trackio":
                import trackio

                sinks[sink] = trackio.init(
                    project=self.cfg.experiment, name=name, config=config, resume="allow"
                )
            elif sink == "wandb":
                import wandb

                sinks[sink] = wandb.init(
                    project=self.cfg.experiment,
                    name=name,
                    config=config,
                    dir=str(self.run_dir),
                    mode=os.environ.get("WANDB_MODE", "offline"),
                    reinit=True,
                )
        log.info("tracking %s to %s", self.run_dir, ", ".join(self.report_to))
        return sinks

    def on_step(self, metrics: Mapping[str, Any]) -> None:
        """Send one step's numbers to every sink (the step callback of ``train``)."""
        if not self.report_to:
            return
        if self._sinks is None:
            self._sinks = self._open()
        step, values = int(metrics["step"]), _numbers(metrics)
        for sink, handle in self._sinks.items():
            if sink == "tensorboard":
                for key, value in values.items():
                    handle.add_scalar(key, value, step)
                handle.flush()
            else:  # trackio and wandb runs share the log(dict, step=) call
                handle.log(values, step=step)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Flush and close every sink (a finished run's trackio/wandb run ends here)."""
        for sink, handle in (self._sinks or {}).items():
            if sink == "tensorboard":
                handle.close()
            else:
                handle.finish()
        self._sinks = None
