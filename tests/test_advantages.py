"""Group and capability-aware advantages (Eqs. 5-7): hand-worked values, reductions, guards, Thm 4.1."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.hacpo import capability_aware_advantages, capability_ratios, group_advantages


def test_group_advantages_hand_worked():
    # Rewards [1, 0, 0, 1]: mean 0.5, Bessel std sqrt(1/3) = 0.57735 -> advantages ±0.5/0.57735 = ±0.86603.
    adv, metrics = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    assert adv[0].tolist() == pytest.approx([0.86603, -0.86603, -0.86603, 0.86603], abs=1e-4)
    assert metrics["uniform_group_frac"] == 0.0


def test_capability_aware_hand_worked():
    # One prompt, A=2, G=2. Agent 0 rewards [1, 0], agent 1 rewards [1, 1]. P̂ = [0.25, 0.75].
    # Learner 0: ω[0,1] = 1/3 -> baseline = (1 + 0 + 1/3 + 1/3)/4 = 0.41667.
    # Learner 1: ω[1,0] = 3   -> baseline = (3 + 0 + 1 + 1)/4 = 1.25 > 1 -> falls back to its own mean 1.0.
    # σ over [1, 0, 1, 1] (Bessel) = 0.5.
    rewards = torch.tensor([[[1.0, 0.0], [1.0, 1.0]]])
    omega = capability_ratios(torch.tensor([0.25, 0.75]))
    adv, metrics = capability_aware_advantages(rewards, omega, eps=0.0)
    assert adv[0, 0].flatten().tolist() == pytest.approx([1.16667, -0.83333, 1.16667, 1.16667], abs=1e-4)
    assert adv[1, 0].flatten().tolist() == pytest.approx([0.0, -2.0, 0.0, 0.0], abs=1e-5)
    assert metrics["baseline_fallback_frac/1"] == 1.0
    assert metrics["baseline_fallback_frac/0"] == 0.0


def test_binary_guard_can_be_disabled():
    rewards = torch.tensor([[[1.0, 0.0], [1.0, 1.0]]])
    omega = capability_ratios(torch.tensor([0.25, 0.75]))
    adv, _ = capability_aware_advantages(rewards, omega, eps=0.0, max_reward=None)
    # Learner 1 keeps the weighted baseline 1.25: every advantage negative.
    assert (adv[1] < 0).all()


def test_uniform_group_gives_zero_finite_advantages():
    rewards = torch.ones(3, 2, 4)
    omega = capability_ratios(torch.tensor([0.1, 0.9]))
    adv, metrics = capability_aware_advantages(rewards, omega)
    assert torch.isfinite(adv).all() and (adv == 0).all()
    assert metrics["uniform_group_frac"] == 1.0
    # Without the guard ω creates a signal out of identical rewards (the reason the guard exists).
    adv_unguarded, unguarded = capability_aware_advantages(
        rewards, omega, uniform_group_guard=False, max_reward=None
    )
    assert (adv_unguarded != 0).any()
    assert unguarded["uniform_group_frac"] == 1.0  # counted whether or not the guard acts on them
    adv_gspo, _ = group_advantages(torch.zeros(2, 8))
    assert torch.isfinite(adv_gspo).all() and (adv_gspo == 0).all()


def test_one_agent_reduces_to_gspo():
    torch.manual_seed(1)
    rewards_P_G = (torch.rand(6, 8) > 0.5).float()
    hacpo_adv, _ = capability_aware_advantages(rewards_P_G[:, None, :], torch.ones(1, 1))
    gspo_adv, _ = group_advantages(rewards_P_G)
    assert torch.allclose(hacpo_adv[0, :, 0, :], gspo_adv)


def test_omega_one_gives_joint_mean_baseline():
    torch.manual_seed(2)
    rewards = (torch.rand(5, 3, 4) > 0.4).float()
    adv, _ = capability_aware_advantages(rewards, torch.ones(3, 3), normalize_by_std=False)
    joint_mean = rewards.reshape(5, -1).mean(-1)
    for learner in range(3):
        assert torch.allclose(adv[learner], rewards - joint_mean[:, None, None])


def test_unbiased_baseline_monte_carlo():
    """Thm 4.1: with the true ratio ω = p1/p2, E[μ̂^(1)] = p1 and E[R − μ̂] = 0 (Cor. 4.2)."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.3, 0.7])
    omega = p[:, None] / p[None, :]
    rewards = (torch.rand(20000, 2, 8, generator=gen) < p[None, :, None]).float()
    adv, _ = capability_aware_advantages(
        rewards, omega, normalize_by_std=False, uniform_group_guard=False, max_reward=None
    )
    baseline_learner0 = rewards[:, 0, 0] - adv[0, :, 0, 0]
    # Standard error of the mean is ~0.0013 here; 0.01 is a safe, still meaningful tolerance.
    assert baseline_learner0.mean().item() == pytest.approx(0.3, abs=0.01)
    assert adv[0, :, 0, :].mean().item() == pytest.approx(0.0, abs=0.01)
    assert adv[1, :, 1, :].mean().item() == pytest.approx(0.0, abs=0.01)
    # The naive joint mean (ω = 1) is biased upward for the weaker learner: E = (0.3 + 0.7)/2 = 0.5.
    naive, _ = capability_aware_advantages(rewards, torch.ones(2, 2), normalize_by_std=False)
    assert (rewards[:, 0, 0] - naive[0, :, 0, 0]).mean().item() == pytest.approx(0.5, abs=0.01)


def _loop_reference(rewards, omega, eps, max_reward):
    P, A, G = rewards.shape
    out = torch.zeros(A, P, A, G)
    for learner in range(A):
        for p in range(P):
            flat = [rewards[p, a, g].item() for a in range(A) for g in range(G)]
            weighted = [
                omega[learner, a].item() * rewards[p, a, g].item() for a in range(A) for g in range(G)
            ]
            baseline = sum(weighted) / len(weighted)
            if all(x == flat[0] for x in flat):
                baseline = sum(flat) / len(flat)
            elif max_reward is not None and baseline > max_reward:
                baseline = rewards[p, learner].mean().item()
            mean = sum(flat) / len(flat)
            std = (sum((x - mean) ** 2 for x in flat) / (len(flat) - 1)) ** 0.5
            for a in range(A):
                for g in range(G):
                    out[learner, p, a, g] = (rewards[p, a, g] - baseline) / (std + eps)
    return out


@settings(max_examples=40, deadline=None)
@given(
    P=st.integers(1, 4),
    A=st.integers(1, 3),
    G=st.integers(2, 5),
    seed=st.integers(0, 10_000),
    binary=st.booleans(),
)
def test_vectorized_equals_loop_reference(P, A, G, seed, binary):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.rand(P, A, G, generator=gen)
    if binary:
        rewards = (rewards > 0.5).float()
    p_hat = torch.rand(A, generator=gen) + 0.05
    omega = capability_ratios(p_hat)
    vectorized, _ = capability_aware_advantages(rewards, omega, eps=1e-6)
    reference = _loop_reference(rewards, omega, 1e-6, 1.0)
    assert torch.allclose(vectorized, reference, atol=1e-4, rtol=1e-4)


def test_shape_mismatch_is_named():
    with pytest.raises(ValueError, match="omega_A_A has shape"):
        capability_aware_advantages(torch.zeros(2, 3, 4), torch.ones(2, 2))
