"""The paired test of two methods on the same held-out items (workbench.lab.paired.paired_bootstrap), and the
unpaired rule it falls back to, on hand-checkable cases."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from workbench.lab.paired import paired_bootstrap, unpaired_difference


def _rows(method: str, values_S_I: list[list[float]] | np.ndarray) -> pd.DataFrame:
    """Tidy rows of one method: seed s, item i, value values_S_I[s][i]."""
    return pd.DataFrame(
        [(method, s, f"q{i}", float(v)) for s, row in enumerate(values_S_I) for i, v in enumerate(row)],
        columns=["method", "seed", "item", "value"],
    )


def test_identical_runs_give_zero_and_are_not_resolved():
    scores = np.random.default_rng(0).integers(0, 2, size=(3, 50))
    result = paired_bootstrap(pd.concat([_rows("h", scores), _rows("g", scores)]), "h", "g", n_boot=500)
    assert result["delta"] == 0 and result["se"] == 0
    assert (result["ci_low"], result["ci_high"], result["p_value"]) == (0, 0, 1)
    assert not result["resolved"] and (result["seeds"], result["items"]) == (3, 150)


def test_one_more_correct_item_everywhere_is_resolved():
    base = np.zeros((3, 40))
    better = base.copy()
    better[:, :10] = 1  # +1 on 10 of 40 items in every seed: Δ = 0.25
    result = paired_bootstrap(pd.concat([_rows("h", better), _rows("g", base)]), "h", "g", n_boot=2000)
    assert result["delta"] == pytest.approx(0.25) and result["resolved"] and result["ci_low"] > 0
    # A replicate is 0 only if its 40 draws miss all 10 items: (3/4)^40 ≈ 1e-5, so none of 2000 is.
    assert result["p_value"] == pytest.approx(2 / 2001)
    shifted = paired_bootstrap(pd.concat([_rows("h", base + 1), _rows("g", base)]), "h", "g", n_boot=200)
    assert (shifted["delta"], shifted["ci_low"], shifted["ci_high"], shifted["se"]) == (1, 1, 1, 0)
    flipped = paired_bootstrap(pd.concat([_rows("h", base), _rows("g", better)]), "h", "g", n_boot=2000)
    assert flipped["delta"] == pytest.approx(-0.25) and flipped["resolved"] and flipped["ci_high"] < 0


def test_one_seed_matches_the_closed_form_paired_standard_error():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2, 4000)
    b = np.where(rng.random(4000) < 0.7, a, 1 - a)
    result = paired_bootstrap(pd.concat([_rows("h", [a]), _rows("g", [b])]), "h", "g", n_boot=20_000)
    d = a - b
    assert result["delta"] == pytest.approx(d.mean())
    assert result["se"] == pytest.approx(d.std() / math.sqrt(d.size), rel=0.03)  # sd(d) / sqrt(n)
    half = 1.96 * d.std() / math.sqrt(d.size)
    assert result["ci_low"] == pytest.approx(d.mean() - half, abs=0.1 * half)
    assert result["ci_high"] == pytest.approx(d.mean() + half, abs=0.1 * half)


def test_items_shared_by_the_seeds_are_drawn_once_per_replicate():
    # Three seeds with the same differences on the same items know no more about those items than one
    # seed: SE = sd(d) / sqrt(n), not / sqrt(3 n). Seeds with items of their own (each seed drew its own
    # held-out set) do average them: SE = sd(d) / sqrt(3 n).
    rng = np.random.default_rng(4)
    a = rng.integers(0, 2, 1500)
    b = np.where(rng.random(1500) < 0.7, a, 1 - a)
    d = a - b
    shared = paired_bootstrap(pd.concat([_rows("h", [a] * 3), _rows("g", [b] * 3)]), "h", "g", n_boot=8000)
    assert shared["se"] == pytest.approx(d.std() / math.sqrt(d.size), rel=0.05)
    own = pd.concat([_rows("h", [a] * 3), _rows("g", [b] * 3)])
    own["item"] = own["item"] + "@" + own["seed"].astype(str)
    nested = paired_bootstrap(own, "h", "g", n_boot=8000)
    assert nested["se"] == pytest.approx(d.std() / math.sqrt(3 * d.size), rel=0.05)
    assert shared["delta"] == nested["delta"] == pytest.approx(d.mean())


def test_seeds_are_resampled_too():
    # Within each seed every item moves by the same amount (+0.1, -0.1, +0.1): items add no noise, the
    # seeds do. A replicate is the mean of 3 seeds drawn with replacement, so it lies in {-0.1, -1/30, 1/30,
    # 0.1}; all three draws being the -0.1 seed has probability 1/27 > 2.5%, hence the interval's ends.
    base = np.zeros((3, 30))
    moved = base + np.array([[0.1], [-0.1], [0.1]])
    result = paired_bootstrap(pd.concat([_rows("h", moved), _rows("g", base)]), "h", "g", n_boot=5000)
    assert result["delta"] == pytest.approx(0.1 / 3)
    assert result["ci_low"] == pytest.approx(-0.1) and result["ci_high"] == pytest.approx(0.1)
    assert not result["resolved"]


def test_row_order_method_names_and_unpaired_rows_do_not_matter():
    rng = np.random.default_rng(2)
    h, g = rng.integers(0, 5, size=(2, 60)) / 4, rng.integers(0, 5, size=(2, 60)) / 4
    rows = pd.concat([_rows("hacpo", h), _rows("gspo", g)], ignore_index=True)
    first = paired_bootstrap(rows, "hacpo", "gspo", seed=7)
    assert paired_bootstrap(rows.sample(frac=1, random_state=3), "hacpo", "gspo", seed=7) == first
    extra = pd.concat(
        [
            rows,
            _rows("hacpo", [[1.0]]).assign(item="only-hacpo"),  # an item one method lacks
            _rows("gspo", [[0.0]] * 3).assign(seed=[5, 5, 5], item=["x", "y", "z"]),  # a seed one lacks
            _rows("naive", h),  # a third method
        ]
    )
    assert paired_bootstrap(extra, "hacpo", "gspo", seed=7) == first
    assert first["delta"] == pytest.approx((h - g).mean())
    assert paired_bootstrap(rows, "hacpo", "gspo", seed=8) != first  # the seed is the only randomness


def test_nothing_paired_and_bad_rows():
    rows = _rows("h", [[1, 0]])
    empty = paired_bootstrap(rows, "h", "g")
    assert math.isnan(empty["delta"]) and not empty["resolved"] and empty["items"] == 0
    with pytest.raises(ValueError, match=r"repeat a \(method, seed, item\), e.g. method h, seed 0, item q0"):
        paired_bootstrap(pd.concat([rows, rows.iloc[:1]]), "h", "g")
    with pytest.raises(ValueError, match=r"lack columns \['value'\]"):
        paired_bootstrap(rows.drop(columns="value"), "h", "g")


def test_unpaired_rule_is_two_standard_errors():
    result = unpaired_difference(0.05, 0.02)
    assert (result["ci_low"], result["ci_high"]) == pytest.approx((0.01, 0.09)) and result["resolved"]
    assert result["p_value"] == pytest.approx(math.erfc(2.5 / math.sqrt(2)))
    assert not unpaired_difference(0.03, 0.02)["resolved"]
    unknown = unpaired_difference(0.03, math.nan)
    assert unknown["delta"] == 0.03 and math.isnan(unknown["ci_low"]) and not unknown["resolved"]
