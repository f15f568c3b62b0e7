"""What a study's design detects (megatron_ext/study/power.py): the power of the paired t
interval is the t test's (G*Power's reference value), the smallest detectable gap inverts it,
the seeds a measured gap needs are the fewest that reach 80%, a crossed interval whose items'
part alone keeps the power low says no number of seeds does, and the cells say where a
design has no interval and what gives one. The detected fraction at the stated gap is
simulated by the calibration suite (tests/unit/test_calibration.py)."""

from __future__ import annotations

import numpy as np
import pytest

from megatron_ext.study import power
from megatron_ext.study.stats import crossed_interval, paired_difference, t_interval


def test_the_paired_t_power_is_the_t_tests():
    """G*Power (matched pairs, two-sided α 0.05): 10 pairs, effect size dz 1 → power
    0.8031."""
    parts, seeds = power.design(t_interval(np.random.default_rng(0).standard_normal(10)))
    unit = [power.Part(1.0 / 10, 9, 1.0)]                  # a spread of exactly 1
    assert seeds == 10 and parts[0].dof == 9
    assert power.detection(1.0, unit) == pytest.approx(0.8031, abs=2e-4)
    assert power.detection(0.0, unit) == pytest.approx(0.05, abs=1e-9)
    gap = power.detectable(unit)
    assert power.detection(gap, unit) == pytest.approx(0.8, abs=1e-9) and 0.99 < gap < 1.0


def test_the_seeds_named_for_a_gap_are_the_fewest_that_detect_it():
    interval = paired_difference({1: 0.31, 2: 0.27, 3: 0.36}, {1: 0.0, 2: 0.0, 3: 0.0})
    parts, seeds = power.design(interval)
    for gap in (0.05, 0.1, 0.3):
        needed = power.seeds_needed(gap, parts, seeds)
        assert power.detection(gap, power.with_seeds(parts, seeds, needed)) >= 0.8
        if needed > 2:
            assert power.detection(gap, power.with_seeds(parts, seeds, needed - 1)) < 0.8
    assert power.seeds_needed(1e-6, parts, seeds) is None            # beyond MOST_SEEDS
    found = power.sensitivity(interval)
    assert found["seeds"] == 3 and found["seeds_needed"] == power.seeds_needed(
        interval["mean"], parts, seeds)
    assert power.cell(interval) == f"±{found['detectable']:.4f} · {found['seeds_needed']} seeds"


def test_a_crossed_interval_whose_items_limit_it_says_no_number_of_seeds_does():
    """3 seeds x 400 items whose difference varies mostly by item: more seeds shrink only
    the by-seed part, so a gap below what the items allow is out of reach."""
    rng = np.random.default_rng(1)
    diff = 0.002 + rng.normal(0, 0.3, 400)[None, :] + rng.normal(0, 0.01, (3, 400))
    interval = crossed_interval(diff, np.zeros_like(diff))
    found = power.sensitivity(interval)
    assert found["items_limit"] and found["seeds_needed"] is None
    assert power.cell(interval).endswith("· no number of seeds (the items' part alone)")
    parts, seeds = power.design(interval)
    assert [p.groups for p in parts] == [1.0, 0.0]
    more = power.with_seeds(parts, seeds, 30)
    assert more[1] == parts[1] and more[0].variance == pytest.approx(parts[0].variance / 10)


def test_a_design_without_an_interval_says_so_and_names_the_seeds_for_one():
    assert power.cell(t_interval([0.3])) == "no interval (1 seed): an interval needs 2 seeds"
    one_seed = crossed_interval(np.ones((1, 5)), np.zeros((1, 5)))
    assert power.cell(one_seed) == ("conditional on its 1 seed: an interval for the arms "
                                    "needs 2 seeds")
    assert power.cell(None) == "—"
    assert power.cell(t_interval([0.3]), needs="custom") == "custom"


def test_a_fits_interval_scales_its_degrees_of_freedom_with_the_seeds():
    """A fit pooled over 5 levels of 3 seeds (10 degrees of freedom): 5 groups, so 7 seeds
    give 30 degrees of freedom and 3/7 of the variance."""
    interval = {"value": 0.2, "low": 0.1, "high": 0.3, "variance": 0.0021, "dof": 10,
                "seeds": 3}
    (part,), seeds = power.design(interval)
    assert seeds == 3 and part.groups == 5
    (more,) = power.with_seeds([part], seeds, 7)
    assert more.dof == 30 and more.variance == pytest.approx(0.0021 * 3 / 7)
