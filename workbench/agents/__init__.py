"""Layer 3: agents, in four rooms, bottom to top (a room imports only from its own or a lower one):

| room | what |
|---|---|
| `plan/` | sizes and dtypes without weights: model shapes, the memory model, the precision policy |
| `forward/` | an agent and its forward pass: the `Agent` record, token batches, log-probs (chunked LM |
| | head, packed rows), re-encoded shared text |
| `generation/` | sampling: the prefill, the decode loops, KV caches, the rollout-engine interface |
| `models/` | where an agent comes from: `load_agent` (tiny zoo, embedded, warm starts, directories, hub |
| | ids; LoRA, 4-bit), supervised warm starts, export |

transformers, peft and bitsandbytes are imported in this layer only (lazily, inside the functions that load).
"""

from workbench.agents.forward.agent import Agent, AgentLoadError
from workbench.agents.forward.passes import reference_token_logprobs, sequence_logprobs, token_logprobs
from workbench.agents.generation.rollout import generate
from workbench.agents.models.loading import load_agent

__all__ = [
    "Agent",
    "AgentLoadError",
    "generate",
    "load_agent",
    "reference_token_logprobs",
    "sequence_logprobs",
    "token_logprobs",
]
