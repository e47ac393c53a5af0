"""``train.mask_truncated``: responses cut by the length cap carry no gradient (their loss terms are 0, KL
included), still count in their mini-batch's mean, and are still graded and logged."""

import dataclasses
import json

import pytest
import torch

from workbench.agents.generation.rollout import generate
from workbench.agents.models.loading import load_agent
from workbench.config.experiment import from_dict
from workbench.core.losses import LossParams
from workbench.train.batches import build_learner_batch
from workbench.train.exchange import as_cross_rollout, share
from workbench.train.run import train
from workbench.train.scoring import score_own, set_old_policy
from workbench.train.update import UpdateSettings, update_learner

PROMPTS = ["2+3*4", "4*2-1", "7-5+2"]
SETTINGS = UpdateSettings(loss="hacpo", minibatch_size=6, micro_batch_size=4, kl_coef=0.01, grad_clip=1.0)


@pytest.fixture
def batch_parts(char_agent_dir, bpe_agent):
    """Own and shared rollouts, every other one marked as cut by the cap (masking reads the finish reason)."""
    learner = load_agent(str(char_agent_dir))
    own = generate(learner, PROMPTS, n=2, seed=0, max_new_tokens=4, author=0)
    other = generate(bpe_agent, PROMPTS, n=2, seed=1, max_new_tokens=4, author=1)
    score_own(bpe_agent, other, UpdateSettings())
    cross = [as_cross_rollout(share(r)) for r in other]
    own = [dataclasses.replace(r, finish_reason=("length", "eos")[i % 2]) for i, r in enumerate(own)]
    cross = [dataclasses.replace(r, finish_reason=("eos", "length")[i % 2]) for i, r in enumerate(cross)]
    advantages_P_A_G = torch.linspace(-1, 1, len(PROMPTS) * 4).reshape(len(PROMPTS), 2, 2)
    return char_agent_dir, own, cross, advantages_P_A_G


def _update(learner_dir, own, cross, advantages_P_A_G, mask):
    learner = load_agent(str(learner_dir))
    settings = dataclasses.replace(SETTINGS, mask_truncated=mask)
    batch = build_learner_batch(learner, 0, own, cross, advantages_P_A_G, torch.ones(2), mask_truncated=mask)
    set_old_policy(learner, batch, score_own(learner, own, settings), settings)
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    optimizer = torch.optim.AdamW(learner.trainable_parameters(), lr=1e-2, weight_decay=0.0)
    out = update_learner(learner, optimizer, batch, LossParams(), settings)
    moved = any(not torch.equal(before[k], v) for k, v in learner.model.state_dict().items())
    return batch, out, moved


def test_truncated_rows_have_zero_loss_terms_and_count_in_the_mean(batch_parts):
    learner_dir, own, cross, advantages_P_A_G = batch_parts
    batch, masked, _ = _update(learner_dir, own, cross, advantages_P_A_G, mask=True)
    _, plain, _ = _update(learner_dir, own, cross, advantages_P_A_G, mask=False)
    cut_B = torch.tensor([r.finish_reason == "length" for r in batch.rollouts])
    assert 0 < int(cut_B.sum()) < len(batch), "the fixture needs truncated and finished responses"
    assert batch.advantages_B[cut_B].eq(0).all() and masked.ratio_B[cut_B].isnan().all()  # never forwarded
    first_B = masked.minibatch_B == 0
    kept_B = ~cut_B & first_B & ~masked.term_B.isnan()
    # mini-batch 0 starts from the same weights: the finished rows' terms are those of the plain update ...
    assert torch.equal(masked.term_B[kept_B], plain.term_B[kept_B])
    # ... and the loss is their sum over every row of the mini-batch, the truncated ones adding 0
    assert masked.losses[0] == pytest.approx(masked.term_B[kept_B].double().sum().item() / masked.sizes[0])
    assert masked.sizes == plain.sizes


def test_a_batch_of_truncated_rows_changes_no_weight(batch_parts):
    learner_dir, own, cross, advantages_P_A_G = batch_parts
    cut = [dataclasses.replace(r, finish_reason="length") for r in own]
    cut_cross = [dataclasses.replace(r, finish_reason="length") for r in cross]
    _, _, moved_masked = _update(learner_dir, cut, cut_cross, advantages_P_A_G, mask=True)
    _, _, moved_plain = _update(learner_dir, cut, cut_cross, advantages_P_A_G, mask=False)
    assert not moved_masked and moved_plain  # no policy and no KL gradient at all


def test_a_run_still_grades_and_logs_truncated_responses(tmp_path):
    cfg = from_dict(
        {
            "experiment": "mask",
            "agents": ["tiny:gpt2-char", "tiny:llama-bpe"],
            "train": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "minibatch_prompts": 1,
                      "max_new_tokens": 3, "eval_every": 0, "eval_samples": 0, "mask_truncated": True},
            "task": {"train_size": 8, "eval_size": 2},
            "output": {"root": str(tmp_path)},
        }
    )  # fmt: skip
    run_dir = train(cfg)
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    samples = [
        json.loads(line) for line in (run_dir / "samples" / "step_000001.jsonl").read_text().splitlines()
    ]
    for name in ("gpt2-char", "llama-bpe"):
        own = [s for s in samples if s["author"] == name]
        assert last[f"train/truncated_frac/{name}"] > 0
        for sample in own:
            assert sample["grade"]  # graded whatever its finish
            if sample["finish_reason"] == "length":
                assert all(sample[f"learner/{n}"]["advantage"] == 0 for n in ("gpt2-char", "llama-bpe"))
