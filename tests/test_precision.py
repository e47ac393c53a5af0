"""The precision policy (``workbench.agents.models.hf``): no trained weight in bf16, decided by pure functions
of (spec, device type), so a CPU test loads a tiny model with the CUDA policy and checks every kind of
module."""

import concurrent.futures
import logging
import threading

import pytest
import torch

from workbench.agents.forward.agent import precision
from workbench.agents.models.hf import build_model
from workbench.agents.models.loading import load_agent
from workbench.agents.plan.shapes import (
    Precision,
    autocast_dtype,
    precision_policy,
    resolve_dtype,
)
from workbench.config.agent_spec import AgentSpec

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def test_full_finetuning_on_cuda_keeps_fp32_master_weights_under_bf16_autocast():
    full, lora = AgentSpec("m"), AgentSpec("m", lora={"r": 4})
    assert resolve_dtype("auto", CUDA, full_finetune=True) == torch.float32
    assert autocast_dtype(full, CUDA) == torch.bfloat16
    # LoRA: the frozen base may be bf16 (peft keeps the trained adapters in fp32); no autocast needed
    assert resolve_dtype("auto", CUDA, full_finetune=False) == torch.bfloat16
    assert autocast_dtype(lora, CUDA) is None
    # CPU: fp32 everywhere, no autocast; an explicit dtype is honoured
    assert resolve_dtype("auto", CPU, full_finetune=True) == torch.float32
    assert autocast_dtype(full, CPU) is None
    assert autocast_dtype(AgentSpec("m", dtype="float32"), CUDA) is None
    assert resolve_dtype("bfloat16", CUDA, full_finetune=True) == torch.bfloat16


def test_bf16_full_finetuning_is_loaded_with_a_warning_and_cpu_runs_without_autocast(char_agent_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="workbench.agents.models.hf"):
        agent = load_agent({"model": str(char_agent_dir), "device": "cpu", "dtype": "bfloat16"})
    assert next(agent.model.parameters()).dtype == torch.bfloat16
    assert any("round away" in r.getMessage() for r in caplog.records)
    with precision(agent):
        assert not torch.is_autocast_enabled("cpu")
    # LoRA on a bf16 base (CUDA's auto): the trained adapters stay fp32
    lora = load_agent({"model": str(char_agent_dir), "dtype": "bfloat16", "lora": {"r": 2}})
    assert {p.dtype for p in lora.trainable_parameters()} == {torch.float32}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_precision_context_autocasts_a_full_finetune_on_cuda(char_agent_dir):
    agent = load_agent({"model": str(char_agent_dir), "device": "cuda"})
    assert next(agent.model.parameters()).dtype == torch.float32
    with precision(agent):
        assert torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.bfloat16


def test_the_policy_is_a_pure_function_of_spec_and_device_type():
    lora, q4 = AgentSpec("m", lora={"r": 4}), AgentSpec("m", lora={"r": 4}, quantization="4bit")
    full = AgentSpec("m")
    bf16, fp32 = torch.bfloat16, torch.float32
    assert precision_policy(q4, "cuda") == Precision(
        weights=bf16, compute=bf16, autocast=None, reference=bf16
    )
    assert precision_policy(lora, "cuda").activations == bf16
    assert precision_policy(full, "cuda") == Precision(
        weights=fp32, compute=bf16, autocast=bf16, reference=bf16
    )
    for spec in (q4, lora, full):  # CPU: fp32 everywhere
        assert precision_policy(spec, "cpu") == Precision(fp32, fp32, None, fp32)
    explicit = AgentSpec("m", lora={"r": 4}, quantization="4bit", compute_dtype="float32")
    assert precision_policy(explicit, "cuda").compute == fp32


def _dtypes(model) -> dict[str, set[str]]:
    """dtype of each kind of module after loading: embeddings, norms, LM head, LoRA A/B, 4-bit layers."""
    head = model.get_output_embeddings()
    kinds: dict[str, set[str]] = {}
    for name, module in model.named_modules():
        kind = type(module).__name__
        if module is head:
            kind = "lm_head"
        elif name.endswith(("lora_A.default", "lora_B.default")):
            kind = name.rsplit(".", 2)[-2]
        for param in module.parameters(recurse=False):
            kinds.setdefault(kind, set()).add(str(param.dtype).removeprefix("torch."))
        if hasattr(module, "compute_dtype"):
            kinds.setdefault(f"{kind}.compute_dtype", set()).add(
                str(module.compute_dtype).removeprefix("torch.")
            )
    return kinds


def test_4bit_qlora_under_the_cuda_policy_keeps_bf16_compute_and_fp32_adapters(bpe_agent_dir):
    spec = AgentSpec(str(bpe_agent_dir), lora={"r": 4}, quantization="4bit", gradient_checkpointing=True)
    model = build_model(spec, str(bpe_agent_dir), CPU, precision_policy(spec, "cuda"))  # the GPU's dtypes
    kinds = _dtypes(model)
    assert kinds["Embedding"] == {"bfloat16"} and kinds["lm_head"] == {"bfloat16"}  # not upcast to fp32
    assert kinds["LlamaRMSNorm"] == {"bfloat16"}
    assert kinds["Linear4bit"] == {"uint8"} and kinds["Linear4bit.compute_dtype"] == {"bfloat16"}
    assert kinds["lora_A"] == kinds["lora_B"] == {"float32"}
    ids_B_T = torch.tensor([[5, 6, 7, 8]])
    # input gradients are enabled for non-reentrant checkpointing (as TRL does), and the residual stream,
    # hence the KV cache and the logits, stays bf16
    assert model.get_input_embeddings()(ids_B_T).requires_grad
    assert model(input_ids=ids_B_T).logits.dtype == torch.bfloat16
    # on CPU the same spec stays fp32 (the house rule)
    cpu = _dtypes(build_model(spec, str(bpe_agent_dir), CPU))
    assert cpu["Embedding"] == cpu["LlamaRMSNorm"] == cpu["lm_head"] == {"float32"}
    assert cpu["Linear4bit.compute_dtype"] == {"float32"}


def test_models_loaded_on_two_threads_at_once_all_get_their_weights(char_agent_dir, bpe_agent_dir):
    """transformers' loading switches process-wide state while it runs; without `build_model`'s lock a load
    on another thread at the same moment could leave weights on the meta device (agents' reference models
    load lazily on their own threads under ``executor: threads``)."""
    sources = [str(char_agent_dir), str(bpe_agent_dir)] * 3
    start = threading.Barrier(len(sources))

    def load(source: str):
        start.wait(timeout=30)
        return build_model(AgentSpec(source), source, CPU)

    with concurrent.futures.ThreadPoolExecutor(len(sources)) as pool:
        models = list(pool.map(load, sources))
    for source, model in zip(sources, models, strict=True):
        reference = build_model(AgentSpec(source), source, CPU).state_dict()
        state = model.state_dict()
        assert all(not t.is_meta for t in state.values())
        assert all(torch.equal(state[k], reference[k]) for k in reference)
