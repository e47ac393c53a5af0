"""Packed (padding-free) forward passes equal padded ones: layout, log-probs and gradients, every family.

Tolerance (float32): log-probs within 1e-5 absolute; gradients within 1e-5 absolute + 1e-4 relative per
element and 1e-5 relative in norm, of the padded layout's (the same ops on differently shaped tensors sum in
another order; nothing else differs).
"""

import contextlib

import pytest
import torch

from workbench.agents.forward import packing, passes
from workbench.agents.forward.packing import (
    length_buckets,
    pack_rows,
    packed_attention,
    packed_tokens,
    supports_packing,
)
from workbench.agents.forward.passes import token_logprobs
from workbench.agents.forward.tokens import pack, self_token_batch
from workbench.agents.generation.rollout import generate
from workbench.agents.models.loading import load_agent

LOGP_TOL = {"atol": 1e-5, "rtol": 0.0}
GRAD_TOL = {"atol": 1e-5, "rtol": 1e-4}
GRAD_NORM_TOL = 1e-5
PROMPTS = ["2+3", "4-1+7", "9-2"]


def test_pack_rows_keeps_each_prompt_once_and_every_row_position():
    # Rows 0 and 2 share the prompt [5, 6]; row 1 has its own; row 3 has an empty response.
    batch = pack([([5, 6], [7, 8, 9]), ([4], [3]), ([5, 6], [2]), ([1, 1, 1], [])], pad_id=0)
    packed = pack_rows(batch)
    # the distinct prompts (in sorted order), then each row's response in row order
    assert packed.input_ids_1_N.tolist() == [[4, 5, 6, 1, 1, 1, 7, 8, 9, 3, 2]]
    assert packed.position_ids_1_N.tolist() == [[0, 0, 1, 0, 1, 2, 2, 3, 4, 1, 2]]
    assert packed_tokens(batch) == 11 < batch.attention_mask_B_T.sum() == 13
    gather_B_T = packed.gather_B_T
    for b in range(4):  # every real position of every row reads its own token back
        n = int(batch.attention_mask_B_T[b].sum())
        assert packed.input_ids_1_N[0, gather_B_T[b, :n]].tolist() == batch.input_ids_B_T[b, :n].tolist()
    assert gather_B_T[2, :2].tolist() == gather_B_T[0, :2].tolist() == [1, 2]  # the shared prompt copy
    # the buckets hold every row once, each bucket as wide as its longest row
    lengths = batch.attention_mask_B_T.sum(dim=-1).tolist()
    buckets = packed.attention.gathers
    seen = []
    for bucket in buckets:
        width = bucket.shape[1]
        rows = [next(b for b in range(4) if gather_B_T[b, :width].tolist() == g.tolist()) for g in bucket]
        assert max(lengths[b] for b in rows) == width and all(gather_B_T[rows, width:].eq(0).all(1))
        seen += rows
    assert sorted(seen) == [0, 1, 2, 3]
    # each packed token takes its attention output from a slot that holds it
    slots = torch.cat([g.flatten() for g in buckets])
    assert slots[packed.attention.source_N].tolist() == list(range(11))
    # scored tokens in the row-major order of response_mask[:, 1:], each predicted by the position before it
    keep_B_T = batch.response_mask_B_T[:, 1:].bool()
    assert packed.targets_S.tolist() == batch.input_ids_B_T[:, 1:][keep_B_T].tolist() == [7, 8, 9, 3, 2]
    assert packed.predictor_S.tolist() == [2, 6, 7, 0, 2]


def test_length_buckets_cut_where_padding_costs_more_than_a_bucket():
    lengths = [3, 40, 4, 41, 4]
    assert length_buckets(lengths, cost=10) == [[0, 2, 4], [1, 3]]  # 2 x 41 + 3 x 4 + 2 x 10
    assert length_buckets(lengths, cost=1000) == [[0, 2, 4, 1, 3]]  # one bucket: 5 x 41 + 1000
    assert length_buckets(lengths, cost=0) == [[0], [2, 4], [1], [3]]  # every distinct length alone
    assert length_buckets([7, 7]) == [[0, 1]] and length_buckets([]) == []


def _grads(agent, batch, *, packed: bool, monkeypatch, temperature=1.0):
    """Log-probs and the gradients of a weighted sum of them, packed (inside the packed block, as the update
    runs them) or padded."""
    with monkeypatch.context() as patch:
        if not packed:
            patch.setattr(passes, "supports_packing", lambda model: False)
        params = agent.trainable_parameters()
        with packed_attention(agent.model) if packed else contextlib.nullcontext():
            logp_B_T, mask_B_T = token_logprobs(agent, batch, temperature=temperature)
            weights_B_T = torch.linspace(0.5, 1.5, logp_B_T.numel()).view_as(logp_B_T)
            grads = torch.autograd.grad((logp_B_T * weights_B_T).sum(), params)
    return logp_B_T.detach(), mask_B_T, grads


def _assert_same(agent, batch, monkeypatch, **kwargs):
    assert supports_packing(agent.model)
    logp_p, mask_p, grads_p = _grads(agent, batch, packed=True, monkeypatch=monkeypatch, **kwargs)
    logp_d, mask_d, grads_d = _grads(agent, batch, packed=False, monkeypatch=monkeypatch, **kwargs)
    assert torch.equal(mask_p, mask_d)
    torch.testing.assert_close(logp_p, logp_d, **LOGP_TOL)
    assert len(grads_p) == len(grads_d) > 0
    for got, want in zip(grads_p, grads_d):
        torch.testing.assert_close(got, want, **GRAD_TOL)
        assert (got - want).norm() <= GRAD_NORM_TOL * want.norm()


def _mixed_batch(agent, other):
    """Own rows (shared prompts) and another agent's text re-encoded (longer, other lengths)."""
    from workbench.agents.forward.sharing import build_training_batch

    own = generate(agent, PROMPTS, n=3, seed=0, max_new_tokens=12, author=0)
    cross = generate(other, PROMPTS, n=2, seed=1, max_new_tokens=12, author=1)
    batch, _ = build_training_batch(agent, own + cross, learner_index=0)
    return batch


@pytest.mark.parametrize("bucket_cost", [packing.BUCKET_COST_SLOTS, 0])
@pytest.mark.parametrize("which", ["char_agent_dir", "bpe_agent_dir"])
def test_packed_logprobs_and_gradients_equal_the_padded_ones(
    which, bucket_cost, request, monkeypatch, bpe_agent
):
    """GPT-2 (learned positions, per row) and Llama (rotary positions), at a sampling temperature; with the
    default attention buckets and with one bucket per distinct row length."""
    monkeypatch.setattr(packing, "BUCKET_COST_SLOTS", bucket_cost)
    agent = load_agent(str(request.getfixturevalue(which)))
    _assert_same(agent, _mixed_batch(agent, bpe_agent), monkeypatch, temperature=0.7)


@pytest.mark.parametrize("spec", [{"lora": {"r": 4}}, {"quantization": "4bit", "lora": {"r": 4}}])
def test_packing_holds_for_lora_and_4bit_models(spec, bpe_agent_dir, char_agent, monkeypatch):
    agent = load_agent({"model": str(bpe_agent_dir), **spec})
    _assert_same(agent, _mixed_batch(agent, char_agent), monkeypatch)


def test_packing_holds_with_gradient_checkpointing_inside_the_packed_block(bpe_agent_dir, monkeypatch):
    """Checkpointed layers run their forward again in the backward pass: under the packed block, packed."""
    plain = load_agent(str(bpe_agent_dir))
    checkpointed = load_agent({"model": str(bpe_agent_dir), "gradient_checkpointing": True})
    batch = self_token_batch(generate(plain, PROMPTS, n=3, seed=2, max_new_tokens=12), plain.pad_token_id)
    _, _, want = _grads(plain, batch, packed=False, monkeypatch=monkeypatch)
    _, _, got = _grads(checkpointed, batch, packed=True, monkeypatch=monkeypatch)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **GRAD_TOL)
    seen = []
    monkeypatch.setattr(passes, "pack_rows", lambda b: seen.append(b) or pack_rows(b))
    token_logprobs(checkpointed, batch)[0].sum().backward()  # no packed block held: padded, never wrong
    assert not seen


def _tiny_gemma3(bpe_agent_dir, tmp_path, window):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bpe_agent_dir)
    ids = {"bos_token_id": tokenizer.eos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": 0}
    config = AutoConfig.for_model(
        "gemma3_text", vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=window,
        layer_types=["sliding_attention", "full_attention"], final_logit_softcapping=30.0, **ids,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return load_agent({"model": str(tmp_path), "device": "cpu"})


@pytest.mark.parametrize("window", [4, 512])
def test_gemma3_sliding_window_layers_pack_exactly(window, bpe_agent_dir, tmp_path, monkeypatch):
    """Gemma-3's local layers see the last ``window`` positions of their own row: binding (4) or not; rows
    in attention buckets of their own lengths."""
    monkeypatch.setattr(packing, "BUCKET_COST_SLOTS", 0)
    agent = _tiny_gemma3(bpe_agent_dir, tmp_path, window)
    batch = self_token_batch(generate(agent, PROMPTS, n=3, seed=0, max_new_tokens=10), agent.pad_token_id)
    assert batch.input_ids_B_T.shape[1] > 4
    _assert_same(agent, batch, monkeypatch)


def test_models_packing_cannot_reproduce_keep_the_padded_layout(bpe_agent_dir):
    agent = load_agent(str(bpe_agent_dir))
    config = agent.model.config
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(config, "attn_logit_softcapping", 50.0, raising=False)  # Gemma-2's attention cap
        assert not supports_packing(agent.model)
        patch.setattr(packing, "PACKABLE", frozenset())
        assert not supports_packing(agent.model)
    assert supports_packing(agent.model)
    batch = self_token_batch(generate(agent, PROMPTS[:1], n=2, seed=0, max_new_tokens=6), agent.pad_token_id)
    with packed_attention(agent.model), pytest.raises(RuntimeError, match="without a packed layout"):
        agent.model(input_ids=batch.input_ids_B_T)  # a padded pass under the packed implementation
    assert config._attn_implementation == "sdpa"  # restored when the block ends
