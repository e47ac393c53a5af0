"""`threads_for`: small work on one CPU thread, the caller's threads restored after, large work untouched."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from workbench.agents.forward import agent as agent_module
from workbench.agents.forward.agent import SERIAL_WORK, serial_work, threads_for
from workbench.agents.generation.rollout import generate


def _parameters(agent) -> int:
    return sum(p.numel() for p in agent.model.parameters())


def test_small_work_runs_on_one_thread_and_restores(char_agent, two_threads):
    small = SERIAL_WORK // _parameters(char_agent) - 1
    assert serial_work(char_agent, small) and not serial_work(char_agent, small + 2)
    with threads_for(char_agent, small):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with threads_for(char_agent, small + 2):
        assert torch.get_num_threads() == 2


def test_threads_restored_when_the_block_raises(char_agent, two_threads):
    with pytest.raises(RuntimeError, match="boom"), threads_for(char_agent, 1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 2


def test_gpu_work_is_never_serialized(char_agent):
    on_gpu = dataclasses.replace(char_agent, device=torch.device("cuda"))
    assert not serial_work(on_gpu, 1)


def test_generation_runs_serial_for_small_batches(char_agent, two_threads, monkeypatch):
    seen = []
    step = char_agent.model.forward

    def forward(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return step(*args, **kwargs)

    monkeypatch.setattr(char_agent.model, "forward", forward)
    generate(char_agent, ["1+2="], 4, temperature=1.0, seed=0, max_new_tokens=3)
    assert seen and set(seen) == {1}
    monkeypatch.setattr(agent_module, "SERIAL_WORK", 0)  # nothing is small: the caller's two threads
    seen.clear()
    generate(char_agent, ["1+2="], 4, temperature=1.0, seed=0, max_new_tokens=3)
    assert seen and set(seen) == {2}
    assert torch.get_num_threads() == 2
