"""A learner's update and its worker: micro-batch plan, the one no-grad pass, devices, engine interface."""

import dataclasses
import math

import pytest
import torch

from workbench.agents.generation.rollout import generate
from workbench.agents.models.loading import load_agent
from workbench.config.agent_spec import AgentSpec
from workbench.core import losses
from workbench.core.losses import LossParams, PolicyBatch
from workbench.core.types import Rollout
from workbench.train import batches as batches_module
from workbench.train import probe as probe_module
from workbench.train import scoring as scoring_module
from workbench.train import update as update_module
from workbench.train.batches import build_learner_batch, plan_micro_batches
from workbench.train.exchange import RolloutRequest, UpdateRequest, as_cross_rollout, share
from workbench.train.metrics import learner_metrics
from workbench.train.scoring import score_own, set_old_policy
from workbench.train.settings import WorkerSettings
from workbench.train.update import UpdateSettings, update_learner
from workbench.train.worker import AgentWorker

PROMPTS = ["2+3", "4*2", "7-5"]
SETTINGS = UpdateSettings(
    loss="hacpo", minibatch_size=6, micro_batch_size=4, temperature=1.0, kl_coef=0.001, grad_clip=1.0
)


def _worker_settings(**update):
    return WorkerSettings(
        update=dataclasses.replace(SETTINGS, **update),
        loss=LossParams(),
        lr=1e-3,
        weight_decay=0.0,
        top_p=1.0,
        max_new_tokens=8,
    )


def _micro(plan):
    return [mb.micro_batches for mb in plan]


def test_micro_batch_plan_cuts_mini_batches_by_rows_and_tokens():
    assert _micro(plan_micro_batches(range(12), 2, 4)) == [[[0, 1, 2, 3], [4, 5]], [[6, 7, 8, 9], [10, 11]]]
    lengths = [3, 5, 2, 9, 1, 1, 1, 4]
    cut = plan_micro_batches(range(8), 2, 3, micro_batch_tokens=8, length_B=lengths)
    assert _micro(cut) == [[[0, 1], [2], [3]], [[4, 5, 6], [7]]]  # 9 tokens go alone; 3 rows at most
    for n, mb, micro, budget in [(12, 4, 3, None), (6, 3, 2, 7), (7, 7, 8, 1), (48, 8, 128, 40)]:
        length_B = [1 + (5 * r) % 11 for r in range(n)]
        plan = plan_micro_batches(range(n), n // mb, micro, micro_batch_tokens=budget, length_B=length_B)
        rows = [r for micros in _micro(plan) for rows in micros for r in rows]
        assert rows == list(range(n))  # every row once, in order
        assert [m.size for m in plan] == [mb] * (n // mb)  # mini-batches of mb rows
        assert all(len(r) <= micro for micros in _micro(plan) for r in micros)
        assert all(
            len(r) == 1 or sum(length_B[i] for i in r) <= budget
            for micros in _micro(plan)
            for r in micros
            if budget is not None
        )


def test_rows_not_forwarded_still_count_in_their_mini_batch():
    forward = [True, False, True, True, False, False]
    plan = plan_micro_batches(range(6), 2, 2, forward_B=forward)
    assert _micro(plan) == [[[0, 2]], [[3]]] and [m.size for m in plan] == [3, 3]
    assert _micro(plan_micro_batches(range(2), 1, 2, forward_B=[False, False])) == [[]]


@pytest.fixture
def pair(char_agent_dir, bpe_agent):
    """A char learner (own copy: it trains) with its own scored rollouts and the BPE agent's as text."""
    learner = load_agent(str(char_agent_dir))
    own = generate(learner, PROMPTS, n=2, seed=0, max_new_tokens=8, author=0)
    other = generate(bpe_agent, PROMPTS, n=2, seed=1, max_new_tokens=8, author=1)
    score_own(bpe_agent, other, UpdateSettings())
    cross = [as_cross_rollout(share(r)) for r in other]
    advantages_P_A_G = torch.linspace(-1, 1, len(PROMPTS) * 2 * 2).reshape(len(PROMPTS), 2, 2)
    return learner, own, cross, advantages_P_A_G


def _batch(learner, own, cross, advantages_P_A_G, coef_A, scores=None, settings=SETTINGS, **kwargs):
    """The learner's batch with every row's old policy (`build_learner_batch`, then `set_old_policy`)."""
    batch = build_learner_batch(learner, 0, own, cross, advantages_P_A_G, coef_A, **kwargs)
    scores = score_own(learner, own, settings) if scores is None else scores
    set_old_policy(learner, batch, scores, settings)
    return batch


def test_one_no_grad_pass_over_own_rows_only_and_self_ratio_exactly_one(pair, monkeypatch):
    learner, own, cross, advantages_P_A_G = pair
    seen = {"no_grad_rows": 0, "grad_rows": 0}
    real = update_module.token_logprobs

    def counting(agent, view, *, temperature=1.0):
        seen["grad_rows" if torch.is_grad_enabled() else "no_grad_rows"] += len(view)
        return real(agent, view, temperature=temperature)

    for module in (update_module, scoring_module, probe_module):
        monkeypatch.setattr(module, "token_logprobs", counting)
    scores = score_own(learner, own, SETTINGS)
    assert seen == {"no_grad_rows": len(own), "grad_rows": 0}  # the learner's no-grad pass: own rows once
    batch = _batch(learner, own, cross, advantages_P_A_G, torch.tensor([1.0, 2.0]), scores)
    optimizer = torch.optim.AdamW(learner.trainable_parameters(), lr=1e-3)
    seen["no_grad_rows"] = 0
    out = update_learner(learner, optimizer, batch, LossParams(), SETTINGS)
    # every own row trained once; the shared rows probed once without gradient (clipped ones need no
    # backward pass), the others trained once
    clipped = int((out.clipped_B[len(own) :] == 1).sum())
    assert seen == {"no_grad_rows": len(cross), "grad_rows": len(own) + len(cross) - clipped}
    # its sums are what it shares: its log-likelihood of each own response, whatever the micro-batches
    reference = [dataclasses.replace(r) for r in own]
    score_own(
        load_agent(str(learner.source)), reference, UpdateSettings(minibatch_size=1, micro_batch_size=1)
    )
    assert scores.sums == pytest.approx([r.old_logp_sum for r in reference], abs=1e-4)
    assert scores.counts == [r.old_logp_count for r in reference] == [r.length for r in own]
    assert [r.old_logp_sum for r in own] == scores.sums
    # on-policy self samples of the first mini-batch: s = 1 bit-exactly (scored in the same micro-batches)
    assert torch.equal(out.ratio_B[: SETTINGS.minibatch_size], torch.ones(SETTINGS.minibatch_size))
    assert out.n_updates == 2 and len(out.kls) == 2  # KL on the two self micro-batches only


class _ReachedError(Exception):
    """Raised by a spy once it has checked what it was given."""


def _tensors(obj) -> dict[str, torch.Tensor]:
    return {
        f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if torch.is_tensor(getattr(obj, f.name))
    }


@pytest.mark.parametrize("rows", ["self", "cross"])
def test_every_tensor_a_loss_receives_sits_on_the_learner_device(pair, monkeypatch, rows):
    """The batch is built on CPU while the learner "sits" on the meta device.

    Torch refuses to mix meta and CPU tensors in one op just as it refuses CUDA and CPU (0-dim CPU scalars
    aside), so a batch tensor that is not moved to the learner's device fails here as on a GPU, where the
    first HACPO step once failed at a ``torch.where`` mixing CPU flags with CUDA log-probs. Meta tensors hold
    no values, so each case stops at its spy: the loss (cross rows) or the KL (self rows).
    """
    learner, own, cross, advantages_P_A_G = pair
    if rows == "cross":
        own = []
    batch = _batch(learner, own, cross, advantages_P_A_G, torch.tensor([1.0, 2.0]))
    meta = torch.device("meta")
    # what score_self leaves on a GPU: the learner's old and reference token log-probs on its device
    batch.old_logp_T = [None if t is None else t.to(meta) for t in batch.old_logp_T]
    batch.ref_logp_T = [None if t is None else t.to(meta) for t in batch.ref_logp_T]
    learner.device = meta

    def meta_logprobs(agent, view, *, temperature=1.0):
        assert agent.device == meta
        B, T = view.input_ids_B_T.shape
        logp_B_T = torch.zeros(B, T - 1, device=meta, requires_grad=True)
        return logp_B_T, view.response_mask_B_T[:, 1:].to(meta)

    received: list[dict[str, torch.device]] = []

    def spy_loss(policy_batch: PolicyBatch, params: LossParams):
        received.append({k: v.device for k, v in _tensors(policy_batch).items()})
        if rows == "cross":
            raise _ReachedError
        return losses.hacpo_policy_loss(policy_batch, params)

    def spy_kl(logp_B_T, ref_logp_B_T, mask_B_T, clamp=10.0):
        received.append({"kl": ref_logp_B_T.device, "logp": logp_B_T.device, "mask": mask_B_T.device})
        raise _ReachedError

    monkeypatch.setattr(update_module, "token_logprobs", meta_logprobs)
    monkeypatch.setattr(probe_module, "token_logprobs", meta_logprobs)
    monkeypatch.setitem(losses.POLICY_LOSSES, "hacpo", spy_loss)
    monkeypatch.setattr(update_module, "low_var_kl", spy_kl)
    optimizer = torch.optim.AdamW(learner.trainable_parameters(), lr=1e-3)
    with pytest.raises(_ReachedError):
        update_learner(learner, optimizer, batch, LossParams(), SETTINGS)
    assert received and all(device == meta for seen in received for device in seen.values()), received
    assert {"old_logp_mean_B", "advantages_B", "is_self_B", "cross_coef_B", "logp_B_T"} <= set(received[0])


class ScriptedEngine:
    """A stand-in for an external engine: answers every prompt with fixed texts in the agent's tokens."""

    def __init__(self, agent):
        self.agent, self.synced = agent, 0

    def generate(self, prompts, n, *, temperature, top_p, max_new_tokens, author, seed):
        out = []
        for p, prompt in enumerate(prompts):
            prompt_ids = self.agent.encode_prompt(prompt)
            for g in range(n):
                text = str(p + g)
                body = self.agent.tokenizer.encode(text, add_special_tokens=False)
                out.append(
                    Rollout(p, author, g, prompt, text, prompt_ids, [*body, self.agent.eos_token_id], "eos")
                )
        return out

    def sync(self):
        self.synced += 1


def test_an_engine_plugs_into_the_worker_and_its_samples_are_rescored_by_the_model(char_agent_dir):
    worker = AgentWorker(
        AgentSpec(str(char_agent_dir), name="char"), 0, ["char"], _worker_settings(), engine=ScriptedEngine
    )
    report = worker.rollout(RolloutRequest(PROMPTS, 2, seed=0))
    assert [r.text for r in report.rollouts] == ["0", "1", "1", "2", "2", "3"]
    # old log-likelihoods come from the trained model, never from the engine
    direct = [dataclasses.replace(r) for r in worker._own]
    score_own(load_agent(str(char_agent_dir)), direct, UpdateSettings())
    assert [r.old_logp_sum for r in report.rollouts] == pytest.approx(
        [r.old_logp_sum for r in direct], abs=1e-4
    )
    advantages_P_A_G = torch.linspace(-1, 1, len(PROMPTS) * 2).reshape(len(PROMPTS), 1, 2)
    request = UpdateRequest([], advantages_P_A_G, torch.ones(1), where="test")
    result = worker.update(request)
    assert worker.engine.synced == 1 and result.metrics["is/char/char/ratio_mean"] == pytest.approx(
        1.0, abs=1e-3
    )
    with pytest.raises(RuntimeError, match="update before rollout"):
        worker.update(request)


def test_an_engine_that_breaks_the_contract_is_named(char_agent_dir):
    class WrongPrompt(ScriptedEngine):
        def generate(self, *args, **kwargs):
            rollouts = super().generate(*args, **kwargs)
            rollouts[3].prompt_ids = rollouts[3].prompt_ids[1:]
            return rollouts

    worker = AgentWorker(
        AgentSpec(str(char_agent_dir), name="char"), 0, ["char"], _worker_settings(), engine=WrongPrompt
    )
    with pytest.raises(ValueError, match="rollout 3: prompt or prompt_ids"):
        worker.rollout(RolloutRequest(PROMPTS, 2, seed=0))


class OffsetEngine(ScriptedEngine):
    """Reports sampler log-probs that sit a known distance below the trainer's: 0.1 nats a token on a
    prompt's first answer, 0.3 on its second."""

    def generate(self, *args, **kwargs):
        rollouts = super().generate(*args, **kwargs)
        scored = [dataclasses.replace(r) for r in rollouts]
        scores = score_own(
            self.agent, scored, dataclasses.replace(SETTINGS, temperature=kwargs["temperature"])
        )
        for i, row in enumerate(scores.rows):
            r = rollouts[row]
            trainer_T = scores.logp_T[i][-len(r.response_ids) :]
            r.sampler_logp_T = (trainer_T - (0.1, 0.3)[r.index]).tolist()
        return rollouts


def _offset_worker(char_agent_dir, cap):
    settings = dataclasses.replace(_worker_settings(), engine_is_cap=cap)
    worker = AgentWorker(
        AgentSpec(str(char_agent_dir), name="char"), 0, ["char"], settings, engine=OffsetEngine
    )
    worker.rollout(RolloutRequest(PROMPTS, 2, seed=0))
    advantages_P_A_G = torch.linspace(-1, 1, len(PROMPTS) * 2).reshape(len(PROMPTS), 1, 2)
    return worker.update(UpdateRequest([], advantages_P_A_G, torch.ones(1), where="test"))


def test_the_sampler_trainer_gap_is_logged_and_the_truncated_correction_weights_own_rows(char_agent_dir):
    plain = _offset_worker(char_agent_dir, cap=None)
    assert plain.metrics["engine/char/logp_gap_max"] == pytest.approx(0.3, abs=1e-5)
    tokens_G = [len(str(p + g)) + 1 for p in range(len(PROMPTS)) for g in range(2)]  # the text and EOS
    expected = sum(n * (0.1, 0.3)[i % 2] for i, n in enumerate(tokens_G)) / sum(tokens_G)
    assert plain.metrics["engine/char/logp_gap_mean"] == pytest.approx(expected, abs=1e-5)
    assert "engine/char/is_weight_mean" not in plain.metrics  # off by default
    # cap 1.2: rows 0.1 nats a token apart weigh e^0.1, those 0.3 apart e^0.3 > 1.2, so 1.2
    capped = _offset_worker(char_agent_dir, cap=1.2)
    assert capped.metrics["engine/char/is_truncated_frac"] == pytest.approx(0.5)
    assert capped.metrics["engine/char/is_weight_mean"] == pytest.approx((math.exp(0.1) + 1.2) / 2, abs=1e-4)
    for rid, row in plain.samples.items():
        weight = (math.exp(0.1), 1.2)[rid.index]
        assert capped.samples[rid]["advantage"] == pytest.approx(row["advantage"] * weight, abs=1e-5)


def test_sampler_log_ratios_need_one_sampler_value_per_response_token(char_agent):
    rollouts = generate(char_agent, PROMPTS[:1], n=2, seed=0, max_new_tokens=4, author=0)
    scores = score_own(char_agent, rollouts, SETTINGS)
    assert scoring_module.sampler_log_ratios(rollouts, scores) is None  # the built-in loop reports none
    for r in rollouts:
        r.sampler_logp_T = [0.0] * len(r.response_ids)
    gaps = scoring_module.sampler_log_ratios(rollouts, scores)
    assert [g.numel() for g in gaps] == [len(r.response_ids) for r in rollouts]
    rollouts[1].sampler_logp_T = rollouts[1].sampler_logp_T[1:]
    with pytest.raises(ValueError, match=r"rollout 0/0/1: \d+ sampler log-probs for"):
        scoring_module.sampler_log_ratios(rollouts, scores)


def test_plan_spreads_kept_rows_over_the_full_batch_update_count():
    kept = [0, 1, 2, 3, 6, 7, 8, 9, 10, 11]  # rows 4, 5 left out
    assert _micro(plan_micro_batches(kept, 2, 4)) == [[[0, 1, 2, 3], [6]], [[7, 8, 9, 10], [11]]]
    assert plan_micro_batches([], 3, 4) == []
    assert _micro(plan_micro_batches([0, 1], 3, 4)) == [[[0]], [[1]]]  # never an empty mini-batch


def _update(learner, own, cross, advantages_P_A_G, settings, **batch_kwargs):
    batch = _batch(
        learner,
        own,
        cross,
        advantages_P_A_G,
        torch.tensor([1.0, 2.0]),
        settings=settings,
        skip_uniform_groups=settings.skip_uniform_groups,
        **batch_kwargs,
    )
    optimizer = torch.optim.AdamW(learner.trainable_parameters(), lr=1e-3)
    return batch, update_learner(learner, optimizer, batch, LossParams(), settings)


def test_skip_uniform_groups_leaves_out_zero_advantage_prompts_and_keeps_the_update_count(pair):
    learner, own, cross, advantages_P_A_G = pair
    skipping = dataclasses.replace(SETTINGS, skip_uniform_groups=True)
    uniform = advantages_P_A_G.clone()
    uniform[1] = 0.0  # prompt 1: every sample of every author has advantage 0
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    batch, out = _update(learner, own, cross, uniform, skipping)
    left_out = torch.tensor([r.prompt_index == 1 for r in batch.rollouts])
    assert out.ratio_B[left_out].isnan().all() and not out.ratio_B[~left_out].isnan().any()
    assert batch.keep_B.tolist() == (~left_out).tolist() and out.n_updates == 2  # as without skipping
    metrics = learner_metrics("char", ["char", "bpe"], batch, out, skipping=True)
    assert metrics["adv/char/kept_frac"] == pytest.approx(int((~left_out).sum()) / len(batch))
    assert metrics["cost/char/trained_responses"] == int((~left_out).sum())
    assert any(not torch.equal(before[k], v) for k, v in learner.model.state_dict().items())


def test_skip_uniform_groups_with_nothing_to_skip_is_the_plain_update_bit_for_bit(pair, char_agent_dir):
    learner, own, cross, advantages_P_A_G = pair
    twin = load_agent(str(char_agent_dir))
    _, plain = _update(learner, own, cross, advantages_P_A_G, SETTINGS)
    _, skipping = _update(
        twin, own, cross, advantages_P_A_G, dataclasses.replace(SETTINGS, skip_uniform_groups=True)
    )
    assert plain.losses == skipping.losses and torch.equal(plain.ratio_B, skipping.ratio_B)
    for (name, a), b in zip(learner.model.state_dict().items(), twin.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_bytes_normalization_puts_both_log_likelihoods_of_a_shared_text_per_byte(pair):
    learner, own, cross, advantages_P_A_G = pair
    scores = score_own(learner, own, SETTINGS)
    by_tokens = _batch(learner, own, cross, advantages_P_A_G, torch.ones(2), scores)
    by_bytes = _batch(
        learner, own, cross, advantages_P_A_G, torch.ones(2), scores, ratio_normalization="bytes"
    )
    n_own = len(own)
    assert (by_bytes.length_B[:n_own] == 0).all() and (by_tokens.length_B == 0).all()
    for b, r in enumerate(cross, start=n_own):
        n_bytes = max(1, len(r.text.encode("utf-8")))
        assert by_bytes.length_B[b] == n_bytes
        assert by_bytes.old_logp_mean_B[b].item() == pytest.approx(r.old_logp_sum / n_bytes)
        assert by_tokens.old_logp_mean_B[b].item() == pytest.approx(r.old_logp_mean)
    assert torch.equal(by_bytes.old_logp_mean_B[:n_own], by_tokens.old_logp_mean_B[:n_own])
    _, out = _update(learner, own, cross, advantages_P_A_G, SETTINGS, ratio_normalization="bytes")
    assert torch.isfinite(out.ratio_B).all()
    with pytest.raises(ValueError, match="ratio_normalization = 'chars' is not allowed"):
        build_learner_batch(
            learner, 0, own, cross, advantages_P_A_G, torch.ones(2), ratio_normalization="chars"
        )


def test_symmetric_naive_gives_shared_answers_gradient_whatever_the_sign_of_their_advantage(pair):
    """The shared rows' old policy is the learner's own at the start of the step, scored in the update's
    micro-batches: in mini-batch 0 their ratio is 1 exactly, and GSPO's clip keeps right (A > 0) and wrong
    (A < 0) partner answers alike. Against the source's old log-probs (plain Naive) it is not 1."""
    learner, own, cross, advantages_P_A_G = pair
    settings = UpdateSettings(loss="gspo", minibatch_size=12, micro_batch_size=4, cross_old_from_learner=True)
    source_old_B = _batch(
        learner, own, cross, advantages_P_A_G, torch.ones(2), settings=SETTINGS
    ).old_logp_mean_B
    batch = _batch(learner, own, cross, advantages_P_A_G, torch.ones(2), settings=settings)
    is_cross_B = ~batch.is_self_B
    assert not torch.equal(batch.old_logp_mean_B[is_cross_B], source_old_B[is_cross_B])
    signs = batch.advantages_B[is_cross_B].sign()
    assert (signs > 0).any() and (signs < 0).any()  # the fixture's advantages run from -1 to 1
    rows = [r for mb in batch.plan(12, 12) for r in mb.micro_batches[0]]  # one micro-batch, mini-batch 0
    view = batch.tokens.select(rows)
    logp_B_T, mask_B_T = update_module.token_logprobs(learner, view, temperature=1.0)
    inputs = scoring_module.policy_batch(batch, rows, view, logp_B_T, mask_B_T, 0)
    loss, stats = losses.gspo_policy_loss(inputs, LossParams())
    assert torch.equal(stats.ratio_B, torch.ones(len(rows))) and not stats.clipped_B.any()
    grad_B_T = torch.autograd.grad(loss, logp_B_T)[0]
    advantages_B = batch.advantages_B[rows]
    assert all((grad_B_T[b].abs().sum() > 0) == (advantages_B[b] != 0) for b in range(len(rows)))
    assert rows == list(range(12)) and is_cross_B.sum() == 6  # the shared rows of both signs among them


def test_gspo_clip_keeps_a_low_ratio_only_for_a_positive_advantage():
    """Why plain Naive learns only from the partner's successes: a shared sample's ratio against its source is
    usually below 1 − ε_l, where GSPO's min keeps s·A for A > 0 and the constant clipped value for A < 0."""
    logp_B_T = torch.full((2, 3), -2.0, requires_grad=True)
    batch = PolicyBatch(
        logp_B_T=logp_B_T,
        mask_B_T=torch.ones(2, 3),
        old_logp_mean_B=torch.tensor([-1.0, -1.0]),  # s = e^-1 for both
        advantages_B=torch.tensor([1.0, -1.0]),
        is_self_B=torch.tensor([False, False]),
        cross_coef_B=torch.ones(2),
    )
    loss, stats = losses.gspo_policy_loss(batch, LossParams())
    grad_B_T = torch.autograd.grad(loss, logp_B_T)[0]
    assert stats.clipped_B.tolist() == [0.0, 1.0]
    assert grad_B_T[0].abs().sum() > 0 and grad_B_T[1].abs().sum() == 0


def _weights_after(learner_dir, own, cross, advantages_P_A_G, settings, forwarded=None):
    """A fresh learner's weights, losses and gradient norms after `update_learner` on the pair's batch.

    SGD with momentum: a step on zero gradients still moves the weights (as AdamW's does), and the update is
    linear in the gradients, so float rounding stays at its size (AdamW's normalization turns the rounding of
    a gradient entry that is 0 in exact arithmetic into a step of the learning rate)."""
    learner = load_agent(str(learner_dir))
    batch = _batch(learner, own, cross, advantages_P_A_G, torch.tensor([1.0, 2.0]), settings=settings)
    optimizer = torch.optim.SGD(learner.trainable_parameters(), lr=0.1, momentum=0.9)
    out = update_learner(learner, optimizer, batch, LossParams(), settings)
    if forwarded is not None:
        forwarded.extend(int(r) for r in (~out.ratio_B.isnan()).nonzero().flatten())
    return {k: v.clone() for k, v in learner.model.state_dict().items()}, out


def _assert_same_update(a, b):
    (weights_a, out_a), (weights_b, out_b) = a, b
    assert out_a.n_updates == out_b.n_updates
    assert out_a.losses == pytest.approx(out_b.losses, rel=1e-4, abs=1e-7)
    assert out_a.grad_norms == pytest.approx(out_b.grad_norms, rel=1e-4, abs=1e-7)
    for name, value in weights_a.items():
        torch.testing.assert_close(value, weights_b[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("kl_coef", [0.0, 0.01])
def test_rows_of_advantage_zero_are_not_forwarded_and_change_nothing(
    pair, char_agent_dir, monkeypatch, kl_coef
):
    """The same update as forwarding every row: the loss still divides by every row of the mini-batch, and a
    mini-batch with nothing to forward still takes its optimizer step (on zero gradients). With a KL term the
    learner's own rows are forwarded whatever their advantage. Tolerance: weights 1e-5 relative."""
    _, own, cross, advantages_P_A_G = pair
    zeros = advantages_P_A_G.clone()
    zeros[0] = 0.0  # prompt 0: rows 0, 1 (own) and 6, 7 (shared)
    zeros[:, 1] = 0.0  # every shared row: mini-batch 1 has nothing to forward
    settings = dataclasses.replace(SETTINGS, kl_coef=kl_coef)
    forwarded: list[int] = []
    skipping = _weights_after(char_agent_dir, own, cross, zeros, settings, forwarded)
    real = batches_module.plan_micro_batches
    monkeypatch.setattr(
        batches_module, "plan_micro_batches", lambda *a, **k: real(*a, **{**k, "forward_B": None})
    )
    everything = _weights_after(char_agent_dir, own, cross, zeros, settings)
    _assert_same_update(skipping, everything)
    assert forwarded == ([0, 1, 2, 3, 4, 5] if kl_coef else [2, 3, 4, 5])
    assert skipping[1].grad_norms[1] == 0.0 and everything[1].grad_norms[1] == pytest.approx(0.0, abs=1e-12)


def test_the_update_does_not_depend_on_the_micro_batches(pair, char_agent_dir):
    """One forward of own and shared rows together, or micro-batches cut by rows or by tokens: one update
    (tolerance: weights 1e-5 relative; the KL term included)."""
    _, own, cross, advantages_P_A_G = pair
    settings = dataclasses.replace(SETTINGS, micro_batch_size=12)
    whole = _weights_after(char_agent_dir, own, cross, advantages_P_A_G, settings)
    for micro in ({"micro_batch_size": 1}, {"micro_batch_size": 4}, {"micro_batch_tokens": 40}):
        settings = dataclasses.replace(SETTINGS, **({"micro_batch_size": 12} | micro))
        _assert_same_update(_weights_after(char_agent_dir, own, cross, advantages_P_A_G, settings), whole)


def test_clipped_shared_rows_get_no_backward_pass_and_change_nothing(pair, char_agent_dir, monkeypatch):
    """A no-grad pass finds the shared rows whose ratio lies outside its bounds (their loss term is constant)
    and only the others are trained: the same update, losses and statistics as training every row
    (tolerance: weights 1e-5 relative, ratios 1e-5)."""
    _, own, cross, advantages_P_A_G = pair
    trained: list[int] = []
    real = update_module.policy_batch  # called once per trained micro-batch, with its rows

    def recording(batch, rows, *args):
        if torch.is_grad_enabled():
            trained.extend(rows)
        return real(batch, rows, *args)

    monkeypatch.setattr(update_module, "policy_batch", recording)
    probing = _weights_after(char_agent_dir, own, cross, advantages_P_A_G, SETTINGS)
    clipped_B = probing[1].clipped_B == 1
    assert clipped_B[len(own) :].any() and not clipped_B[: len(own)].any()  # some shared rows are clipped
    assert sorted(trained) == [r for r in range(len(own) + len(cross)) if not clipped_B[r] or r < len(own)]
    monkeypatch.setattr(probe_module.ClippedRowProbe, "pays", lambda self: False)
    everything = _weights_after(char_agent_dir, own, cross, advantages_P_A_G, SETTINGS)
    _assert_same_update(probing, everything)
    for name in ("ratio_B", "lower_B", "upper_B", "clipped_B", "minibatch_B"):
        torch.testing.assert_close(getattr(probing[1], name), getattr(everything[1], name), atol=1e-5, rtol=0)


def test_probing_stops_when_it_does_not_pay():
    probe = probe_module.ClippedRowProbe(None, None, None, None, 1.0)  # counts only: no model needed
    assert probe.pays()  # the first micro-batch with shared rows is probed
    probe.probed, probe.clipped = 10, 4
    assert probe.pays()  # 40% clipped: a no-grad pass (about 35% of a forward and backward) pays
    probe.probed, probe.clipped = 20, 6
    assert not probe.pays()  # 30%: no longer


def test_logged_loss_holds_the_rows_with_gradient_and_the_clipped_constant_apart(pair):
    """``loss/`` is the loss of the rows that carry gradient, ``loss_clipped/`` the constant of the clipped
    ones; together they are the update's mean mini-batch loss. Per source: advantage sums, the share of rows
    with gradient (forwarded and inside the band) and the lengths, from the batch itself."""
    learner, own, cross, advantages_P_A_G = pair
    batch, out = _update(learner, own, cross, advantages_P_A_G, SETTINGS)
    metrics = learner_metrics("char", ["char", "bpe"], batch, out)
    total = sum(out.losses) / len(out.losses)
    assert metrics["loss/char"] + metrics["loss_clipped/char"] == pytest.approx(total, abs=1e-6)
    clipped_B = out.clipped_B == 1
    assert clipped_B.any() and (~clipped_B & ~out.ratio_B.isnan()).any()  # both parts are exercised
    assert metrics["loss_clipped/char"] != 0.0
    for a, source in enumerate(["char", "bpe"]):
        rows_B = batch.source_B == a
        grad_B = rows_B & ~out.ratio_B.isnan() & ~clipped_B
        prefix = f"adv_src/char/{source}"
        assert metrics[f"{prefix}/sum"] == pytest.approx(batch.advantages_B[rows_B].sum().item())
        assert metrics[f"{prefix}/mean"] == pytest.approx(batch.advantages_B[rows_B].mean().item())
        weighted = (batch.advantages_B * batch.cross_coef_B)[grad_B].sum().item()
        assert metrics[f"{prefix}/grad_sum"] == pytest.approx(weighted)
        assert metrics[f"grad_frac/char/{source}"] == pytest.approx(grad_B.sum().item() / rows_B.sum().item())
        lengths = batch.tokens.response_mask_B_T.sum(dim=-1)[rows_B].float().mean().item()
        assert metrics[f"length/char/{source}"] == pytest.approx(lengths)


def test_by_prompt_order_mixes_own_and_shared_rows_in_every_minibatch(pair):
    """``batch_order: by_prompt`` (the authors' main branch): each mini-batch holds a prompt's own and shared
    rows together, where ``own_first`` puts every shared row in the later mini-batches."""
    learner, own, cross, advantages_P_A_G = pair
    coef_A = torch.ones(2)
    first = _batch(learner, own, cross, advantages_P_A_G, coef_A)
    mixed = _batch(learner, own, cross, advantages_P_A_G, coef_A, batch_order="by_prompt")
    size = SETTINGS.minibatch_size
    plan_first = first.plan(size, SETTINGS.micro_batch_size)
    plan_mixed = mixed.plan(size, SETTINGS.micro_batch_size)
    rows = lambda mb: [r for micro in mb.micro_batches for r in micro]  # noqa: E731
    assert any(not first.is_self_B[rows(mb)].any() for mb in plan_first)  # own-first: a shared-only one
    for mb in plan_mixed:
        selves = mixed.is_self_B[rows(mb)]
        assert selves.any() and not selves.all()
    prompts = [mixed.rollouts[r].prompt_index for mb in plan_mixed for r in rows(mb)]
    assert prompts == sorted(prompts)  # prompt after prompt
    with pytest.raises(ValueError, match="batch_order"):
        build_learner_batch(learner, 0, own, cross, advantages_P_A_G, coef_A, batch_order="shuffled")
