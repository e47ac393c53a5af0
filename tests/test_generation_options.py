"""Per-agent generation options: top-k, min-p, repetition penalty (transformers' processor), stop strings cut
where the graded text and the trained ids agree; the compiled loop still samples what the eager one does."""

import weakref

import pytest
import torch

from workbench.agents.forward.sharing import reencode_response
from workbench.agents.generation import decode
from workbench.agents.generation.decode import penalize, seen_tokens
from workbench.agents.generation.rollout import generate
from workbench.agents.generation.sampling import pick_B
from workbench.agents.models.loading import load_agent
from workbench.train.exchange import as_cross_rollout, share

PROMPTS = ["4+8+5+9", "3*4-2", "7-2+1", "9+9-8+1"]


def _draws(logits_V, n=400, **options):
    generator = torch.Generator().manual_seed(0)
    logits_B_V = logits_V.expand(n, -1)
    return pick_B(logits_B_V, 1.0, 1.0, generator, **options)


def test_top_k_and_min_p_sample_only_what_they_keep():
    logits_V = torch.randn(50, generator=torch.Generator().manual_seed(1))
    top5 = set(logits_V.topk(5).indices.tolist())
    assert set(_draws(logits_V, top_k=5).tolist()) <= top5
    assert set(_draws(logits_V, top_k=1).tolist()) == {int(logits_V.argmax())}
    probs_V = torch.softmax(logits_V, -1)
    allowed = set((probs_V >= 0.3 * probs_V.max()).nonzero().flatten().tolist())
    drawn = set(_draws(logits_V, min_p=0.3).tolist())
    assert drawn <= allowed and len(drawn) > 1
    # off (0): the very draws of the plain call
    assert torch.equal(_draws(logits_V, top_k=0, min_p=0.0), _draws(logits_V))
    assert len(set(_draws(logits_V).tolist()) - top5) > 0


def test_the_repetition_penalty_is_transformers_processor():
    from transformers import RepetitionPenaltyLogitsProcessor

    logits_B_V = torch.randn(3, 20, generator=torch.Generator().manual_seed(2))
    ids = [[1, 4, 4, 7], [0, 19], [5]]
    seen_B_V = seen_tokens(ids, 20, torch.device("cpu"))
    expected = torch.cat(
        [
            RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([row]), logits_B_V[b : b + 1].clone())
            for b, row in enumerate(ids)
        ]
    )
    assert torch.allclose(penalize(logits_B_V, seen_B_V, 1.3), expected)


def _agent(model_dir, **options):
    return load_agent({"model": str(model_dir), "device": "cpu", **options})


@pytest.mark.parametrize("preset_dir", ["char_agent_dir", "bpe_agent_dir"])
def test_stop_strings_cut_text_and_ids_at_the_same_place(preset_dir, request):
    model_dir = request.getfixturevalue(preset_dir)
    free = generate(_agent(model_dir), PROMPTS, n=2, seed=3, max_new_tokens=24)
    stop = ", "
    assert any(stop in r.text for r in free), "the agent's answers should hold the stop string"
    agent = _agent(model_dir, stop_strings=[stop, "\n\n"])
    rollouts = generate(agent, PROMPTS, n=2, seed=3, max_new_tokens=24)
    stopped = [r for r in rollouts if r.finish_reason == "stop"]
    assert stopped
    for r in rollouts:
        assert stop not in r.text  # graded text ends before the string
        assert agent.tokenizer.decode(r.response_ids, skip_special_tokens=True) == r.text  # trained ids alike
    for r in stopped:
        assert r.response_ids[-1:] != [agent.eos_token_id] and len(r.response_ids) <= 24
    # alone in its batch (no other row's stop shifts the draws), a response is the free one cut at the string
    for prompt in PROMPTS:
        (alone,) = generate(agent, [prompt], n=1, seed=4, max_new_tokens=24)
        (unstopped,) = generate(_agent(model_dir), [prompt], n=1, seed=4, max_new_tokens=24)
        assert unstopped.text.startswith(alone.text)
        assert (alone.finish_reason == "stop") == (stop in unstopped.text or "\n\n" in unstopped.text)
    # shared with another learner: no EOS is added to a stopped response
    learner = _agent(request.getfixturevalue("bpe_agent_dir"))
    _, response_ids, _ = reencode_response(learner, as_cross_rollout(share(stopped[0])))
    assert learner.eos_token_id not in response_ids[-1:]


def test_the_compiled_loop_samples_what_the_eager_loop_does_with_every_option(char_agent_dir, monkeypatch):
    agent = _agent(char_agent_dir, top_k=8, min_p=0.05, repetition_penalty=1.2, stop_strings=[", "])
    monkeypatch.setattr(decode, "_COMPILED", weakref.WeakKeyDictionary())
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)  # the static loop, run eagerly
    for kwargs in ({"temperature": 0.0}, {"temperature": 1.0, "top_p": 0.9, "seed": 5}):
        eager = generate(agent, PROMPTS, n=3, max_new_tokens=20, **kwargs)
        static = generate(agent, PROMPTS, n=3, max_new_tokens=20, compile_decode=True, **kwargs)
        assert [r.response_ids for r in static] == [r.response_ids for r in eager]
        assert [r.finish_reason for r in static] == [r.finish_reason for r in eager]


def test_the_repetition_penalty_changes_greedy_decoding(char_agent_dir):
    plain = generate(_agent(char_agent_dir), PROMPTS, n=1, temperature=0.0, max_new_tokens=20)
    penalized = generate(
        _agent(char_agent_dir, repetition_penalty=3.0), PROMPTS, n=1, temperature=0.0, max_new_tokens=20
    )
    assert [r.text for r in plain] != [r.text for r in penalized]
    again = generate(
        _agent(char_agent_dir, repetition_penalty=1.0), PROMPTS, n=1, temperature=0.0, max_new_tokens=20
    )
    assert [r.response_ids for r in again] == [r.response_ids for r in plain]  # 1 = off, bit for bit
