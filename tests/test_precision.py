"""The precision policy (``workbench.agents.hf``): no trained weight in bf16, decided by pure functions."""

import logging

import pytest
import torch

from workbench.agents.hf import autocast_dtype, precision, resolve_dtype
from workbench.agents.loading import load_agent
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
    with caplog.at_level(logging.WARNING, logger="workbench.agents.hf"):
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
