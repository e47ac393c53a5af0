"""Training on a device: the same test bodies run on CPU in ``make test`` and on CUDA under the ``gpu`` marker
(``make gpu-check`` runs them there), so the GPU variants cannot rot unnoticed.

Tiny agents keep these to seconds: one HACPO step with 4-bit QLoRA, one with full fine-tuning (fp32 master
weights, under bf16 autocast on CUDA, so lr 1e-6 still moves them), agents on the device and on CPU side by
side, and the Ray executor placing two agents on one device (half a GPU each on CUDA).
"""

import json

import pytest
import torch

from workbench.agents.plan.shapes import autocast_dtype, precision_policy
from workbench.config.agent_spec import AgentSpec
from workbench.config.experiment import from_dict
from workbench.lab.frames import load_runs
from workbench.train.checkpoint import load_latest_checkpoint
from workbench.train.run import train
from workbench.train.rundir import RunWriter, create_run_dir
from workbench.train.trainer import start_trainer

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.gpu),  # skipped without CUDA (tests/conftest.py)
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


@pytest.fixture
def parity_reward(tmp_path, monkeypatch):
    """A reward that half the responses earn (even length), so every step has advantages to train on."""
    (tmp_path / "parity_reward_gpu.py").write_text(
        "def even(completion: str, answer: str) -> float:\n    return float(len(completion) % 2 == 0)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "parity_reward_gpu:even"


def _config(tmp_path, agents, executor="local", ray=None, reward="math_verify", **train_overrides):
    return from_dict(
        {
            "experiment": "gpu",
            "agents": agents,
            "output": {"root": str(tmp_path)},
            "train": TRAIN | train_overrides,
            "task": {"train_size": 40, "eval_size": 4, "reward": reward},
            "executor": executor,
            **({"ray": ray} if ray else {}),
        }
    )


def _agent(name, model, device, **fields):
    return {"name": name, "model": model, "device": device} | fields


def _check_step(run_dir, names):
    df = load_runs([run_dir])
    last = df.iloc[-1]
    for name in names:
        assert torch.isfinite(torch.tensor(last[f"loss/{name}"])), name
        # on-policy self samples: s = 1 bit-exactly in the first mini-batch, ≈ 1 after the first update
        ratios = {k: round(float(v), 4) for k, v in last.items() if k.startswith(f"is/{name}/")}
        assert last[f"is/{name}/{name}/ratio_mean"] == pytest.approx(1.0, abs=0.05), (name, ratios)
    return df


@pytest.mark.parametrize("device", DEVICES)
def test_one_hacpo_step_with_4bit_qlora(tmp_path, device, parity_reward):
    lora = {"r": 4, "alpha": 8}
    agents = [
        _agent("char", "tiny:gpt2-char", device, quantization="4bit", lora=lora),
        _agent("bpe", "tiny:llama-bpe", device, quantization="4bit", lora=lora, gradient_checkpointing=True),
    ]
    run_dir = train(_config(tmp_path, agents, reward=parity_reward))
    _check_step(run_dir, ["char", "bpe"])
    state = load_latest_checkpoint(run_dir)[1]["agent_1"]
    assert state and all("lora" in key for key in state)
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in state.items())  # adapters moved from zero
    digests = json.loads((run_dir / "environment.json").read_text())["start_weights"]
    assert set(digests) == {"char", "bpe"}  # 4-bit weights and their quantization state hash too


@pytest.mark.gpu
def test_starting_weights_digest_is_the_same_on_cuda_and_cpu():
    from workbench.agents.models.loading import load_agent

    on_cuda = load_agent({"model": "tiny:gpt2-char", "device": "cuda"})
    on_cpu = load_agent({"model": "tiny:gpt2-char", "device": "cpu"})
    assert next(on_cuda.model.parameters()).is_cuda
    assert on_cuda.weights_digest() == on_cpu.weights_digest()


@pytest.mark.parametrize("device", DEVICES)
def test_full_finetuning_keeps_fp32_master_weights_and_moves_them_at_lr_1e_6(tmp_path, device, parity_reward):
    agents = [_agent("char", "tiny:gpt2-char", device), _agent("bpe", "tiny:llama-bpe", device)]
    cfg = _config(tmp_path, agents, reward=parity_reward, lr=1e-6)
    run_dir = create_run_dir(tmp_path, cfg.experiment)
    RunWriter(run_dir).write_config(cfg.to_dict())
    trainer = start_trainer(cfg, run_dir)
    workers = [w.agent for w in trainer.executor.workers]
    policy = precision_policy(AgentSpec("m"), device)
    for agent in workers:
        assert agent.device.type == device
        assert autocast_dtype(agent.spec, agent.device) == (torch.bfloat16 if device == "cuda" else None)
        assert all(p.dtype == torch.float32 for p in agent.model.parameters())
        # the frozen reference: half the memory on CUDA, fp32 on CPU
        assert next(agent.reference_model().parameters()).dtype == policy.reference
    before = [{n: p.detach().clone() for n, p in a.model.named_parameters()} for a in workers]
    metrics = trainer.train_step()
    for agent, start in zip(workers, before):
        moved = [(p.detach() != start[n]).float().mean().item() for n, p in agent.model.named_parameters()]
        assert sum(moved) / len(moved) > 0.5, f"{agent.name}: lr 1e-6 updates rounded away"
        # the same update applied to bf16 weights would mostly vanish: the reason for fp32 master weights
        kept = [
            (p.detach().bfloat16() != start[n].bfloat16()).float().mean().item()
            for n, p in agent.model.named_parameters()
        ]
        assert sum(kept) / len(kept) < 0.5
    assert all(torch.isfinite(torch.tensor(metrics[f"loss/{a.name}"])) for a in workers)


@pytest.mark.parametrize("device", DEVICES)
def test_agents_on_the_device_and_on_cpu_train_side_by_side(tmp_path, device):
    agents = [_agent("char", "tiny:gpt2-char", device), _agent("bpe", "tiny:llama-bpe", "cpu")]
    # lr 1e-5: one full-fine-tuning Adam step at 1e-3 moves every weight by ~1e-3, and the next mini-batch's
    # self ratios to 0.84-0.88 (H200, and CPU at seed 1), outside the ≈ 1 that _check_step asks for
    run_dir = train(_config(tmp_path, agents, lr=1e-5))
    _check_step(run_dir, ["char", "bpe"])


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_ray_places_two_agents_on_one_device(tmp_path, device):
    ray = pytest.importorskip("ray")
    gpus = 0.5 if device == "cuda" else 0
    agents = [_agent("char", "tiny:gpt2-char", device), _agent("bpe", "tiny:llama-bpe", device)]
    cfg = _config(tmp_path, agents, "ray", {"cpus_per_agent": 1, "gpus_per_agent": gpus})
    ray.init(num_cpus=2, num_gpus=1 if device == "cuda" else 0, include_dashboard=False, log_to_driver=False)
    try:
        run_dir = train(cfg)
    finally:
        ray.shutdown()
    _check_step(run_dir, ["char", "bpe"])
