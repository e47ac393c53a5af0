"""Capability window P̂ (Eq. 9) and ratios ω (Eq. 8): semantics, clamp, guards, checkpointing."""

import pytest
import torch

from workbench.hacpo import CapabilityTracker, capability_ratios


def test_empty_window_gives_capability_one():
    tracker = CapabilityTracker(3)
    assert torch.equal(tracker.p_hat(), torch.ones(3))
    assert torch.equal(capability_ratios(tracker.p_hat()), torch.ones(3, 3))


def test_window_mean_includes_newest_and_drops_oldest():
    tracker = CapabilityTracker(2, window=3)
    for acc in ([0.1, 0.5], [0.2, 0.5], [0.3, 0.8], [0.6, 0.2]):
        tracker.update(acc)
    # Window K=3 keeps the last three steps: agent 0 (0.2+0.3+0.6)/3 = 0.3667, agent 1 (0.5+0.8+0.2)/3 = 0.5.
    assert tracker.p_hat() == pytest.approx([0.36667, 0.5], abs=1e-4)
    assert tracker.n_updates_in_window == 3


def test_floor_makes_zero_accuracy_finite():
    tracker = CapabilityTracker(2, window=2, floor=1e-8)
    tracker.update([0.0, 0.5])
    p_hat = tracker.p_hat()
    assert p_hat[0].item() == pytest.approx(1e-8)
    omega = capability_ratios(p_hat)
    assert torch.isfinite(omega).all()
    # Clamped: 1e-8 / 0.5 -> 0.1 and 0.5 / 1e-8 -> 10.
    assert omega[0, 1].item() == pytest.approx(0.1)
    assert omega[1, 0].item() == pytest.approx(10.0)


def test_ratio_semantics_hand_worked():
    # P̂ = [0.2, 0.6]: learner 0 (weaker) weights source 1's rewards by 0.2/0.6 = 1/3 in its baseline,
    # and a cross sample from source 1 in learner 0's loss is amplified by omega[1, 0] = 3.
    omega = capability_ratios(torch.tensor([0.2, 0.6]))
    assert omega[0, 1].item() == pytest.approx(1 / 3)
    assert omega[1, 0].item() == pytest.approx(3.0)
    assert torch.equal(omega.diagonal(), torch.ones(2))


def test_ratios_reciprocal_before_clamp_and_clamped_after():
    torch.manual_seed(0)
    p_hat = torch.rand(5) * 0.9 + 0.1
    omega = capability_ratios(p_hat, min_ratio=1e-6, max_ratio=1e6)
    assert torch.allclose(omega * omega.T, torch.ones(5, 5), atol=1e-6)
    # A stronger source amplifies the gradient for a weaker learner: omega[source, learner] > 1.
    strong, weak = int(p_hat.argmax()), int(p_hat.argmin())
    assert omega[strong, weak] > 1 > omega[weak, strong]
    clamped = capability_ratios(torch.tensor([0.01, 0.5, 0.9]))
    assert clamped.min() >= 0.1 and clamped.max() <= 10.0


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="window"):
        CapabilityTracker(2, window=0)
    tracker = CapabilityTracker(2)
    with pytest.raises(ValueError, match="one per agent"):
        tracker.update([0.5])
    with pytest.raises(ValueError, match="min_ratio"):
        capability_ratios(torch.ones(2), min_ratio=2.0, max_ratio=10.0)
    with pytest.raises(ValueError, match="positive"):
        capability_ratios(torch.tensor([0.0, 0.5]))


def test_state_dict_round_trip_continues_identically():
    a = CapabilityTracker(2, window=2)
    a.update([0.1, 0.9])
    a.update([0.3, 0.7])
    b = CapabilityTracker(2, window=2)
    b.load_state_dict(a.state_dict())
    for tracker in (a, b):
        tracker.update([0.5, 0.5])
    assert torch.equal(a.p_hat(), b.p_hat())
    with pytest.raises(ValueError, match="same agents"):
        CapabilityTracker(3).load_state_dict(a.state_dict())
