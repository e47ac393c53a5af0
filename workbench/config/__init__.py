"""Layer 2: experiment configuration: frozen dataclasses, agent specs, YAML loading, overrides. No torch."""

from workbench.config.agent_spec import AgentSpec, AgentSpecError, LoraSpec
from workbench.config.experiment import (
    ALGORITHMS,
    ConfigError,
    ExperimentConfig,
    HacpoConfig,
    OutputConfig,
    TaskConfig,
    TrainConfig,
)
from workbench.config.loading import load_experiment, parse_overrides

__all__ = [
    "ALGORITHMS",
    "AgentSpec",
    "AgentSpecError",
    "ConfigError",
    "ExperimentConfig",
    "HacpoConfig",
    "LoraSpec",
    "OutputConfig",
    "TaskConfig",
    "TrainConfig",
    "load_experiment",
    "parse_overrides",
]
