"""Every peft LoRA setting under an agent's ``lora:``: checked against peft's own ``LoraConfig`` (names,
types, its own checks), and rsLoRA, DoRA and 4-bit DoRA training on a tiny model."""

import dataclasses

import pytest
import torch

from workbench.agents.models.hf import lora_config
from workbench.agents.models.loading import load_agent
from workbench.config.agent_spec import AgentSpec, AgentSpecError, LoraSpec
from workbench.config.experiment import from_dict
from workbench.config.peft_fields import SET_BY_WORKBENCH, lora_fields
from workbench.train.preflight import experiment_problems


def test_the_fields_are_peft_own():
    from peft import LoraConfig, PeftConfig

    own = {f.name for f in dataclasses.fields(LoraConfig)} - {f.name for f in dataclasses.fields(PeftConfig)}
    assert set(lora_fields()) == own
    accepted = sorted(own - set(SET_BY_WORKBENCH) - {"r", "target_modules"})
    assert "use_rslora" in accepted and "use_dora" in accepted and "modules_to_save" in accepted
    with pytest.raises(AgentSpecError) as info:
        LoraSpec.from_dict({"use_rslor": True})
    message = str(info.value)
    assert (
        message.startswith("unknown key lora.use_rslor; valid keys of 'lora'")
        and "did you mean lora.use_rslora?" in message
    )
    assert all(name in message for name in accepted)


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"use_dora": "yes"}, r"lora.use_dora = 'yes' is not allowed: bool \(peft LoraConfig.use_dora\)"),
        ({"bias": "some"}, r"lora.bias = 'some' is not allowed: Literal\['none', 'all', 'lora_only'\]"),
        (
            {"layers_to_transform": ["0"]},
            r"lora.layers_to_transform = \['0'\] is not allowed: Optional\[Union\[list\[int\], int\]\]",
        ),
        (
            {"lora_alpha": 8},
            r"lora.lora_alpha is not allowed: it is lora.alpha here; did you mean agents\[i\].lora.alpha",
        ),
        ({"task_type": "SEQ_CLS"}, r"lora.task_type is not allowed: the workbench trains causal LMs"),
    ],
)
def test_a_bad_peft_field_names_field_value_and_allowed(lora, message):
    with pytest.raises(AgentSpecError, match=message):
        AgentSpec.from_dict({"model": "tiny:gpt2-char", "lora": {"r": 4, **lora}})


def test_peft_own_checks_run_before_any_model_loads():
    spec = AgentSpec.from_dict({"model": "tiny:gpt2-char", "lora": {"r": 4, "layers_pattern": "h"}})
    with pytest.raises(AgentSpecError, match=r"not allowed by peft's LoraConfig: `layers_pattern` cannot be"):
        lora_config(spec.lora)
    cfg = from_dict({"experiment": "x", "agents": [spec.to_dict(), "tiny:llama-bpe"]})
    assert any("agents[0].lora" in p and "`layers_pattern` cannot be" in p for p in experiment_problems(cfg))


def _one_step(agent) -> dict[str, torch.Tensor]:
    """The trainable weights that one AdamW step (no weight decay) on a token loss changed."""
    named = {n: p for n, p in agent.model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in named.items()}
    optimizer = torch.optim.AdamW(named.values(), lr=1e-2, weight_decay=0.0)
    ids = torch.tensor([agent.tokenizer.encode("Q: 2+3\nA: 5")], device=agent.device)
    agent.model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    return {n: p for n, p in named.items() if not torch.equal(before[n], p.detach())}


def test_rslora_scales_by_the_root_of_the_rank_and_trains(char_agent_dir):
    plain = load_agent({"model": str(char_agent_dir), "lora": {"r": 4, "alpha": 8}})
    rs = load_agent({"model": str(char_agent_dir), "lora": {"r": 4, "alpha": 8, "use_rslora": True}})
    layer = next(m for m in rs.model.modules() if isinstance(getattr(m, "scaling", None), dict) and m.scaling)
    assert layer.scaling["default"] == pytest.approx(8 / 4**0.5)
    assert (
        next(
            m for m in plain.model.modules() if isinstance(getattr(m, "scaling", None), dict) and m.scaling
        ).scaling["default"]
        == 2.0
    )
    assert any("lora_B" in n for n in _one_step(rs))


@pytest.mark.parametrize("quantization", ["none", "4bit"])
def test_dora_trains_its_magnitudes(bpe_agent_dir, quantization):
    agent = load_agent(
        {"model": str(bpe_agent_dir), "quantization": quantization, "lora": {"r": 4, "use_dora": True}}
    )
    changed = _one_step(agent)
    assert any("lora_magnitude_vector" in n for n in changed) and any("lora_B" in n for n in changed)
    state = agent.trainable_state_dict()  # what a checkpoint holds: the magnitudes too
    assert any("lora_magnitude_vector" in k for k in state)
