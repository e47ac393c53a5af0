"""Chunked log-probs (``workbench.agents.forward.logprobs``) equal the direct full-vocabulary computation.

Tolerance: values and gradients agree to 1e-5 (absolute and relative) in fp32; the chunked path runs the same
per-row operations on fewer rows at a time, so only matmul blocking can differ.
"""

import pytest
import torch

from workbench.agents.forward import logprobs
from workbench.agents.forward.logprobs import chunk_tokens, head_parts, selective_logprobs
from workbench.agents.forward.passes import token_logprobs
from workbench.agents.forward.tokens import self_token_batch
from workbench.agents.generation.rollout import generate
from workbench.agents.models.loading import load_agent

TOL = {"atol": 1e-5, "rtol": 1e-5}


def _direct(logits_N_V, targets_N, temperature=1.0, softcap=None):
    logits_N_V = logits_N_V.float()
    if softcap:
        logits_N_V = torch.tanh(logits_N_V / softcap) * softcap
    logits_N_V = logits_N_V / temperature
    return logits_N_V.gather(-1, targets_N[:, None]).squeeze(-1) - logits_N_V.logsumexp(-1)


@pytest.mark.parametrize("chunk", [1, 3, 7, None])
@pytest.mark.parametrize(("temperature", "softcap"), [(1.0, None), (0.7, None), (1.3, 5.0)])
def test_selective_logprobs_equal_the_direct_values_and_gradients(chunk, temperature, softcap):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden_N_H = torch.randn(11, 16, requires_grad=True)
    targets_N = torch.randint(0, 50, (11,))
    weights_N = torch.randn(11)  # a loss that weights each token differently
    chunked = selective_logprobs(
        hidden_N_H, targets_N, head, temperature=temperature, softcap=softcap, chunk=chunk
    )
    grads = torch.autograd.grad((chunked * weights_N).sum(), [hidden_N_H, head.weight])
    direct = _direct(head(hidden_N_H), targets_N, temperature, softcap)
    expected = torch.autograd.grad((direct * weights_N).sum(), [hidden_N_H, head.weight])
    torch.testing.assert_close(chunked, direct, **TOL)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, **TOL)
    with torch.no_grad():  # the scoring pass: the same values without checkpoints
        assert torch.equal(
            selective_logprobs(
                hidden_N_H, targets_N, head, temperature=temperature, softcap=softcap, chunk=chunk
            ),
            chunked.detach(),
        )


def test_a_chunk_holds_a_bounded_number_of_fp32_logit_rows():
    assert chunk_tokens(151_936) == logprobs.LOGITS_CHUNK_BYTES // (4 * 151_936)
    assert chunk_tokens(10**12) == 1


@pytest.mark.parametrize("preset_dir", ["char_agent_dir", "bpe_agent_dir"])
def test_token_logprobs_of_a_lora_agent_equal_the_full_logits_formula(preset_dir, request, monkeypatch):
    directory = request.getfixturevalue(preset_dir)
    agent = load_agent({"model": str(directory), "lora": {"r": 4}, "device": "cpu"})
    assert head_parts(agent.model) is not None  # GPT-2 and Llama take the backbone + head path
    monkeypatch.setattr(logprobs, "LOGITS_CHUNK_BYTES", 4 * agent.model.config.vocab_size * 5)  # 5-row chunks
    batch = self_token_batch(generate(agent, ["1+2=", "3+4-5="], n=3, seed=0, max_new_tokens=10), 0)
    logp_B_T, mask_B_T = token_logprobs(agent, batch, temperature=0.7)
    logits = agent.model(input_ids=batch.input_ids_B_T, attention_mask=batch.attention_mask_B_T).logits
    direct_B_T = _direct(logits[:, :-1].flatten(0, 1), batch.input_ids_B_T[:, 1:].flatten(), 0.7).view_as(
        logp_B_T
    )
    direct_B_T = torch.where(mask_B_T.bool(), direct_B_T, torch.zeros_like(direct_B_T))
    torch.testing.assert_close(logp_B_T, direct_B_T, **TOL)
    params = agent.trainable_parameters()
    for got, want in zip(
        torch.autograd.grad(logp_B_T.sum(), params), torch.autograd.grad(direct_B_T.sum(), params)
    ):
        torch.testing.assert_close(got, want, **TOL)


def test_a_model_whose_logits_are_not_a_plain_head_uses_its_own_logits(bpe_agent, monkeypatch):
    batch = self_token_batch(generate(bpe_agent, ["1+2="], n=2, seed=1, max_new_tokens=8), 0)
    plain, _ = token_logprobs(bpe_agent, batch)
    monkeypatch.setattr(logprobs, "PLAIN_HEADS", frozenset())
    assert head_parts(bpe_agent.model) is None
    own, _ = token_logprobs(bpe_agent, batch)
    torch.testing.assert_close(own, plain, **TOL)


class _Head(torch.nn.Module):
    """A bare LM head for peft to wrap."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = torch.nn.Linear(16, 50, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_a_lora_head_gets_the_direct_gradients_also_with_active_dropout(dropout):
    """The LoRA matrices are the head's trainable parameters: their gradients (and the hidden states') come
    out of the hand-written backward pass; with active dropout the checkpoint replays the forward's mask
    (a recomputation without the replay would draw another mask and differ)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["lm_head"], lora_dropout=dropout, init_lora_weights=False
    )
    head = get_peft_model(_Head(), config).base_model.model.lm_head
    head.train()
    assert logprobs._has_active_dropout(head) == (dropout > 0)
    hidden_N_H = torch.randn(11, 16, requires_grad=True)
    targets_N = torch.randint(0, 50, (11,))
    inputs = [hidden_N_H, *(p for p in head.parameters() if p.requires_grad)]
    assert len(inputs) == 3  # lora_A and lora_B; the base weight is frozen
    torch.manual_seed(1)
    chunked = selective_logprobs(hidden_N_H, targets_N, head, temperature=0.7)
    grads = torch.autograd.grad(chunked.square().sum(), inputs)
    torch.manual_seed(1)
    direct = _direct(head(hidden_N_H), targets_N, 0.7)
    expected = torch.autograd.grad(direct.square().sum(), inputs)
    torch.testing.assert_close(chunked, direct, **TOL)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, **TOL)


def test_a_tied_head_sums_the_gradients_of_its_two_uses():
    """GPT-2 ties the LM head to the token embedding: the weight's gradient is that of both uses."""
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(50, 16)
    head = torch.nn.Linear(16, 50, bias=False)
    head.weight = embedding.weight
    ids_N = torch.randint(0, 50, (9,))
    targets_N = torch.randint(0, 50, (9,))
    chunked = selective_logprobs(torch.tanh(embedding(ids_N)), targets_N, head, chunk=4)
    (got,) = torch.autograd.grad(chunked.sum(), [embedding.weight])
    direct = _direct(head(torch.tanh(embedding(ids_N))), targets_N)
    (want,) = torch.autograd.grad(direct.sum(), [embedding.weight])
    torch.testing.assert_close(got, want, **TOL)
