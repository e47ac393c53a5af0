"""Sharing across tokenizers: self samples keep their ids, cross samples are re-encoded text (spec §3(c))."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.agents.forward.passes import sequence_logprobs
from workbench.agents.forward.sharing import build_training_batch, reencode_response
from workbench.agents.forward.tokens import TokenBatch, pack
from workbench.agents.generation.rollout import generate
from workbench.core.types import Rollout
from workbench.train.scoring import UpdateSettings, score_own

PROMPTS = ["3+4*2", "7-1", "2*3*4-5", "9"]


def _rollout(text: str, finish: str = "eos", author: int = 1, prompt: str = "1+1") -> Rollout:
    return Rollout(
        prompt_index=0, author=author, index=0, prompt=prompt, text=text, prompt_ids=[5, 6],
        response_ids=[7, 8], finish_reason=finish, old_logp_sum=-3.0, old_logp_count=2,
    )  # fmt: skip


def test_pack_select_and_len():
    batch = pack([([1, 2, 3], [4, 5]), ([1], [9]), ([2, 2], [])], pad_id=0)
    assert len(batch) == 3
    assert batch.input_ids_B_T.tolist() == [[1, 2, 3, 4, 5], [1, 9, 0, 0, 0], [2, 2, 0, 0, 0]]
    assert batch.attention_mask_B_T.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 0, 0, 0]]
    assert batch.response_mask_B_T.tolist() == [[0, 0, 0, 1, 1], [0, 1, 0, 0, 0], [0, 0, 0, 0, 0]]
    sub = batch.select([1, 2])
    assert isinstance(sub, TokenBatch) and sub.input_ids_B_T.tolist() == [[1, 9], [2, 2]]  # padding trimmed
    assert sub.response_mask_B_T.tolist() == [[0, 1], [0, 0]]


@pytest.mark.parametrize(("source", "learner"), [("bpe_agent", "char_agent"), ("char_agent", "bpe_agent")])
def test_cross_samples_round_trip_between_tokenizers(source, learner, request):
    src, dst = request.getfixturevalue(source), request.getfixturevalue(learner)
    rollouts = generate(src, PROMPTS, n=3, seed=0, author=1)
    score_own(src, rollouts, UpdateSettings())
    olds = [(r.old_logp_sum, r.old_logp_count) for r in rollouts]
    batch, counts = build_training_batch(dst, rollouts, learner_index=0)
    assert counts["reencoded"] == len(rollouts) and counts["self"] == 0
    for b, r in enumerate(rollouts):
        n = int(batch.attention_mask_B_T[b].sum())
        ids = batch.input_ids_B_T[b, :n].tolist()
        resp_mask = batch.response_mask_B_T[b, :n].bool().tolist()
        prompt_ids = [t for t, m in zip(ids, resp_mask) if not m]
        response_ids = [t for t, m in zip(ids, resp_mask) if m]
        assert prompt_ids == dst.encode_prompt(r.prompt)  # prompt re-encoded with the learner's format
        if r.finish_reason == "eos":
            assert response_ids[-1] == dst.eos_token_id
            response_ids = response_ids[:-1]
        text = dst.tokenizer.decode(response_ids, skip_special_tokens=False)
        if counts["unknown_chars"] == 0 and not counts["truncated"]:
            assert text == r.text
    # the source's old log-probs travel untouched
    assert [(r.old_logp_sum, r.old_logp_count) for r in rollouts] == olds
    assert all(math.isfinite(s) and c == len(r.response_ids) for (s, c), r in zip(olds, rollouts))


def test_self_samples_keep_their_ids_and_cross_samples_are_marked(char_agent, bpe_agent):
    own = generate(char_agent, PROMPTS, n=2, seed=1, author=0)
    other = generate(bpe_agent, PROMPTS, n=2, seed=1, author=1)
    batch, counts = build_training_batch(char_agent, own + other, learner_index=0)
    assert counts["self"] == len(own) and counts["reencoded"] == len(other)
    for b, r in enumerate(own):
        n = len(r.prompt_ids) + len(r.response_ids)
        assert batch.input_ids_B_T[b, :n].tolist() == r.prompt_ids + r.response_ids
        assert batch.response_mask_B_T[b].sum() == len(r.response_ids)


def test_eos_handling(char_agent):
    eos = char_agent.eos_token_id
    _, finished, _ = reencode_response(char_agent, _rollout("12", "eos"))
    _, capped, _ = reencode_response(char_agent, _rollout("12", "length"))
    _, eos_only, counts = reencode_response(char_agent, _rollout("", "eos"))
    _, nothing, empty_counts = reencode_response(char_agent, _rollout("", "length"))
    expected = char_agent.tokenizer.encode("12", add_special_tokens=False)
    assert finished == [*expected, eos] and capped == expected
    assert eos_only == [eos] and counts["empty"] == 0
    assert nothing == [] and empty_counts["empty"] == 1
    # a special-token string inside the text is plain text for the learner, never its EOS
    _, literal, _ = reencode_response(char_agent, _rollout("a<eos>b", "length"))
    assert eos not in literal and len(literal) == len("a<eos>b")


def test_characters_missing_from_the_learner_vocab_become_unk_and_are_counted(char_agent):
    rollout = _rollout("π≈3.14 → \\boxed{3}", "eos")
    _, response_ids, counts = reencode_response(char_agent, rollout)
    unk = char_agent.tokenizer.unk_token_id
    assert counts["unknown_chars"] == 3 and response_ids.count(unk) == 3
    assert counts["lossy"] == 1
    batch, totals = build_training_batch(char_agent, [rollout], learner_index=0)
    assert totals["unknown_chars"] == 3 and totals["lossy"] == 1 and len(batch) == 1


def test_long_cross_responses_are_truncated_and_counted(char_agent):
    rollout = _rollout("1+" * 200, "eos")
    prompt_ids, response_ids, counts = reencode_response(char_agent, rollout)
    assert counts["truncated"] == 1
    assert len(response_ids) == 2 * char_agent.max_new_tokens
    assert len(prompt_ids) + len(response_ids) <= char_agent.max_positions


def test_cross_ratio_uses_each_sides_own_token_count(char_agent, bpe_agent):
    """s = exp(mean learner logp over learner tokens - mean source logp over source tokens) is finite."""
    other = generate(bpe_agent, PROMPTS, n=2, seed=2, author=1)
    score_own(bpe_agent, other, UpdateSettings())
    batch, _ = build_training_batch(char_agent, other, learner_index=0)
    new_mean_B = sequence_logprobs(char_agent, batch).detach()
    old_mean_B = torch.tensor([r.old_logp_mean for r in other], dtype=new_mean_B.dtype)
    ratio_B = torch.exp(new_mean_B - old_mean_B)
    assert torch.isfinite(ratio_B).all() and (ratio_B > 0).all()
    lengths = batch.response_mask_B_T.sum(-1).tolist()
    assert lengths != [r.length for r in other]  # different tokenizations, different |y|


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40))
def test_ascii_text_round_trips_through_both_tokenizers(text, char_agent, bpe_agent):
    for learner in (char_agent, bpe_agent):
        _, response_ids, counts = reencode_response(learner, _rollout(text, "length"))
        assert learner.tokenizer.decode(response_ids, skip_special_tokens=False) == text
        assert counts["unknown_chars"] == 0 and counts["lossy"] == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=30))
def test_any_unicode_text_never_crashes_and_bpe_is_lossless(text, char_agent, bpe_agent):
    _, ids, counts = reencode_response(char_agent, _rollout(text, "eos"))
    assert ids[-1] == char_agent.eos_token_id and counts["unknown_chars"] >= 0
    _, ids, counts = reencode_response(bpe_agent, _rollout(text, "length"))
    assert bpe_agent.tokenizer.decode(ids, skip_special_tokens=False) == text  # byte-level: nothing unknown
