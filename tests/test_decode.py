"""The compiled decode (``train.compile_decode``): the static-cache loop samples exactly what the default loop
samples, eagerly and under ``torch.compile`` on CPU (inductor; CUDA graphs are the GPU's ``gpu`` check)."""

import types
import weakref

import pytest
import torch

from workbench.agents.generation import decode
from workbench.agents.generation.rollout import generate
from workbench.agents.generation.sampling import make_static
from workbench.agents.models.loading import load_agent

PROMPTS = ["1+2=", "3+4-5=", "7-2+1=", "9+9-8+1="]


def _same(agent, **kwargs):
    default = generate(agent, PROMPTS, **kwargs)
    static = generate(agent, PROMPTS, compile_decode=True, **kwargs)
    assert [r.response_ids for r in static] == [r.response_ids for r in default]
    assert [r.finish_reason for r in static] == [r.finish_reason for r in default]
    return static


@pytest.mark.parametrize("preset_dir", ["char_agent_dir", "bpe_agent_dir"])
def test_the_static_cache_loop_samples_what_the_default_loop_samples(preset_dir, request, monkeypatch):
    agent = load_agent({"model": str(request.getfixturevalue(preset_dir)), "device": "cpu", "lora": {"r": 2}})
    monkeypatch.setattr(decode, "_COMPILED", weakref.WeakKeyDictionary())
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)  # the static loop, run eagerly
    _same(agent, n=3, temperature=0.0, max_new_tokens=20)
    rollouts = _same(agent, n=3, temperature=1.0, top_p=0.9, seed=7, max_new_tokens=20, batch_size=5)
    # rows finished at different steps: the static loop kept finished rows in the batch and ignored them
    assert len({len(r.response_ids) for r in rollouts}) > 1


@pytest.mark.slow
def test_the_compiled_decode_equals_the_eager_one_on_cpu(bpe_agent_dir, monkeypatch):
    agent = load_agent({"model": str(bpe_agent_dir), "device": "cpu"})
    monkeypatch.setattr(decode, "_COMPILED", weakref.WeakKeyDictionary())
    _same(agent, n=2, temperature=0.0, max_new_tokens=16)
    _same(agent, n=2, temperature=1.0, seed=3, max_new_tokens=16)
    assert agent.model in decode._COMPILED  # the step really went through torch.compile


def test_a_model_with_sliding_window_layers_decodes_eagerly(bpe_agent_dir, tmp_path, caplog):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bpe_agent_dir)
    ids = {"bos_token_id": tokenizer.eos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": 0}
    config = AutoConfig.for_model(
        "gemma3_text", vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], **ids,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    agent = load_agent({"model": str(tmp_path), "device": "cpu"})
    assert make_static(types.SimpleNamespace(layers=[object()]), torch.tensor([0]), 64) is None
    _same(agent, n=2, temperature=1.0, seed=2, max_new_tokens=12)  # falls back to the default loop
    assert "decoding eagerly" in caplog.text
