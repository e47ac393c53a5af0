"""Layer 3: agents: loading (tiny / embedded / path / hub, LoRA, 4-bit), rollouts, sharing, the tiny zoo.

transformers, peft and bitsandbytes are imported in this layer only (lazily, inside the functions that load).
"""

from workbench.agents.agent import Agent, AgentLoadError
from workbench.agents.loading import load_agent
from workbench.agents.rollout import (
    generate,
    reference_token_logprobs,
    sequence_logprobs,
    token_logprobs,
)

__all__ = [
    "Agent",
    "AgentLoadError",
    "generate",
    "load_agent",
    "reference_token_logprobs",
    "sequence_logprobs",
    "token_logprobs",
]
