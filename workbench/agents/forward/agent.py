"""The `Agent` record: a causal LM + tokenizer + prompt format + sampling settings.

Built by `workbench.agents.models.loading.load_agent` (the only place that calls ``from_pretrained``). Prompt
format: with a chat template (when the tokenizer has one and ``spec.chat_template`` is not False) the prompt
is the template applied to an optional system turn (``spec.system``) and one user message plus the generation
prompt, with ``spec.chat_template_kwargs``; otherwise it is ``spec.prompt_template``
(default ``"Q: {content}\nA: "``). Tiny agents have no chat template.

Models are kept in eval mode: dropout is off both when rollouts are scored and when the learner is trained, so
an on-policy self sample has a sequence ratio of exactly 1 (gradients flow in eval mode all the same).

`threads_for` runs small work on one torch thread. torch runs each operator on all its intra-op (OpenMP)
threads, however small the operator. Under ``OMP_WAIT_POLICY=PASSIVE`` (the workbench's default: spinning
threads make runs many times slower next to any other busy process on a 2-core machine) an idle thread sleeps,
and every parallel operator pays to wake it. For the tiny agents' operators (d = 128) that wake-up costs more
than the second core gives back: measured on 2 cores, a decode step of 64 rows runs 21-28% faster on one
thread, and a forward and backward pass of a micro-batch of 300-500 response tokens 40% faster; from ≈ 1,400
response tokens on, two threads win. A block runs on one thread when its work is below `SERIAL_WORK`,
measured as tokens per forward pass times the model's parameters, and on the caller's threads otherwise:
SmolLM2-135M decodes 64 rows ≈ 12% faster on two threads. On the tiny agents one thread and two give the same
samples and log-probs; weight gradients differ in rounding (a matrix product's sum over tokens splits
differently), and so may a larger model's samples.
"""

from __future__ import annotations

import contextlib
import hashlib
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from workbench.agents.plan.shapes import autocast_dtype
from workbench.config.agent_spec import AgentSpec

if TYPE_CHECKING:
    from workbench.agents.forward.tokens import TokenBatch

__all__ = ["SERIAL_WORK", "serial_work", "threads_for", "threads_for_pass"]


def state_digest(state: Mapping[str, Any]) -> str:
    """sha256 (hex) over a state dict: each entry's name, dtype, shape and raw bytes, in sorted name order.

    Equal for bit-identical weights wherever they sit (CPU or GPU) and whatever the dict's order; any changed
    bit, dtype or shape changes it. Tensors are copied to the CPU one at a time, so the peak extra memory is
    the largest tensor. A non-tensor entry (a quantizer's extra state) contributes its type and ``str``.
    """
    digest = hashlib.sha256()
    for name in sorted(state):
        value = state[name]
        if torch.is_tensor(value):
            tensor = value.detach()
            digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
            # Raw bytes through a uint8 view: numpy has no bfloat16, and the view copies nothing.
            digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).cpu().numpy().data)
        else:
            digest.update(f"{name}\0{type(value).__name__}\0{value}\0".encode())
    return digest.hexdigest()


class AgentLoadError(RuntimeError):
    """A model or tokenizer cannot be loaded; the message names the problem and the fix."""


@dataclass
class Agent:
    """A loaded agent. Build with `load_agent`.

    Attributes:
        name: Display name and metric key.
        spec: The spec it was loaded from.
        model: The causal LM (a ``PeftModel`` when ``spec.lora`` is set), in eval mode.
        tokenizer: Its tokenizer.
        device: Where the model's weights sit.
        eos_token_id: The token a finished response ends with (appended to re-encoded shared responses).
        pad_token_id: Padding id (the EOS when the tokenizer has no pad token).
        stop_token_ids: Every id that ends generation (EOS plus the generation config's extra EOS ids).
        max_new_tokens: The resolved response cap.
        source: Where the weights came from (a directory or hub id).
    """

    name: str
    spec: AgentSpec
    model: Any
    tokenizer: Any
    device: torch.device
    eos_token_id: int
    pad_token_id: int
    stop_token_ids: tuple[int, ...]
    max_new_tokens: int
    source: str = ""
    reference_loader: Callable[[], Any] | None = field(default=None, repr=False)
    """Loads the frozen initial model (full fine-tuning; set by
    `workbench.agents.models.loading.load_agent`)."""
    _reference: Any = field(default=None, repr=False)

    @property
    def is_lora(self) -> bool:
        """True when the model carries LoRA adapters (only they are trained)."""
        return self.spec.lora is not None

    @property
    def uses_chat_template(self) -> bool:
        """True when prompts are formatted with the tokenizer's chat template."""
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        return has_template and self.spec.chat_template is not False

    @property
    def max_positions(self) -> int | None:
        """The model's context window in tokens, when its config states one."""
        config = self.model.config
        for key in ("n_positions", "max_position_embeddings"):
            value = getattr(config, key, None)
            if isinstance(value, int):
                return value
        return None

    def format_prompt(self, content: str) -> str:
        """The full prompt text for one user message (chat template or the plain template)."""
        if self.uses_chat_template:
            system = [] if self.spec.system is None else [{"role": "system", "content": self.spec.system}]
            messages = [*system, {"role": "user", "content": content}]
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **(self.spec.chat_template_kwargs or {})
            )
        return self.spec.prompt_template.format(content=content)

    def encode_prompt(self, content: str) -> list[int]:
        """Token ids of `format_prompt` (a chat template already holds its special tokens)."""
        text = self.format_prompt(content)
        return list(self.tokenizer.encode(text, add_special_tokens=not self.uses_chat_template))

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters that receive gradients: the LoRA adapters with LoRA, else every weight."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """What a checkpoint must hold: adapter weights with LoRA, else the full state dict (CPU copies)."""
        if self.is_lora:
            from peft import get_peft_model_state_dict

            state = get_peft_model_state_dict(self.model)
        else:
            state = self.model.state_dict()
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Loads what `trainable_state_dict` returned; a missing or unexpected key raises."""
        if self.is_lora:
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(self.model, state)
            unexpected = getattr(result, "unexpected_keys", [])
            if unexpected:
                raise KeyError(f"agent {self.name!r}: unexpected adapter keys {unexpected[:5]}")
        else:
            self.model.load_state_dict(state, strict=True)

    def weights_digest(self) -> str:
        """`state_digest` of the model's whole state dict (LoRA adapters included)."""
        return state_digest(self.model.state_dict())

    def reference_model(self) -> Any:
        """The frozen initial model, loaded from ``source`` on first use (full fine-tuning only).

        Loaded from the source rather than copied, so that it is the initial policy even after a checkpoint
        was restored into ``model``. A LoRA agent's reference is its own model with adapters disabled.
        """
        if self.is_lora:
            raise RuntimeError("a LoRA agent's reference is its own model with adapters disabled")
        if self._reference is None:
            if self.reference_loader is None:
                raise RuntimeError(f"agent {self.name!r} was built without a reference loader")
            self._reference = self.reference_loader().requires_grad_(False)
        return self._reference


def precision(agent: Agent) -> contextlib.AbstractContextManager[Any]:
    """The context every forward pass of ``agent`` runs in: bf16 autocast per `autocast_dtype`, else none."""
    dtype = autocast_dtype(agent.spec, agent.device)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=agent.device.type, dtype=dtype)


# One torch thread for small work on CPU (the module docstring says when and why).

SERIAL_WORK = 600_000_000
"""Below this much work (tokens per forward pass × parameters) a block runs on one CPU thread: the crossover
of the tiny agents' (0.45M parameters) forward and backward passes on 2 cores, ≈ 1,400 response tokens."""

_PARAMETERS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
"""Parameter count per model object, counted once."""


def serial_work(agent: Agent, tokens: int) -> bool:
    """Whether a block of ``tokens`` tokens per forward pass of ``agent`` runs on one thread (CPU only)."""
    if agent.device.type != "cpu":
        return False
    if agent.model not in _PARAMETERS:
        _PARAMETERS[agent.model] = sum(p.numel() for p in agent.model.parameters())
    return tokens * _PARAMETERS[agent.model] < SERIAL_WORK


@contextlib.contextmanager
def threads_for(agent: Agent, tokens: int) -> Iterator[None]:
    """torch's intra-op threads set to 1 inside the block when `serial_work` holds, restored after."""
    previous = torch.get_num_threads()
    if previous == 1 or not serial_work(agent, tokens):
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def threads_for_pass(agent: Agent, view: TokenBatch) -> contextlib.AbstractContextManager[None]:
    """`threads_for` a forward pass over ``view``, its response tokens the measure of its work."""
    return threads_for(agent, int(view.response_mask_B_T.sum()))
