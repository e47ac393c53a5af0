"""The memory model and the plan (``workbench.agents.plan.memory``, ``workbench.train.plan``): counts that
match what transformers and peft build, batch sizes that fit their budget, one plan for the trainer and the
CLI."""

import logging

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from workbench.__main__ import main
from workbench.agents.plan.memory import (
    CPU_MAX_ROWS,
    ENGINE_RUNTIME_BYTES,
    NF4_BYTES_PER_PARAM,
    ModelDims,
    agent_memory,
    engine_bytes,
    generation_row_bytes,
    generation_rows,
    rows_within,
    trained_kind,
)
from workbench.agents.plan.shapes import REFERENCE_CONFIGS, Inventory
from workbench.config.agent_spec import AgentSpec
from workbench.config.experiment import from_dict
from workbench.config.loading import load_experiment
from workbench.core.env import project_path
from workbench.train.plan import AgentFacts, micro_batch_rows, plan_experiment, render
from workbench.train.rundir import RunWriter, create_run_dir
from workbench.train.trainer import start_trainer

GiB = 2**30
QWEN3_1_7B = REFERENCE_CONFIGS["Qwen/Qwen3-1.7B-Base"]
TINY = {
    "llama": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
              "tie_word_embeddings": False},
    "qwen3": {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 300},
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 300},
}  # fmt: skip


def _model(name):
    data = dict(TINY[name])
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(data.pop("model_type"), **data))


def test_qwen3_1_7b_dims_and_kv_cache_from_its_config_dict():
    dims = ModelDims.from_config(QWEN3_1_7B)
    assert (dims.layers, dims.hidden, dims.kv_dim, dims.q_dim, dims.vocab) == (28, 2048, 1024, 2048, 151936)
    assert dims.kv_bytes(1, 2) == 28 * 2 * 8 * 128 * 2  # 112 KiB per token in bf16
    inventory = Inventory.from_config(QWEN3_1_7B)  # on the meta device: no memory, no weights
    # the model card's 1.4B non-embedding parameters (the LM head is tied to the embeddings)
    assert inventory.head == 0
    assert inventory.params - 151936 * 2048 == pytest.approx(1.4e9, rel=0.03)


@pytest.mark.parametrize("name", list(TINY))
def test_the_inventory_counts_what_transformers_and_peft_build(name):
    from peft import LoraConfig, get_peft_model

    inventory = Inventory.from_config(TINY[name])
    model = _model(name)
    assert inventory.params == sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings().weight
    assert inventory.head == (0 if head is model.get_input_embeddings().weight else head.numel())
    for targets in ("all-linear", ("c_attn",) if name == "gpt2" else ("q_proj", "v_proj")):
        r = 3
        adapters = sum(r * (i + o) for _, i, o, _ in inventory.matching(targets))
        peft_model = get_peft_model(
            _model(name),
            LoraConfig(r=r, target_modules=list(targets) if isinstance(targets, tuple) else targets),
        )
        assert adapters == sum(p.numel() for p in peft_model.parameters() if p.requires_grad)


def test_agent_memory_follows_the_precision_policy():
    inventory = Inventory.from_config(QWEN3_1_7B)
    n, q = inventory.params, inventory.quantizable
    lora = {"r": 32, "target_modules": "all-linear"}
    full_cpu = agent_memory(AgentSpec("m"), inventory, "cpu", kl=True)
    assert full_cpu.weights == 4 * n and full_cpu.optimizer == 8 * n and full_cpu.reference == 4 * n
    full_cuda = agent_memory(AgentSpec("m"), inventory, "cuda", kl=True)
    assert full_cuda.weights == 4 * n and full_cuda.reference == 2 * n  # fp32 master, bf16 frozen reference
    qlora = agent_memory(AgentSpec("m", lora=lora, quantization="4bit"), inventory, "cuda", kl=True)
    assert qlora.weights == int((n - q) * 2 + q * NF4_BYTES_PER_PARAM) and qlora.reference == 0
    assert qlora.adapters == 4 * qlora.trainable and qlora.optimizer == 8 * qlora.trainable
    assert qlora.checkpoint == 0
    # on CPU bitsandbytes quantizes from the memory-mapped checkpoint, which stays resident (bf16 file here)
    on_cpu = agent_memory(
        AgentSpec("m", lora=lora, quantization="4bit"), inventory, "cpu", kl=False, checkpoint_bytes=2
    )
    assert (
        on_cpu.checkpoint == 2 * n
        and on_cpu.resident == on_cpu.weights + on_cpu.adapters + on_cpu.optimizer + 2 * n
    )


@pytest.mark.parametrize(
    ("name", "targets"),
    [
        *((name, None) for name in TINY),
        ("llama", "all-linear"),
        ("qwen3", ("q_proj", "k_proj", "v_proj", "o_proj")),
    ],
)
def test_saved_activations_match_what_autograd_keeps(name, targets):
    """The activation model (elements per token and layer) against the bytes autograd saves (within 15%), for
    full fine-tuning, LoRA on every projection and LoRA on the attention only."""
    from peft import LoraConfig, get_peft_model

    model = _model(name)
    spec = AgentSpec("m", lora=None if targets is None else {"r": 8, "target_modules": targets})
    if targets is not None:
        model.requires_grad_(False)
        model = get_peft_model(model, LoraConfig(r=8, target_modules=targets)).get_base_model()
    dims, trained = ModelDims.from_config(TINY[name]), trained_kind(spec, Inventory.from_config(TINY[name]))
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    B, T = 4, 48
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.eval().base_model(
            input_ids=torch.randint(0, 300, (B, T)), attention_mask=torch.ones(B, T, dtype=torch.long)
        )
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = sum(v for k, v in seen.items() if k not in params)
    predicted = dims.saved_per_token(T, checkpointing=False, trained=trained) * B * T * 4
    assert saved == pytest.approx(predicted, rel=0.15)


def test_rows_fill_the_budget_and_stop_at_the_cpu_cap(bpe_agent):
    dims = ModelDims.from_config(bpe_agent.model.config)
    per_row = generation_row_bytes(dims, 4, 12, 20, sampled=True)
    assert generation_rows(bpe_agent, 12, 20, sampled=True, budget=7 * per_row + 1) == 7
    assert generation_rows(bpe_agent, 12, 20, sampled=True, budget=0) == 1  # always at least one row
    assert generation_rows(bpe_agent, 12, 20, sampled=True) == CPU_MAX_ROWS  # a tiny model on a CPU
    assert rows_within(100 * per_row, per_row, 10_000, "cuda") == 100  # no cap but memory on CUDA


def _recipe_plan(memory_gib, *overrides):
    cfg = load_experiment(project_path("experiments/gpu/qwen3-1.7b-base_qwen3-4b-base.yaml"), list(overrides))
    facts = [
        AgentFacts(REFERENCE_CONFIGS[spec.model], "cuda:0", memory_gib * GiB, 256) for spec in cfg.agents
    ]
    return plan_experiment(cfg, facts)


def test_the_qwen3_recipe_plan_fits_every_phase_in_its_budget():
    big, small = _recipe_plan(80), _recipe_plan(24)
    for plan in (big, small):
        device = plan.devices["cuda:0"]
        assert device["peak"] <= device["usable"]
        for agent in plan.agents:
            assert max(agent.phases[k] for k in ("generate", "eval", "update")) <= agent.budget
    assert [a.rollout_rows for a in big.agents] == [256, 256]  # a whole step's rollouts in one batch
    assert all(s.eval_rows < b.eval_rows for s, b in zip(small.agents, big.agents))
    # 64 greedy rows at 2,048 new tokens would not fit a 24 GiB card next to the two models
    row = generation_row_bytes(small.agents[0].dims, 2, 256, 2048, sampled=False)
    assert 64 * row > small.agents[0].budget


def test_the_vllm_servers_are_taken_off_the_device_before_the_budgets_are_shared():
    full = ("agents.0.quantization=none", "agents.1.quantization=none", "executor=threads")
    hf, vllm = _recipe_plan(80, *full), _recipe_plan(80, *full, "train.engine=vllm", "train.engine_kv_gib=4")
    params = [Inventory.from_config(a.facts.config).params for a in vllm.agents]
    servers = sum(engine_bytes(Inventory.from_config(a.facts.config), "cuda", 4 * GiB) for a in vllm.agents)
    # each server: its weights in bf16, 4 GiB of KV cache and its runtime
    assert servers == 2 * sum(params) + 2 * (4 * GiB + ENGINE_RUNTIME_BYTES["cuda"])
    before, after = hf.devices["cuda:0"], vllm.devices["cuda:0"]
    assert after["engine"] == servers and before["engine"] == 0
    assert after["budget"] == before["budget"] - servers // 2  # threads: two agents share what is left
    assert after["peak"] - after["engine"] <= before["peak"]
    for agent in vllm.agents:  # the trainer samples nothing itself
        assert agent.phases["generate"] == 0 and agent.phases["kv_rollout"] == 0
    assert all(a.phases["eval"] > 0 for a in vllm.agents)  # evaluation stays the trainer's
    facts = [a.facts for a in vllm.agents]
    cfg = load_experiment(
        project_path("experiments/gpu/qwen3-1.7b-base_qwen3-4b-base.yaml"),
        [*full, "train.engine=vllm", "train.engine_kv_gib=4"],
    )
    text = render(plan_experiment(cfg, facts), cfg)
    assert "vLLM servers" in text and "| vLLM server |" in text and "by its vLLM server" in text


def test_micro_batches_cut_by_tokens_shrink_the_planned_update():
    assert micro_batch_rows(8, None, 1000) == 8
    assert micro_batch_rows(8, 2500, 1000) == 3  # rounded up: never fewer tokens than a micro-batch holds
    assert micro_batch_rows(8, 100, 1000) == 1  # a longer sequence goes alone
    assert micro_batch_rows(2, 10_000, 1000) == 2
    by_rows, by_tokens = _recipe_plan(80), _recipe_plan(80, "train.micro_batch_tokens=2048")
    for rows, tokens in zip(by_rows.agents, by_tokens.agents):
        assert tokens.phases["activations"] < rows.phases["activations"]
        assert tokens.phases["score"] <= rows.phases["score"]


def test_the_trainer_hands_each_worker_the_budget_of_its_plan(tmp_path):
    cfg = from_dict(
        {
            "experiment": "plan",
            "agents": [
                {"model": "tiny:gpt2-char", "device": "cpu"},
                {"model": "tiny:llama-bpe", "device": "cpu"},
            ],
            "train": {"prompts_per_step": 2, "group_size": 2, "minibatch_prompts": 1, "memory_fraction": 0.5},
            "task": {"train_size": 8, "eval_size": 0},
            "output": {"root": str(tmp_path)},
        }
    )
    run_dir = create_run_dir(tmp_path, cfg.experiment)
    RunWriter(run_dir).write_config(cfg.to_dict())
    trainer = start_trainer(cfg, run_dir)
    budgets = trainer.memory_plan.budgets
    assert budgets[0] == budgets[1] > 0  # one device, agents one after another: the same budget each
    for worker, budget in zip(trainer.executor.workers, budgets):
        assert worker.memory_budget == worker.engine.memory_budget == budget
    device = trainer.memory_plan.devices["cpu"]
    assert device["usable"] == device["total"] // 2


@pytest.fixture
def cli(caplog):
    """``main(argv)`` in this process; returns (exit code, everything it logged)."""
    caplog.set_level(logging.INFO)

    def call(*argv: str) -> tuple[int, str]:
        caplog.clear()
        return main(list(argv)), "\n".join(caplog.messages)

    return call


def test_the_plan_command_prints_a_table_without_loading_weights(cli):
    code, out = cli(
        "plan", "experiments/gpu/qwen3-1.7b-base_qwen3-4b-base.yaml", "--device", "cuda", "--memory", "80GiB"
    )
    assert code == 0 and "| qwen3-1.7b-base | cuda:0 |" in out and "predicted peak" in out
    code, out = cli("plan", "experiments/quickstart.yaml", "--device", "cpu", "--memory", "24GiB")
    assert code == 0 and "| gpt2-char | cpu |" in out and "longest prompt" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_planning_for_cuda_without_a_gpu_needs_the_memory_size(cli):
    code, out = cli("plan", "experiments/quickstart.yaml", "--device", "cuda")
    assert code == 2 and "--memory" in out
