"""Training on a GPU (``gpu`` marker: ``make test`` skips them; ``make gpu-check`` runs them on CUDA).

Tiny agents keep these to seconds: one HACPO step with 4-bit QLoRA, one with full fine-tuning (fp32 master
weights under bf16 autocast, so lr 1e-6 still moves them), agents on CUDA and CPU side by side, and the Ray
executor placing two agents on one GPU when Ray is installed.
"""

import json

import pytest
import torch

from workbench.agents.hf import autocast_dtype
from workbench.config.experiment import from_dict
from workbench.lab.frames import load_runs
from workbench.train.checkpoint import load_latest_checkpoint
from workbench.train.run import train
from workbench.train.rundir import RunWriter, create_run_dir
from workbench.train.trainer import Trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TRAIN = {
    "steps": 1,
    "prompts_per_step": 4,
    "group_size": 4,
    "minibatch_prompts": 2,
    "micro_batch_size": 8,
    "max_new_tokens": 16,
    "eval_every": 0,
    "save_every": 1,
    "lr": 1e-3,
}


def _config(tmp_path, agents, **train_overrides):
    return from_dict(
        {
            "experiment": "gpu",
            "agents": agents,
            "output": {"root": str(tmp_path)},
            "train": TRAIN | train_overrides,
            "task": {"train_size": 40, "eval_size": 4},
        }
    )


def _agent(name, model, **fields):
    return {"name": name, "model": model, "device": "cuda"} | fields


def _check_step(run_dir, names):
    df = load_runs([run_dir])
    last = df.iloc[-1]
    for name in names:
        assert torch.isfinite(torch.tensor(last[f"loss/{name}"])), name
        # on-policy self samples: s = 1 bit-exactly in the first mini-batch, ≈ 1 after the first update
        assert last[f"is/{name}/{name}/ratio_mean"] == pytest.approx(1.0, abs=0.05)
    return df


def test_one_hacpo_step_with_4bit_qlora(tmp_path):
    lora = {"r": 4, "alpha": 8}
    agents = [
        _agent("char", "tiny:gpt2-char", quantization="4bit", lora=lora),
        _agent("bpe", "tiny:llama-bpe", quantization="4bit", lora=lora),
    ]
    run_dir = train(_config(tmp_path, agents))
    _check_step(run_dir, ["char", "bpe"])
    state = load_latest_checkpoint(run_dir)[1]["agent_0"]
    assert state and all("lora" in key for key in state)
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in state.items())  # adapters moved from zero
    digests = json.loads((run_dir / "environment.json").read_text())["start_weights"]
    assert set(digests) == {"char", "bpe"}  # 4-bit weights and their quantization state hash too


def test_starting_weights_digest_is_the_same_on_cuda_and_cpu():
    from workbench.agents.loading import load_agent

    on_cuda = load_agent({"model": "tiny:gpt2-char", "device": "cuda"})
    on_cpu = load_agent({"model": "tiny:gpt2-char", "device": "cpu"})
    assert next(on_cuda.model.parameters()).is_cuda
    assert on_cuda.weights_digest() == on_cpu.weights_digest()


def test_full_finetuning_keeps_fp32_master_weights_and_moves_them_at_lr_1e_6(tmp_path):
    cfg = _config(tmp_path, [_agent("char", "tiny:gpt2-char"), _agent("bpe", "tiny:llama-bpe")], lr=1e-6)
    run_dir = create_run_dir(tmp_path, cfg.experiment)
    RunWriter(run_dir).write_config(cfg.to_dict())
    trainer = Trainer(cfg, run_dir)
    agents = [w.agent for w in trainer.executor.workers]
    for agent in agents:
        assert agent.device.type == "cuda" and autocast_dtype(agent.spec, agent.device) == torch.bfloat16
        assert all(p.dtype == torch.float32 for p in agent.model.parameters())
        assert next(agent.reference_model().parameters()).dtype == torch.bfloat16  # frozen: half the memory
    before = [{n: p.detach().clone() for n, p in a.model.named_parameters()} for a in agents]
    metrics = trainer.train_step()
    for agent, start in zip(agents, before):
        moved = [(p.detach() != start[n]).float().mean().item() for n, p in agent.model.named_parameters()]
        assert sum(moved) / len(moved) > 0.5, f"{agent.name}: lr 1e-6 updates rounded away"
        # the same update applied to bf16 weights would mostly vanish: the reason for fp32 master weights
        kept = [
            (p.detach().bfloat16() != start[n].bfloat16()).float().mean().item()
            for n, p in agent.model.named_parameters()
        ]
        assert sum(kept) / len(kept) < 0.5
    assert all(torch.isfinite(torch.tensor(metrics[f"loss/{a.name}"])) for a in agents)


def test_agents_on_cuda_and_cpu_train_side_by_side(tmp_path):
    agents = [_agent("char", "tiny:gpt2-char"), _agent("bpe", "tiny:llama-bpe", device="cpu")]
    run_dir = train(_config(tmp_path, agents))
    _check_step(run_dir, ["char", "bpe"])


def test_ray_places_two_agents_on_one_gpu(tmp_path):
    ray = pytest.importorskip("ray")
    cfg = _config(tmp_path, [_agent("char", "tiny:gpt2-char"), _agent("bpe", "tiny:llama-bpe")])
    object.__setattr__(cfg, "executor", "ray")  # until the config has an `executor` field (issue 13)
    object.__setattr__(cfg, "ray", {"cpus_per_agent": 1, "gpus_per_agent": 0.5})
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False)
    try:
        run_dir = train(cfg)
    finally:
        ray.shutdown()
    _check_step(run_dir, ["char", "bpe"])
