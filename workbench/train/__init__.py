"""Layer 4: training: the trainer (Algorithm 1), evaluation, checkpoints and run directories."""

from workbench.train.trainer import Trainer, TrainingError, train

__all__ = ["Trainer", "TrainingError", "train"]
