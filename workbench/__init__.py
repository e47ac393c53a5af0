"""HACPO workbench: heterogeneous agent collaborative RL on transformers models.

The math lives in small pure modules (`capability`, `advantages`, `losses`, re-exported by `workbench.hacpo`);
agents, rollouts, tasks and the trainer sit above them; plots, widgets and the notebook runner at the top.
Importing `workbench` itself is cheap: nothing heavy is imported here.
"""

__version__ = "0.1.0"
