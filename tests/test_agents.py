"""Agents: specs, loading errors, generation, scoring, LoRA and 4-bit, on tiny models of two architectures."""

from __future__ import annotations

import math

import pytest
import torch

from workbench.agents.forward.agent import AgentLoadError, state_digest
from workbench.agents.forward.passes import reference_token_logprobs, sequence_logprobs, token_logprobs
from workbench.agents.forward.sharing import build_training_batch
from workbench.agents.forward.tokens import self_token_batch
from workbench.agents.generation.rollout import generate
from workbench.agents.generation.sampling import pick_B, preallocate, shared_prefix
from workbench.agents.models.hf import bnb_config, lora_config
from workbench.agents.models.loading import load_agent
from workbench.config.agent_spec import AgentSpec, AgentSpecError, LoraSpec
from workbench.train.scoring import UpdateSettings, score_own

PROMPTS = ["3+4*2", "7-1", "2*3*4-5"]

# ---------------------------------------------------------------------------------------------------------
# Specs and configs (pure)


def test_spec_from_dict_rejects_unknown_key_naming_valid_keys():
    with pytest.raises(
        AgentSpecError,
        match=r"unknown key agent.learning_rate; valid keys of 'agent'.*'quantization'.*did you mean",
    ):
        AgentSpec.from_dict({"model": "tiny:gpt2-char", "learning_rate": 1e-4})
    with pytest.raises(AgentSpecError, match=r"unknown key lora.rank; valid keys of 'lora'"):
        AgentSpec.from_dict({"model": "x", "lora": {"rank": 8}})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"quantization": "3bit", "lora": {"r": 4}}, r"quantization = '3bit'.*\['none', '4bit', '8bit'\]"),
        ({"lora": {"r": 0}}, r"lora.r = 0.*>= 1"),
        ({"quantization": "4bit"}, r"needs lora"),
        ({"temperature": -1.0}, r"temperature = -1.0"),
        ({"top_p": 0.0}, r"top_p = 0.0"),
        ({"max_new_tokens": 0}, r"max_new_tokens = 0"),
        ({"prompt_template": "Q: {question}"}, r"prompt_template.*\{content\}"),
        ({"device": "gpu"}, r"device = 'gpu'"),
        ({"dtype": "fp8"}, r"dtype = 'fp8'"),
    ],
)
def test_spec_validation_names_field_and_allowed_values(fields, message):
    with pytest.raises(AgentSpecError, match=message):
        AgentSpec.from_dict({"model": "tiny:gpt2-char", **fields})


def test_spec_round_trips_through_plain_data():
    spec = AgentSpec.from_dict(
        {"model": "m", "name": "a", "lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}}
    )
    assert spec.lora == LoraSpec(r=8, alpha=16, target_modules=("q_proj", "v_proj"))
    assert AgentSpec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict()["lora"]["target_modules"] == ["q_proj", "v_proj"]
    assert AgentSpec(model="tiny:gpt2-char").display_name == "gpt2-char"
    assert AgentSpec(model="Qwen/Qwen3-1.7B-Base").display_name == "Qwen3-1.7B-Base"


def test_lora_and_bnb_configs_are_built_from_the_spec():
    cfg = lora_config(LoraSpec(r=4, alpha=8, dropout=0.1, target_modules=("q_proj",)))
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout, set(cfg.target_modules)) == (4, 8, 0.1, {"q_proj"})
    assert str(cfg.task_type.value if hasattr(cfg.task_type, "value") else cfg.task_type) == "CAUSAL_LM"
    q4 = bnb_config("4bit", torch.float32)
    assert q4.load_in_4bit and q4.bnb_4bit_quant_type == "nf4" and q4.bnb_4bit_use_double_quant
    assert q4.bnb_4bit_compute_dtype == torch.float32
    assert bnb_config("8bit", torch.float32).load_in_8bit
    assert bnb_config("none", torch.float32) is None


# ---------------------------------------------------------------------------------------------------------
# Loading errors


def test_bad_path_names_the_path_and_the_fix(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(AgentLoadError, match=r"no-such-model.*does not exist.*fix the path"):
        load_agent(str(missing))
    (tmp_path / "empty").mkdir()
    with pytest.raises(AgentLoadError, match=r"has no config.json.*save_pretrained"):
        load_agent(str(tmp_path / "empty"))


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(AgentLoadError, match=r"'smollm3' is not an embedded model.*smollm2-135m-instruct"):
        load_agent("smollm3")
    with pytest.raises(KeyError, match=r"unknown tiny preset 'nope'.*gpt2-char"):
        load_agent("tiny:nope")


def test_hub_id_offline_error_explains_the_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(AgentLoadError, match=r"HF_HUB_OFFLINE"):
        load_agent("no-such-owner-xyz/no-such-model-xyz")


# ---------------------------------------------------------------------------------------------------------
# Generation


@pytest.mark.parametrize("which", ["char_agent", "bpe_agent"])
def test_generate_returns_prompt_major_rollouts(which, request):
    agent = request.getfixturevalue(which)
    rollouts = generate(agent, PROMPTS, n=3, author=2, seed=0, max_new_tokens=24)
    assert [r.prompt_index for r in rollouts] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert all(r.author == 2 and r.prompt == PROMPTS[r.prompt_index] for r in rollouts)
    for r in rollouts:
        assert r.prompt_ids == agent.encode_prompt(r.prompt)
        assert agent.pad_token_id not in r.response_ids[:-1] or agent.pad_token_id == agent.eos_token_id
        if r.finish_reason == "eos":
            assert r.response_ids[-1] == agent.eos_token_id and agent.eos_token_id not in r.response_ids[:-1]
            body = r.response_ids[:-1]
        else:
            assert r.finish_reason == "length" and len(r.response_ids) == 24
            body = r.response_ids
        assert r.text == agent.tokenizer.decode(body, skip_special_tokens=True)
        assert r.length == len(r.response_ids) and math.isnan(r.old_logp_sum)


def test_generate_is_deterministic_given_a_seed(char_agent):
    a = generate(char_agent, PROMPTS, n=4, seed=7)
    b = generate(char_agent, PROMPTS, n=4, seed=7)
    c = generate(char_agent, PROMPTS, n=4, seed=8)
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    assert [r.response_ids for r in a] != [r.response_ids for r in c]


@pytest.mark.parametrize("which", ["char_agent", "bpe_agent"])
def test_batched_greedy_equals_unbatched_greedy_without_cache(which, request):
    """Left padding, the KV cache and dropping finished rows change nothing: compare with a plain loop."""
    agent = request.getfixturevalue(which)
    prompts = ["1+2", "9*9*9-8", "4", "5*6+7*8"]  # different lengths -> different left padding
    batched = generate(agent, prompts, n=1, temperature=0.0, max_new_tokens=20, batch_size=3)
    for prompt, rollout in zip(prompts, batched):
        ids = agent.encode_prompt(prompt)
        response: list[int] = []
        with torch.no_grad():
            for _ in range(20):
                logits = agent.model(input_ids=torch.tensor([ids + response])).logits[0, -1]
                response.append(int(logits.argmax()))
                if response[-1] == agent.eos_token_id:
                    break
        assert rollout.response_ids == response


def test_generate_rejects_context_overflow_and_bad_settings(char_agent):
    with pytest.raises(ValueError, match=r"exceeds the model's context of 256"):
        generate(char_agent, ["1+1"], max_new_tokens=300)
    with pytest.raises(ValueError, match=r"top_p in \(0, 1\]"):
        generate(char_agent, ["1+1"], top_p=1.5)
    assert generate(char_agent, []) == []


def test_top_p_keeps_the_nucleus_only():
    logits_B_V = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.1, 0.2, 0.7]]))
    gen = torch.Generator().manual_seed(0)
    picks = torch.stack([pick_B(logits_B_V, 1.0, 0.5, gen) for _ in range(50)])
    assert (picks[:, 0] == 0).all() and (picks[:, 1] == 2).all()
    picks = torch.stack([pick_B(logits_B_V, 1.0, 0.85, gen) for _ in range(200)])
    assert set(picks[:, 0].tolist()) == {0, 1}  # 0.6 + 0.3 covers 0.85; the 0.1 token is cut


def _greedy_without_cache(agent, prompt_ids, max_new_tokens):
    """Greedy decoding by full forwards over one unpadded sequence: no cache, no batch, no padding."""
    response: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = agent.model(input_ids=torch.tensor([prompt_ids + response])).logits[0, -1]
            response.append(int(logits.argmax()))
            if response[-1] in agent.stop_token_ids:
                break
    return response


@pytest.mark.parametrize("which", ["char_agent", "bpe_agent"])
@pytest.mark.parametrize(
    "prompts",
    [
        ["1+2*3", "1+2*3-4", "1+2*3*5+6", "1+2*3"],  # a long shared prefix, one prompt is another's prefix
        ["8", "1+2", "9*9*9-8", "1+2"],  # only the template's prefix is shared; duplicates
        ["7*7"],  # one distinct prompt: no prefix pass
    ],
)
def test_shared_prefill_gives_the_greedy_tokens_of_a_plain_loop(which, prompts, request):
    """Distinct prompts prefilled once, the shared prefix once, n rows expanded: the same greedy tokens."""
    agent = request.getfixturevalue(which)
    rollouts = generate(agent, prompts, n=2, temperature=0.0, max_new_tokens=16)
    assert [r.prompt_index for r in rollouts] == [i for i in range(len(prompts)) for _ in range(2)]
    for r in rollouts:
        assert r.response_ids == _greedy_without_cache(agent, r.prompt_ids, 16)


def test_chunked_lm_head_gives_the_same_greedy_tokens_and_is_restored(bpe_agent, monkeypatch):
    """The decode-time LM head in slices of columns (a 400-token vocabulary in slices of 64 here)."""
    import workbench.agents.generation.sampling as sampling_module

    monkeypatch.setattr(sampling_module, "HEAD_CHUNK", 64)
    head = bpe_agent.model.get_output_embeddings()
    assert head.out_features > 64
    prompts = ["1+2*3", "9-4", "7*7+1"]
    for r in generate(bpe_agent, prompts, n=1, temperature=0.0, max_new_tokens=16):
        assert r.response_ids == _greedy_without_cache(bpe_agent, r.prompt_ids, 16)
    assert "forward" not in vars(head)  # the class's forward is back


def test_shared_prefix_leaves_every_prompt_a_token_of_its_own():
    assert shared_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert shared_prefix([[1, 2, 3], [1, 2, 3, 4]]) == 2  # the first prompt keeps its last token
    assert shared_prefix([[1, 2], [3, 4]]) == 0
    assert shared_prefix([[7], [7, 8]]) == 0


@pytest.mark.parametrize("which", ["char_agent", "bpe_agent"])
def test_preallocated_cache_gives_the_logits_of_the_dynamic_cache(which, request):
    """Row expansion, one-token updates and dropping rows: the same logits as transformers' own cache."""
    model = request.getfixturevalue(which).model
    ids_B_T = torch.tensor([[5, 6, 7, 8, 9], [9, 10, 11, 12, 13]])
    rows_R = torch.tensor([0, 1, 1, 0])
    with torch.no_grad():
        reference = model(input_ids=ids_B_T, use_cache=True).cache
        reference.batch_select_indices(rows_R)
        cache = preallocate(model(input_ids=ids_B_T, use_cache=True).cache, rows_R, capacity=8)
        token_R = torch.tensor([[3], [4], [5], [6]])
        for step in range(3):
            expected = model(input_ids=token_R, cache=reference, use_cache=True).logits
            got = model(input_ids=token_R, cache=cache, use_cache=True).logits
            assert torch.allclose(got, expected, atol=1e-5)
            if step == 0:  # rows 1 and 3 finish
                keep = torch.tensor([0, 2])
                reference.batch_select_indices(keep)
                cache.batch_select_indices(keep)
                token_R = token_R[keep]
        with pytest.raises(RuntimeError, match="KV cache of 8 tokens is full"):
            model(input_ids=torch.tensor([[1], [2]]), cache=cache, use_cache=True)


def test_inverse_cdf_sampling_draws_the_tempered_distribution():
    probs_V = torch.tensor([0.5, 0.25, 0.125, 0.125, 0.0])
    gen = torch.Generator().manual_seed(0)
    picks = pick_B(probs_V.log().expand(8000, -1), 1.0, 1.0, gen)
    freq_V = torch.bincount(picks, minlength=5) / len(picks)
    assert freq_V[4] == 0  # a zero-probability token is never drawn
    assert torch.allclose(freq_V[:4], probs_V[:4], atol=0.025)
    picks = pick_B(probs_V.log().expand(8000, -1), 2.0, 1.0, gen)  # softmax(log p / 2) ∝ sqrt(p)
    tempered_V = probs_V.sqrt() / probs_V.sqrt().sum()
    assert torch.allclose(torch.bincount(picks, minlength=5) / len(picks), tempered_V, atol=0.025)
    # a 50k vocabulary whose tail of 1e-5 tokens holds half the mass: the tail keeps its share
    tail_V = torch.full((50_000,), 0.5 / 49_999)
    tail_V[123] = 0.5
    picks = pick_B(tail_V.log().expand(8000, -1), 1.0, 1.0, gen)
    assert (picks == 123).float().mean().item() == pytest.approx(0.5, abs=0.025)
    assert len(set(picks.tolist())) > 3000


def test_inverse_cdf_never_draws_a_zero_probability_token_when_u_rounds_onto_the_total(monkeypatch):
    logits_B_V = torch.tensor([[0.0, 0.0, -math.inf]]).expand(50, -1)
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.ones(shape, dtype=torch.float64))
    picks = pick_B(logits_B_V, 1.0, 1.0, torch.Generator().manual_seed(0))
    assert set(picks.tolist()) <= {0, 1} and len(set(picks.tolist())) == 2


def test_sampling_in_several_batches_is_seeded_prompt_major_and_greedy_exact(char_agent):
    """Rows sampled in length-sorted batches come back prompt-major, fixed by a seed; greedy unchanged."""
    prompts = ["1+2", "9*9*9-8", "4", "5*6+7*8"]
    a = generate(char_agent, prompts, n=3, seed=11, batch_size=5, max_new_tokens=12)
    b = generate(char_agent, prompts, n=3, seed=11, batch_size=5, max_new_tokens=12)
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    assert [(r.prompt_index, r.index) for r in a] == [(i, g) for i in range(4) for g in range(3)]
    assert all(r.prompt_ids == char_agent.encode_prompt(prompts[r.prompt_index]) for r in a)
    greedy_batched = generate(char_agent, prompts, n=2, temperature=0.0, batch_size=3, max_new_tokens=12)
    greedy_one = generate(char_agent, prompts, n=2, temperature=0.0, max_new_tokens=12)
    assert [r.response_ids for r in greedy_batched] == [r.response_ids for r in greedy_one]


# ---------------------------------------------------------------------------------------------------------
# Scoring and log-probs


def _direct_logps(agent, prompt_ids, response_ids, temperature):
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = agent.model(input_ids=ids).logits[0].double() / temperature
    logp = torch.log_softmax(logits, -1)
    start = len(prompt_ids)
    return [float(logp[start - 1 + i, t]) for i, t in enumerate(response_ids)]


def test_old_scores_match_a_direct_forward_at_the_sampling_temperature(bpe_agent):
    rollouts = generate(bpe_agent, PROMPTS, n=2, seed=1, temperature=0.7)
    score_own(bpe_agent, rollouts, UpdateSettings(temperature=0.7, minibatch_size=4, micro_batch_size=3))
    for r in rollouts:
        expected = _direct_logps(bpe_agent, r.prompt_ids, r.response_ids, 0.7)
        assert r.old_logp_count == len(r.response_ids)
        assert r.old_logp_sum == pytest.approx(sum(expected), abs=1e-3)


def test_token_logprobs_alignment_and_mask(char_agent):
    rollouts = generate(char_agent, PROMPTS, n=1, seed=2, max_new_tokens=12)
    batch = self_token_batch(rollouts, char_agent.pad_token_id)
    logp_B_T, mask_B_T = token_logprobs(char_agent, batch, temperature=1.0)
    assert logp_B_T.shape == mask_B_T.shape == (len(rollouts), batch.input_ids_B_T.shape[1] - 1)
    for b, r in enumerate(rollouts):
        start = len(r.prompt_ids) - 1
        expected = _direct_logps(char_agent, r.prompt_ids, r.response_ids, 1.0)
        got = logp_B_T[b, start : start + len(r.response_ids)]
        assert torch.allclose(got.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-4)
        assert mask_B_T[b].sum() == len(r.response_ids)
        assert mask_B_T[b, start : start + len(r.response_ids)].all()


@pytest.mark.parametrize("which", ["char_agent", "bpe_agent"])
def test_on_policy_self_samples_have_sequence_ratio_one(which, request):
    agent = request.getfixturevalue(which)
    rollouts = generate(agent, PROMPTS, n=4, seed=3)
    score_own(agent, rollouts, UpdateSettings())
    batch, counts = build_training_batch(agent, rollouts, learner_index=0)
    assert counts["self"] == len(rollouts) and counts["reencoded"] == 0
    new_mean_B = sequence_logprobs(agent, batch)
    old_mean_B = torch.tensor([r.old_logp_mean for r in rollouts], dtype=new_mean_B.dtype)
    ratio_B = torch.exp(new_mean_B.detach() - old_mean_B)
    assert torch.allclose(ratio_B, torch.ones_like(ratio_B), rtol=0, atol=1e-6)
    assert new_mean_B.requires_grad


# ---------------------------------------------------------------------------------------------------------
# Training: full fine-tuning, LoRA, 4-bit


def _train_steps(agent, steps=3, lr=1e-2):
    rollouts = generate(agent, PROMPTS, n=2, seed=4, max_new_tokens=16)
    batch, _ = build_training_batch(agent, rollouts, learner_index=0)
    optimizer = torch.optim.AdamW(agent.trainable_parameters(), lr=lr)
    for _ in range(steps):
        loss = -sequence_logprobs(agent, batch).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return batch


def test_lora_moves_adapters_only_and_state_dict_round_trips(bpe_agent_dir):
    agent = load_agent({"model": str(bpe_agent_dir), "lora": {"r": 4, "alpha": 8}})
    before = {k: v.detach().clone() for k, v in agent.model.named_parameters()}
    adapter_before = agent.trainable_state_dict()
    assert adapter_before and all("lora_" in k for k in adapter_before)
    batch = _train_steps(agent)
    for name, param in agent.model.named_parameters():
        if "lora_" not in name:
            assert torch.equal(before[name], param.detach()), f"base weight {name} moved"
    assert any("lora_B" in n and not torch.equal(before[n], p) for n, p in agent.model.named_parameters())
    # the reference is the base model: adapters disabled (lora_B started at zero)
    ref_logp, _ = reference_token_logprobs(agent, batch)
    fresh = load_agent(str(bpe_agent_dir))
    base_logp, _ = token_logprobs(fresh, batch)
    assert torch.allclose(ref_logp, base_logp.detach(), atol=1e-5)
    # checkpoint round trip
    trained = agent.trainable_state_dict()
    agent.load_trainable_state_dict(adapter_before)
    assert torch.allclose(token_logprobs(agent, batch)[0], base_logp, atol=1e-5)
    agent.load_trainable_state_dict(trained)
    assert not torch.allclose(token_logprobs(agent, batch)[0], base_logp, atol=1e-3)


def test_weights_digest_names_every_tensor_with_lora_adapters_included(bpe_agent_dir):
    plain = load_agent(str(bpe_agent_dir))
    assert plain.weights_digest() == load_agent(str(bpe_agent_dir)).weights_digest()
    lora = load_agent({"model": str(bpe_agent_dir), "lora": {"r": 4, "alpha": 8}})
    again = load_agent({"model": str(bpe_agent_dir), "lora": {"r": 4, "alpha": 8}})
    other_init = load_agent({"model": str(bpe_agent_dir), "lora": {"r": 4, "alpha": 8}, "seed": 1})
    assert lora.weights_digest() == again.weights_digest()  # adapters initialized from the agent's seed
    assert len({plain.weights_digest(), lora.weights_digest(), other_init.weights_digest()}) == 3
    name, param = next((n, p) for n, p in lora.model.named_parameters() if "lora_A" in n)
    before = lora.weights_digest()
    with torch.no_grad():
        param[0, 0] += 1.0
    assert lora.weights_digest() != before, name
    # Name, dtype and shape count besides the bytes; the dict's order does not.
    zeros = torch.zeros(2, dtype=torch.int32)
    assert state_digest({"x": zeros, "y": zeros}) == state_digest({"y": zeros, "x": zeros})
    variants = [{"x": zeros}, {"z": zeros}, {"x": zeros.float()}, {"x": zeros.view(1, 2)}]
    assert len({state_digest(v) for v in variants}) == 4


def test_full_finetune_reference_is_the_initial_model(char_agent_dir):
    agent = load_agent(str(char_agent_dir))
    assert len(agent.trainable_parameters()) == len(list(agent.model.parameters()))
    batch = _train_steps(agent, steps=2)
    initial = load_agent(str(char_agent_dir))
    ref_logp, _ = reference_token_logprobs(agent, batch)
    init_logp, _ = token_logprobs(initial, batch)
    assert torch.allclose(ref_logp, init_logp.detach(), atol=1e-5)
    assert not torch.allclose(token_logprobs(agent, batch)[0].detach(), init_logp.detach(), atol=1e-3)
    assert set(agent.trainable_state_dict()) == set(agent.model.state_dict())


def _lora_grads(agent, batch):
    agent.model.zero_grad()
    (-sequence_logprobs(agent, batch).mean()).backward()
    return {n: p.grad.clone() for n, p in agent.model.named_parameters() if p.grad is not None}


def test_4bit_quantizes_gpt2_conv1d_layers_too(char_agent_dir):
    import bitsandbytes as bnb

    agent = load_agent({"model": str(char_agent_dir), "quantization": "4bit", "lora": {"r": 2}})
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in agent.model.modules())
    assert len(generate(agent, PROMPTS[:1], n=2, seed=0, max_new_tokens=8)) == 2


def test_4bit_lora_loads_on_cpu_and_trains_with_correct_gradients(bpe_agent_dir):
    import bitsandbytes as bnb

    spec = {"model": str(bpe_agent_dir), "quantization": "4bit", "lora": {"r": 4}}
    agent = load_agent(spec)
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in agent.model.modules())
    rollouts = generate(agent, PROMPTS, n=2, seed=5, max_new_tokens=12)  # no-grad eval passes first
    score_own(agent, rollouts, UpdateSettings())
    batch, _ = build_training_batch(agent, rollouts, learner_index=0)
    grads = _lora_grads(agent, batch)
    # Same gradients as a fresh copy that never ran a no-grad pass: no silent switch to a non-autograd kernel.
    fresh_grads = _lora_grads(load_agent(spec), batch)
    assert grads.keys() == fresh_grads.keys()
    for name in grads:
        assert torch.allclose(grads[name], fresh_grads[name], atol=1e-6), name
    lowest = [n for n in grads if "layers.0." in n and "lora_B" in n]
    assert lowest and all(grads[n].abs().sum() > 0 for n in lowest)
    before = {k: v.clone() for k, v in agent.trainable_state_dict().items()}
    _train_steps(agent, steps=1)
    assert any(not torch.equal(before[k], v) for k, v in agent.trainable_state_dict().items())


def test_8bit_lora_loads_and_generates_without_warning_spam(bpe_agent_dir, caplog):
    agent = load_agent({"model": str(bpe_agent_dir), "quantization": "8bit", "lora": {"r": 4}})
    with caplog.at_level("WARNING"):
        rollouts = generate(agent, PROMPTS[:1], n=2, seed=0, max_new_tokens=8)
    assert len(rollouts) == 2
    assert not [r for r in caplog.records if "inputs will be cast" in r.getMessage()]


@pytest.mark.gpu
def test_agent_on_cuda_generates_and_scores(bpe_agent_dir):
    agent = load_agent({"model": str(bpe_agent_dir), "device": "cuda", "dtype": "float32"})
    rollouts = generate(agent, PROMPTS, n=2, seed=0)
    score_own(agent, rollouts, UpdateSettings())
    assert agent.device.type == "cuda" and all(math.isfinite(r.old_logp_sum) for r in rollouts)


def test_gradient_checkpointing_gives_the_same_logprobs_and_gradients(bpe_agent_dir):
    plain = load_agent(str(bpe_agent_dir))
    checkpointed = load_agent({"model": str(bpe_agent_dir), "gradient_checkpointing": True})
    rollouts = generate(plain, PROMPTS, n=2, seed=6, max_new_tokens=12)
    batch, _ = build_training_batch(plain, rollouts, learner_index=0)
    grads = [_lora_grads(agent, batch) for agent in (plain, checkpointed)]
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-6) for n in grads[0])
    assert not checkpointed.model.training  # back in eval mode after the gradient pass
