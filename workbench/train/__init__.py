"""Layer 4: training: the trainer (Algorithm 1), evaluation, checkpoints and run directories."""

from workbench.train.run import train
from workbench.train.trainer import Trainer
from workbench.train.update import TrainingError

__all__ = ["Trainer", "TrainingError", "train"]
