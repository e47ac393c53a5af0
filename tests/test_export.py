"""Trained agents from a run directory: ``load_agent(run_dir, agent=...)`` and the Hugging Face export."""

from __future__ import annotations

import json

import pytest
import torch

from workbench.agents.forward.agent import AgentLoadError
from workbench.agents.models.export import export_run
from workbench.agents.models.loading import checkpoint_step, is_run_dir, load_agent, model_problem
from workbench.config.experiment import from_dict
from workbench.train.checkpoint import save_checkpoint
from workbench.train.rundir import RunWriter, create_run_dir

PROMPT = "Q: 3+4=?\nA: "


def _trained_run(tmp_path, spec: dict, steps: tuple[int, ...] = (3,)):
    """A run directory as the trainer leaves it: config.yaml, then checkpoints of moved weights."""
    cfg = from_dict(
        {"experiment": "exp", "algorithm": "gspo", "agents": [spec], "output": {"root": str(tmp_path)}}
    )
    run_dir = create_run_dir(tmp_path, "exp")
    RunWriter(run_dir).write_config(cfg.to_dict())
    agent = load_agent(spec)
    torch.manual_seed(0)
    for step in steps:
        with torch.no_grad():
            for p in agent.trainable_parameters():
                p.add_(0.02 * torch.randn_like(p))
        save_checkpoint(
            run_dir, step, {"agent_0": agent.trainable_state_dict(), "optimizer_0": {}}, keep_last=5
        )
    return run_dir, agent


def _logits(agent) -> torch.Tensor:
    ids = torch.tensor([agent.tokenizer.encode(PROMPT)])
    with torch.no_grad():
        return agent.model(ids).logits


def test_a_lora_agent_loads_from_its_run_and_exports_adapters_and_merged_weights(tmp_path, bpe_agent_dir):
    spec = {"model": str(bpe_agent_dir), "name": "bpe", "lora": {"r": 4, "alpha": 8}}
    run_dir, trained = _trained_run(tmp_path, spec)
    assert is_run_dir(run_dir) and "run directory" in model_problem(str(run_dir))
    loaded = load_agent(run_dir, agent="bpe")
    assert loaded.is_lora and checkpoint_step(run_dir, "bpe") == 3
    torch.testing.assert_close(_logits(loaded), _logits(trained))

    written = export_run(run_dir, tmp_path / "export", merged=True)
    assert [p.name for p in written["bpe"]] == ["adapter", "merged"]
    assert (tmp_path / "export" / "bpe" / "adapter" / "adapter_config.json").is_file()
    record = json.loads((tmp_path / "export" / "bpe" / "export.json").read_text())
    assert record["step"] == 3 and record["spec"]["lora"]["r"] == 4
    merged = load_agent(str(tmp_path / "export" / "bpe" / "merged"))  # a plain model directory now
    assert not merged.is_lora
    torch.testing.assert_close(_logits(merged), _logits(trained), atol=1e-5, rtol=1e-5)


def test_a_fully_fine_tuned_agent_exports_its_model(tmp_path, char_agent_dir):
    run_dir, trained = _trained_run(tmp_path, {"model": str(char_agent_dir), "name": "char"})
    written = export_run(run_dir)  # default: <run_dir>/export/<agent>/model
    assert written == {"char": [run_dir / "export" / "char" / "model"]}
    exported = load_agent(str(written["char"][0]))
    torch.testing.assert_close(_logits(exported), _logits(trained))


def test_a_damaged_newest_checkpoint_falls_back_and_unknown_agents_are_named(tmp_path, char_agent_dir):
    run_dir, _ = _trained_run(tmp_path, {"model": str(char_agent_dir), "name": "char"}, steps=(3, 5))
    (run_dir / "checkpoints" / "step_000005" / "agent_0.pt").write_bytes(b"damaged")
    assert checkpoint_step(run_dir, "char") == 3
    with pytest.raises(
        AgentLoadError, match=r"agent = 'llama' is not allowed: the run .* has the agents \['char'\]"
    ):
        load_agent(run_dir, agent="llama")
    with pytest.raises(TypeError, match="for run directories only"):
        load_agent(str(char_agent_dir), agent="char")


def test_a_run_with_a_custom_reward_loads_without_its_module(tmp_path, char_agent_dir):
    """Loading or exporting a trained agent reads only the run's agents: the custom reward module the run
    was trained with need not be importable here."""
    run_dir, trained = _trained_run(tmp_path, {"model": str(char_agent_dir), "name": "char"})
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace("reward: math_verify", "reward: gone_module:score"))
    assert "gone_module:score" in config.read_text()
    loaded = load_agent(run_dir, agent="char")
    torch.testing.assert_close(_logits(loaded), _logits(trained))
    assert export_run(run_dir)["char"] == [run_dir / "export" / "char" / "model"]
