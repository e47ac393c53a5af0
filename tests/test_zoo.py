"""The tiny agent zoo: presets cover the three heterogeneity kinds; builds are deterministic and cached."""

from __future__ import annotations

import dataclasses
import itertools
import shutil

import pytest
import torch
from safetensors.torch import load_file

from workbench.agents.generation.rollout import generate
from workbench.agents.models.loading import load_agent
from workbench.agents.models.tiny_tokenizers import build_tokenizer
from workbench.agents.models.zoo import (
    TINY_PRESETS,
    ZOO_PAIRS,
    build_tiny,
    read_card,
    tiny_dir,
    tiny_preset,
    zoo_table,
)
from workbench.config.loading import load_experiment
from workbench.tasks.arithmetic import DEFAULT_REGIME, _cells, embedded_solution, resolve_regime


def test_pairs_cover_state_size_and_model_heterogeneity():
    assert set(ZOO_PAIRS) == {"state", "size", "model"}
    a, b = (TINY_PRESETS[n] for n in ZOO_PAIRS["state"])
    assert dataclasses.replace(a, warm_steps=0, description="") == dataclasses.replace(
        b, warm_steps=0, description=""
    )
    assert a.warm_steps != b.warm_steps
    a, b = (TINY_PRESETS[n] for n in ZOO_PAIRS["size"])
    assert (a.architecture, a.tokenizer) == (b.architecture, b.tokenizer)
    assert (a.layers, a.hidden) != (b.layers, b.hidden)
    a, b = (TINY_PRESETS[n] for n in ZOO_PAIRS["model"])
    assert a.architecture != b.architecture and a.tokenizer != b.tokenizer
    assert {p.architecture for p in TINY_PRESETS.values()} >= {"gpt2", "llama"}
    assert {p.tokenizer for p in TINY_PRESETS.values()} == {"char", "bpe"}


def test_unknown_preset_lists_the_presets():
    with pytest.raises(KeyError, match=r"unknown tiny preset 'gpt5'.*llama-bpe"):
        tiny_preset("gpt5")
    with pytest.raises(KeyError, match=r"gpt2-char"):
        build_tiny("gpt5")


def test_two_architectures_and_two_tokenizers(char_agent, bpe_agent):
    assert type(char_agent.model).__name__ == "GPT2LMHeadModel"
    assert type(bpe_agent.model).__name__ == "LlamaForCausalLM"
    text = "Q: 3+4*2\nA: 4*2=8, 3+8=11. \\boxed{11}"
    char_ids = char_agent.tokenizer.encode(text, add_special_tokens=False)
    bpe_ids = bpe_agent.tokenizer.encode(text, add_special_tokens=False)
    assert len(char_ids) == len(text) > len(bpe_ids)  # one token per character vs merged BPE tokens
    for agent, ids in ((char_agent, char_ids), (bpe_agent, bpe_ids)):
        assert agent.tokenizer.decode(ids) == text
        assert not agent.uses_chat_template and agent.format_prompt("1+1") == "Q: 1+1\nA: "
        assert agent.max_new_tokens == 48
    assert len(bpe_agent.tokenizer) <= 400 < 49152


def test_builds_are_cached_and_carry_a_card(char_agent_dir):
    card = read_card(char_agent_dir)
    assert card["preset"] == "gpt2-char" and card["warm_steps"] == 40  # the test session's short warm start
    assert card["parameters"] == sum(p.numel() for p in load_agent(str(char_agent_dir)).model.parameters())
    assert 0.0 <= card["initial_greedy_accuracy"] <= 1.0 and card["eval_problems"] == 1000
    assert card["build_seconds"] > 0
    mtime = (char_agent_dir / "card.json").stat().st_mtime_ns
    assert build_tiny("gpt2-char", warm_steps=40) == char_agent_dir
    assert (char_agent_dir / "card.json").stat().st_mtime_ns == mtime  # not rebuilt
    row = next(r for r in zoo_table(warm_steps=40) if r["preset"] == "gpt2-char")
    assert row["built"] and row["initial_greedy_accuracy"] == card["initial_greedy_accuracy"]


def test_build_is_deterministic_and_rebuilt_when_missing(tmp_path):
    first = build_tiny("llama-bpe", cache_dir=tmp_path / "a", warm_steps=3)
    second = build_tiny("llama-bpe", cache_dir=tmp_path / "b", warm_steps=3)
    weights_a, weights_b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    assert (first / "tokenizer.json").read_text() == (second / "tokenizer.json").read_text()
    assert read_card(first)["initial_greedy_accuracy"] == read_card(second)["initial_greedy_accuracy"]
    other = build_tiny("llama-bpe", cache_dir=tmp_path / "a", warm_steps=4)
    assert other != first and tiny_dir("llama-bpe", cache_dir=tmp_path / "a", warm_steps=4) == other
    shutil.rmtree(first)  # a deleted build is rebuilt on the next request
    assert build_tiny("llama-bpe", cache_dir=tmp_path / "a", warm_steps=3) == first
    assert (first / "card.json").is_file()


def test_tiny_model_string_builds_in_the_session_cache(hacpo_cache):
    agent = load_agent("tiny:gpt2-char-early")
    assert agent.name == "gpt2-char-early" and str(hacpo_cache) in agent.source
    assert len(generate(agent, ["1+1"], n=2, seed=0)) == 2


@pytest.mark.slow
def test_full_warm_start_gives_nonzero_but_imperfect_accuracy(tmp_path, monkeypatch):
    monkeypatch.delenv("HACPO_TINY_WARM_STEPS", raising=False)
    path = build_tiny("llama-bpe", cache_dir=tmp_path)
    card = read_card(path)
    assert card["warm_steps"] == TINY_PRESETS["llama-bpe"].warm_steps
    assert 0.05 <= card["initial_greedy_accuracy"] <= 0.8, card


def test_length_caps_cover_every_solution_of_the_default_regime_plus_eos():
    """Every addsub expression's worked solution + EOS fits each preset's and the quickstart's cap."""
    regime = resolve_regime(DEFAULT_REGIME)
    solutions = [
        embedded_solution(expression)[0]
        for k in range(regime.n_ops[0], regime.n_ops[1] + 1)
        for split in ("train", "test")
        for expression in itertools.chain.from_iterable(_cells(regime, k).by_split[split].values())
    ]
    longest_chars = max(solutions, key=len)
    quickstart_cap = load_experiment("experiments/quickstart.yaml").train.max_new_tokens
    for preset in {(p.tokenizer, p.bpe_vocab) for p in TINY_PRESETS.values()}:
        tokenizer = build_tokenizer(preset[0], preset[1], "Q: {content}\nA: ")
        longest = max(len(tokenizer.encode(s, add_special_tokens=False)) for s in solutions) + 1  # + EOS
        assert longest <= min(p.max_new_tokens for p in TINY_PRESETS.values()), (preset, longest)
        assert longest <= quickstart_cap, (preset, longest, quickstart_cap)
    assert len(longest_chars) + 1 <= quickstart_cap
