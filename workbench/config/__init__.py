"""Layer 2: experiment configuration: frozen dataclasses, agent specs, the table of methods, YAML loading.

No torch. Every dataclass validates on construction (a :class:`ConfigError` names key, value and what is
allowed); ``METHODS`` is the one table of algorithms, baselines and ablations with their labels and colours.
"""

from workbench.config.agent_spec import AgentSpec, AgentSpecError, LoraSpec
from workbench.config.checks import ConfigError, FrozenMap
from workbench.config.experiment import (
    ExperimentConfig,
    HacpoConfig,
    OutputConfig,
    RayConfig,
    TaskConfig,
    TrainConfig,
    expand_seeds,
)
from workbench.config.loading import load_experiment, parse_overrides
from workbench.config.methods import ALGORITHMS, METHODS, Method

__all__ = [
    "ALGORITHMS",
    "METHODS",
    "AgentSpec",
    "AgentSpecError",
    "ConfigError",
    "ExperimentConfig",
    "FrozenMap",
    "HacpoConfig",
    "LoraSpec",
    "Method",
    "OutputConfig",
    "RayConfig",
    "TaskConfig",
    "TrainConfig",
    "expand_seeds",
    "load_experiment",
    "parse_overrides",
]
