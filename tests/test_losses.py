"""Policy losses: GSPO self term, HACPO cross term (exp. IS, stepwise clip), GRPO, KL, masking."""

import itertools
import math

import pytest
import torch

from workbench.hacpo import (
    POLICY_LOSSES,
    LossParams,
    PolicyBatch,
    cross_sample_weight,
    get_policy_loss,
    grpo_policy_loss,
    gspo_policy_loss,
    hacpo_policy_loss,
    low_var_kl,
    masked_mean_logp,
    sequence_ratio,
    stepwise_lower_bound,
)


def _batch(new_mean, old_mean, adv, is_self=None, coef=None, minibatch_index=0, old_logp=None):
    """A PolicyBatch of one-token sequences whose mean log-probs are ``new_mean`` (exactly)."""
    n = new_mean.shape[0]
    return PolicyBatch(
        logp_B_T=new_mean[:, None],
        mask_B_T=torch.ones(n, 1),
        old_logp_mean_B=old_mean,
        advantages_B=adv,
        is_self_B=torch.ones(n, dtype=torch.bool) if is_self is None else is_self,
        cross_coef_B=torch.ones(n) if coef is None else coef,
        minibatch_index=minibatch_index,
        old_logp_B_T=old_logp,
    )


def test_masked_mean_logp_hand_worked_and_empty_rows():
    logp = torch.tensor([[-1.0, -3.0, -100.0], [float("-inf"), float("nan"), 0.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    # Row 0: (-1 - 3)/2 = -2; row 1 is all masked -> 0, and the -inf/NaN under the mask do not leak.
    assert masked_mean_logp(logp, mask).tolist() == [-2.0, 0.0]


def test_masked_tokens_change_nothing():
    torch.manual_seed(0)
    logp = torch.randn(4, 7)
    mask = (torch.rand(4, 7) > 0.3).long()
    noisy = torch.where(mask.bool(), logp, torch.randn(4, 7) * 100)
    assert torch.equal(masked_mean_logp(logp, mask), masked_mean_logp(noisy, mask))


def test_stepwise_lower_bound_sequence():
    # δ = 0.2, δ_step = 0.025: 0.800, 0.825, 0.850, 0.875; rises by δ_step per mini-batch; capped at 1.
    bounds = [stepwise_lower_bound(m, 0.2, 0.025) for m in range(4)]
    assert bounds == pytest.approx([0.8, 0.825, 0.85, 0.875])
    assert all(b2 - b1 == pytest.approx(0.025) for b1, b2 in itertools.pairwise(bounds))
    assert stepwise_lower_bound(100, 0.2, 0.025) == 1.0
    assert stepwise_lower_bound(3, 0.2, 0.0) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="minibatch_index"):
        stepwise_lower_bound(-1)


def test_sequence_ratio_on_policy_is_exactly_one_and_clamped():
    logp = torch.tensor([-0.7, -2.3, 0.0])
    assert torch.equal(sequence_ratio(logp, logp.clone()), torch.ones(3))
    assert sequence_ratio(torch.tensor([50.0]), torch.tensor([0.0]), 10.0).item() == pytest.approx(
        math.exp(10)
    )


def test_cross_weight_hand_worked():
    # s = 0.9 in mini-batch 0 (bound 0.8), α = 1, ω = 2: 0.9 · 0.9 · 2 = 1.62.
    w = cross_sample_weight(torch.tensor([0.9]), minibatch_index=0, alpha=1.0, coef_B=2.0)
    assert w.item() == pytest.approx(1.62)
    # s = 1.3 is clipped to 1 (never up-weighted); s = 0.5 to the bound 0.8 -> 0.8 · 0.8 = 0.64.
    w = cross_sample_weight(torch.tensor([1.3, 0.5]), minibatch_index=0, alpha=1.0)
    assert w.tolist() == pytest.approx([1.0, 0.64])
    # α = 0 is the clipped sequence ratio itself.
    s = torch.tensor([0.5, 0.85, 0.95, 1.2])
    w0 = cross_sample_weight(s, minibatch_index=1, alpha=0.0)
    assert torch.allclose(w0, s.clamp(0.825, 1.0))
    # No clip: s · s^α unclipped (can exceed 1).
    assert cross_sample_weight(
        torch.tensor([1.2]), minibatch_index=0, alpha=1.0, clip_cross=False
    ).item() == (pytest.approx(1.44))


def test_cross_weight_never_upweights():
    torch.manual_seed(0)
    s = torch.exp(torch.randn(1000))
    for m in range(5):
        for alpha in (0.0, 1.0, 3.0):
            assert (cross_sample_weight(s, minibatch_index=m, alpha=alpha) <= 1.0).all()


def _tiny_logits_model(seed=0):
    """A tiny differentiable 'policy': logits over a vocab of 5 for a fixed 4-token sequence."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 5, generator=gen, requires_grad=True)
    tokens = torch.tensor([1, 3, 0, 2])
    return logits, tokens


def _mean_logp(logits, tokens):
    return torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1).mean()


@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.5])
def test_exponential_is_gradient_prop_d6(alpha):
    """∇[s·sg(s)^α] = s^{α+1}·∇ log s with ∇ log s = (1/|y|) Σ_t ∇ log π(y_t) (Prop. D.6)."""
    logits, tokens = _tiny_logits_model()
    new_mean = _mean_logp(logits, tokens)
    old_mean = new_mean.detach() + 0.1  # s = exp(-0.1) ≈ 0.905, inside [0.8, 1]
    s = sequence_ratio(new_mean[None], old_mean[None])
    weight = cross_sample_weight(s, minibatch_index=0, alpha=alpha)
    (grad_weight,) = torch.autograd.grad(weight.sum(), logits)
    (grad_log_s,) = torch.autograd.grad(_mean_logp(logits, tokens), logits)
    expected = s.detach() ** (alpha + 1) * grad_log_s
    assert torch.allclose(grad_weight, expected, atol=1e-6)


@pytest.mark.parametrize("offset", [0.5, -0.3])  # s ≈ 0.61 (< bound 0.8) and s ≈ 1.35 (> 1)
@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_cross_gradient_is_zero_outside_bounds(offset, advantage):
    logits, tokens = _tiny_logits_model()
    new_mean = _mean_logp(logits, tokens)
    batch = _batch(
        new_mean[None],
        (new_mean.detach() + offset)[None],
        torch.tensor([advantage]),
        torch.tensor([False]),
        torch.tensor([2.0]),
    )
    loss, stats = hacpo_policy_loss(batch, LossParams())
    (grad,) = torch.autograd.grad(loss, logits)
    assert torch.count_nonzero(grad) == 0
    assert stats.clipped_B.tolist() == [1.0]


def test_cross_gradient_flows_inside_bounds_with_omega():
    logits, tokens = _tiny_logits_model()
    new_mean = _mean_logp(logits, tokens)
    args = (new_mean[None], (new_mean.detach() + 0.1)[None], torch.tensor([1.0]), torch.tensor([False]))
    loss1, _ = hacpo_policy_loss(_batch(*args, torch.tensor([1.0])), LossParams())
    (g1,) = torch.autograd.grad(loss1, logits, retain_graph=True)
    loss3, _ = hacpo_policy_loss(_batch(*args, torch.tensor([3.0])), LossParams())
    (g3,) = torch.autograd.grad(loss3, logits)
    assert torch.count_nonzero(g1) > 0
    assert torch.allclose(g3, 3.0 * g1, atol=1e-6)  # ω modulates the gradient linearly (Eq. 10)


def test_self_samples_use_gspo_min_clip_hand_worked():
    # s = exp(0.01) ≈ 1.01005 > 1 + 4e-4. A > 0: min(s·A, 1.0004·A) = 1.0004·A (clipped, no gradient).
    # A < 0: min(s·A, 1.0004·A) = s·A (unclipped).
    new = torch.tensor([0.01, 0.01], requires_grad=True)
    old = torch.zeros(2)
    loss, stats = gspo_policy_loss(_batch(new, old, torch.tensor([1.0, -1.0])), LossParams())
    assert loss.item() == pytest.approx(-(1.0004 - math.exp(0.01)) / 2, abs=1e-6)
    (grad,) = torch.autograd.grad(loss, new)
    assert grad[0].item() == 0.0 and grad[1].item() != 0.0
    assert stats.clipped_B.tolist() == [1.0, 0.0]  # min-based: only the clipped branch won for A > 0
    assert stats.lower_B.tolist() == pytest.approx([1 - 3e-4] * 2)
    assert stats.upper_B.tolist() == pytest.approx([1 + 4e-4] * 2)


def test_one_agent_hacpo_equals_gspo():
    torch.manual_seed(3)
    new = torch.randn(16, requires_grad=True)
    old = new.detach() + torch.randn(16) * 1e-3
    adv = torch.randn(16)
    all_self = torch.ones(16, dtype=torch.bool)
    hacpo, h_stats = hacpo_policy_loss(
        _batch(new, old, adv, all_self, torch.full((16,), 7.0), minibatch_index=2), LossParams(alpha=3.0)
    )
    gspo, g_stats = gspo_policy_loss(_batch(new, old, adv), LossParams())
    assert torch.equal(h_stats.clipped_B, g_stats.clipped_B) and torch.equal(h_stats.ratio_B, g_stats.ratio_B)
    assert torch.equal(hacpo, gspo)
    (g_h,) = torch.autograd.grad(hacpo, new)
    (g_g,) = torch.autograd.grad(gspo, new)
    assert torch.equal(g_h, g_g)


def test_hacpo_mixed_batch_hand_worked():
    # Two samples: self on-policy (s = 1, A = 0.5) and cross with s = 0.9, ω = 2, α = 1, A = 1, m = 0.
    # Objective: self 1·0.5 = 0.5; cross 0.9·0.9·2·1 = 1.62. loss = −(0.5 + 1.62)/2 = −1.06.
    new = torch.tensor([-1.0, math.log(0.9)])
    old = torch.tensor([-1.0, 0.0])
    batch = _batch(new, old, torch.tensor([0.5, 1.0]), torch.tensor([True, False]), torch.tensor([1.0, 2.0]))
    loss, stats = hacpo_policy_loss(batch, LossParams())
    assert loss.item() == pytest.approx(-1.06, abs=1e-6)
    assert stats.ratio_B[0].item() == 1.0
    assert stats.ratio_B[1].item() == pytest.approx(0.9)
    assert stats.clipped_B.tolist() == [0.0, 0.0]
    assert stats.lower_B.tolist() == pytest.approx([1 - 3e-4, 0.8])
    assert stats.upper_B.tolist() == pytest.approx([1 + 4e-4, 1.0])


def test_no_clip_ablation_lets_ratio_above_one_through():
    new = torch.tensor([0.2], requires_grad=True)  # s = e^0.2 ≈ 1.22
    batch = _batch(new, torch.zeros(1), torch.tensor([1.0]), torch.tensor([False]), torch.tensor([1.0]))
    clipped, clipped_stats = hacpo_policy_loss(batch, LossParams())
    unclipped, unclipped_stats = hacpo_policy_loss(batch, LossParams(clip_cross=False))
    assert clipped_stats.clipped_B.tolist() == [1.0] and unclipped_stats.clipped_B.tolist() == [0.0]
    assert clipped.item() == pytest.approx(-1.0)
    assert unclipped.item() == pytest.approx(-math.exp(0.4), abs=1e-5)


def test_empty_and_all_masked_give_no_nan():
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.zeros(2, 3)
    is_self = torch.tensor([True, False])
    batch = PolicyBatch(
        logp, mask, torch.zeros(2), torch.ones(2), is_self, torch.ones(2), 0, torch.zeros(2, 3)
    )
    loss, stats = hacpo_policy_loss(batch, LossParams())
    assert torch.isfinite(loss) and torch.isfinite(stats.ratio_B).all()
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    g_loss, g_stats = grpo_policy_loss(batch, LossParams(eps_low=0.2, eps_high=0.28))
    assert torch.isfinite(g_loss) and torch.isfinite(g_stats.clipped_B).all()


def test_grpo_token_level_hand_worked():
    # Token ratios e^0.5 ≈ 1.6487 and 1, A = 1: clipped to 1.28 and 1 -> mean 1.14; row 2 masked out.
    logp = torch.tensor([[0.5, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    batch = PolicyBatch(logp, mask, torch.zeros(2), torch.tensor([1.0, 1.0]), torch.ones(2, dtype=torch.bool),
                        torch.ones(2), 0, torch.zeros(2, 2))  # fmt: skip
    loss, stats = grpo_policy_loss(batch, LossParams(eps_low=0.2, eps_high=0.28))
    assert loss.item() == pytest.approx(-(1.14 + 0.0) / 2)
    assert stats.clipped_B.tolist() == [0.5, 0.0]  # row 0: one of its two tokens clipped; row 1 has none
    assert stats.lower_B.tolist() == pytest.approx([0.8, 0.8]) and stats.upper_B.tolist() == pytest.approx(
        [1.28] * 2
    )
    with pytest.raises(ValueError, match="old_logp_B_T"):
        grpo_policy_loss(_batch(torch.zeros(1), torch.zeros(1), torch.ones(1)), LossParams())


def test_low_var_kl_zero_on_policy_positive_off_policy():
    logp = torch.tensor([[-1.0, -2.0]])
    mask = torch.ones(1, 2)
    assert low_var_kl(logp, logp.clone(), mask).item() == 0.0
    # k3 at diff = ref − logp = 0.5: e^0.5 − 0.5 − 1 = 0.14872.
    assert low_var_kl(logp, logp + 0.5, mask).item() == pytest.approx(0.14872, abs=1e-5)


def test_every_registered_loss_takes_one_signature():
    """One record in, (loss, per-sample stats) out, for every variant: the trainer never branches on names."""
    torch.manual_seed(1)
    logp = torch.randn(6, 4, requires_grad=True)
    batch = PolicyBatch(
        logp_B_T=logp, mask_B_T=torch.ones(6, 4), old_logp_mean_B=logp.detach().mean(-1) + 0.05,
        advantages_B=torch.randn(6), is_self_B=torch.ones(6, dtype=torch.bool), cross_coef_B=torch.ones(6),
        minibatch_index=1, old_logp_B_T=logp.detach() + 0.05,
    )  # fmt: skip
    for name, loss_fn in POLICY_LOSSES.items():
        loss, stats = loss_fn(batch, LossParams())
        assert loss.ndim == 0 and loss.requires_grad, name
        for tensor in (stats.ratio_B, stats.lower_B, stats.upper_B, stats.clipped_B):
            assert tensor.shape == (6,) and not tensor.requires_grad, name
        assert ((stats.clipped_B >= 0) & (stats.clipped_B <= 1)).all(), name


def test_policy_loss_registry_names_valid_choices():
    assert set(POLICY_LOSSES) == {"grpo", "gspo", "hacpo"}
    assert get_policy_loss("hacpo") is hacpo_policy_loss
    with pytest.raises(ValueError, match=r"valid names: \['grpo', 'gspo', 'hacpo'\]"):
        get_policy_loss("ppo")


def test_length_normalized_logp_divides_by_bytes_where_given_and_by_token_count_elsewhere():
    from workbench.core.losses import length_normalized_logp

    logp = torch.tensor([[-1.0, -3.0, -9.0], [-2.0, -2.0, -2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert torch.equal(length_normalized_logp(logp, mask), masked_mean_logp(logp, mask))
    # row 0: (-1 - 3) / 8 bytes; row 1: length 0 keeps its own 3 tokens
    assert length_normalized_logp(logp, mask, torch.tensor([8.0, 0.0])).tolist() == [-0.5, -2.0]
    new = torch.tensor([math.log(0.9) * 5], requires_grad=True)
    batch = PolicyBatch(new[:, None], torch.ones(1, 1), torch.zeros(1), torch.ones(1), torch.tensor([False]),
                        torch.ones(1), 0, None, torch.tensor([5.0]))  # fmt: skip
    _, stats = hacpo_policy_loss(batch, LossParams())
    assert stats.ratio_B.item() == pytest.approx(0.9)  # exp(sum / 5 bytes - 0)
