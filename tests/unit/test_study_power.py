"""What a study's design detects (megatron_ext/study/power.py): the power of the paired t
interval is the t test's (G*Power's reference value), stable where scipy's noncentral t
gives NaN; the gap printed for 80% expected power is detected by 80% of fresh studies of the
design for 2, 3 and 5 seeds, at 95% and at Holm's 0.05/m, and the seeds printed for a gap by
80-90% (computed exactly over the sampling distribution of a study's spread; the old rule,
the measured spread taken as the truth, reads 0.56-0.72 there); the seeds a gap needs are
the fewest that reach 80%; a spread of 0 or of rounding prints neither a gap nor a seed
count; a crossed interval whose items' part alone keeps the power low says no number of
seeds does; the cells say where a design has no interval and what gives one. The
calibration suite simulates the same statements (tools/calibrate.py's power rows)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate
from scipy import stats as scipy_stats

from megatron_ext.study import power
from megatron_ext.study.stats import crossed_interval, holm, paired_difference, t_interval


def test_the_paired_t_power_is_the_t_tests():
    """G*Power (matched pairs, two-sided α 0.05): 10 pairs, effect size dz 1 → power
    0.8031."""
    parts, seeds = power.design(t_interval(np.random.default_rng(0).standard_normal(10)))
    unit = [power.Part(1.0 / 10, 9, 1.0)]                  # a spread of exactly 1
    assert seeds == 10 and parts[0].dof == 9
    assert power.detection(1.0, unit) == pytest.approx(0.8031, abs=2e-4)
    assert power.detection(0.0, unit) == pytest.approx(0.05, abs=1e-9)
    gap = power.detectable(unit, expected=False)       # the spread taken as the truth
    assert power.detection(gap, unit) == pytest.approx(0.8, abs=1e-9) and 0.99 < gap < 1.0
    planned = power.detectable(unit)                    # in expectation over the spread
    assert power.expected_detection(planned, unit) == pytest.approx(0.8, abs=1e-9)
    assert planned > gap


def test_the_power_is_finite_where_scipys_noncentral_t_is_not():
    """scipy's nct gives NaN at a noncentrality of 1e10 (a spread near 0) and, for the lower
    tail, at scattered ones from about 7: the power is 1 at the first and equals the
    integral of the t test's power at the others."""
    assert power.detection(1.0, [power.Part(1e-20, 9, 1.0)]) == 1.0
    assert float(power.two_sided_power(2.26, 9, 1e10)) == 1.0
    shifts = np.linspace(7, 9, 201)
    failing = shifts[np.isnan(scipy_stats.nct.cdf(-12.706, 1, shifts))]  # scipy 1.17, 1.18
    for shift in [*failing[:4], 7.0, 9.0]:
        exact = integrate.quad(lambda v: (scipy_stats.norm.sf(12.706 * math.sqrt(v) - shift)
                                          + scipy_stats.norm.cdf(-12.706 * math.sqrt(v)
                                                                 - shift))
                               * scipy_stats.chi2.pdf(v, 1), 0, np.inf, limit=200)[0]
        assert float(power.two_sided_power(12.706, 1, shift)) == pytest.approx(exact, abs=1e-9)
    assert math.isfinite(power.expected_detection(3.0, [power.Part(1e-12, 1, 1.0)]))
    # the issue's `1000 seeds`: a spread of 1e-9 (a spread, not rounding) at 1,000 seeds is
    # a noncentrality of 1.8e10, where scipy's power is NaN (scipy 1.17, 1.18) and was read
    # as "not enough"
    tiny = [power.Part(1e-18, 2, 1.0)]
    assert np.isnan(scipy_stats.nct.sf(scipy_stats.t.isf(0.025, 999), 999,
                                       1 / math.sqrt(1e-18 * 3 / 1000)))
    assert not power.no_spread(tiny, 1.0) and power.seeds_needed(1.0, tiny, 3) == 2


def _unit(seeds: int) -> list:
    """The paired t interval of ``seeds`` seeds whose per-seed difference has a spread of
    1."""
    return [power.Part(1.0 / seeds, seeds - 1, 1.0)]


def _over_studies(statement, seeds: int) -> float:
    """The mean of ``statement(ratio)`` over studies of ``seeds`` seeds, ``ratio`` their
    measured variance over the true one (χ²_m/m), integrated over its quantiles."""
    m = seeds - 1
    return integrate.quad(lambda q: statement(scipy_stats.chi2.ppf(q, m) / m), 0, 1,
                          limit=200, epsabs=1e-5)[0]


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_the_printed_gap_is_detected_by_80_percent_of_fresh_studies(seeds):
    """A study of ``seeds`` seeds prints the smallest gap at 80% expected power from its own
    spread; a fresh study of the same design whose true gap is that gap detects it with
    probability 0.80, averaged over the first study's spread (exactly: the t statistic is
    pivotal), at 95% and at Holm's 0.05/3. Taking the measured spread as the truth (the
    rule before) gives 0.580, 0.629 and 0.685 at 95% (issue 57: a loop variable had made
    this figure 0.05/3's, 0.670 at 5 seeds)."""
    truth = _unit(seeds)

    def detected(ratio, alpha, expected=True):
        printed = power.detectable([power.Part(ratio / seeds, seeds - 1, 1.0)], alpha,
                                   expected=expected)
        return power.detection(printed, truth, alpha)
    for alpha in (0.05, 0.05 / 3):
        assert _over_studies(lambda r: detected(r, alpha), seeds) == pytest.approx(0.80,
                                                                                 abs=0.002)
    old = _over_studies(lambda ratio: detected(ratio, 0.05, expected=False), seeds)
    assert old == pytest.approx({2: 0.580, 3: 0.629, 5: 0.685}[seeds], abs=0.003)


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_the_seeds_printed_for_a_gap_detect_it_80_to_90_percent_of_the_time(seeds):
    """A study of ``seeds`` seeds prints the seeds that would detect a gap of one per-seed
    spread; a fresh study of that many seeds at that gap detects it with probability in
    0.80-0.90 averaged over the first study's spread (seeds come whole); taken as the truth,
    the measured spread names seeds that detect it less often than 0.75 (0.56-0.72)."""
    truth = _unit(seeds)
    quantiles = (np.arange(30) + 0.5) / 30
    ratios = scipy_stats.chi2.ppf(quantiles, seeds - 1) / (seeds - 1)

    def share(expected: bool) -> float:
        named = [power.seeds_needed(1.0, [power.Part(r / seeds, seeds - 1, 1.0)], seeds,
                                    expected=expected) for r in ratios]
        return float(np.mean([power.detection(1.0, power.with_seeds(truth, seeds, n))
                              for n in named]))
    assert 0.80 <= share(True) <= 0.90
    assert share(False) < 0.75


def test_the_seeds_named_for_a_gap_are_the_fewest_that_detect_it():
    interval = paired_difference({1: 0.31, 2: 0.27, 3: 0.36}, {1: 0.0, 2: 0.0, 3: 0.0})
    parts, seeds = power.design(interval)
    for gap in (0.05, 0.1, 0.3):
        needed = power.seeds_needed(gap, parts, seeds)
        assert power.expected_detection(gap, power.with_seeds(parts, seeds, needed)) >= 0.8
        if needed > 2:
            assert power.expected_detection(
                gap, power.with_seeds(parts, seeds, needed - 1)) < 0.8
        # the spread's uncertainty costs seeds: more than with the spread taken as true
        assert needed >= power.seeds_needed(gap, parts, seeds, expected=False)
    assert power.seeds_needed(1e-6, parts, seeds) is None            # beyond MOST_SEEDS
    found = power.sensitivity(interval, gap=0.1)      # a gap of interest, not the measured
    assert found["seeds"] == 3 and found["seeds_needed"] == power.seeds_needed(0.1, parts, seeds)
    assert found["power"] == power.expected_detection(0.1, parts) < 0.8
    assert power.cell(interval, gap=0.1) == (f"±{found['detectable']:.4f} · power "
                                             f"{found['power']:.2f}, {found['seeds_needed']} seeds")
    # issue 57: no figure is planned from the measured gap (observed power)
    assert power.cell(interval) == f"±{found['detectable']:.4f}"
    assert power.sensitivity(interval)["seeds_needed"] is None


def test_a_family_judged_by_holm_gets_the_power_at_its_threshold_beside_95_percent():
    """In a family of 3, a p-value below 0.05/3 is significant after Holm's adjustment
    whatever the others: the cell gives the gap and seeds there after the 95% ones, both
    larger."""
    interval = paired_difference({1: 0.31, 2: 0.27, 3: 0.36}, {1: 0.0, 2: 0.0, 3: 0.0})
    at_95, at_holm = (power.sensitivity(interval, alpha, 0.3) for alpha in (0.05, 0.05 / 3))
    assert at_holm["detectable"] > at_95["detectable"]
    assert at_holm["seeds_needed"] > at_95["seeds_needed"]
    assert at_holm["power"] < at_95["power"]
    assert power.cell(interval, family=3, gap=0.3) == (
        f"±{at_95['detectable']:.4f} · power {at_95['power']:.2f}, "
        f"{at_95['seeds_needed']} seeds / ±{at_holm['detectable']:.4f} · power "
        f"{at_holm['power']:.2f}, {at_holm['seeds_needed']} seeds")
    assert power.header(3).endswith("(95% / Holm's 0.05/3)") and power.header(1) == power.HEADER


def test_seeds_that_measured_no_spread_print_neither_a_gap_nor_a_seed_count():
    """Equal differences (a spread of 0) and differences equal up to rounding (the issue's
    `1000 seeds`: a NaN power at a huge noncentrality read as not enough) both say the
    seeds measured no spread; a tuned study's cell too; a spread of 1e-6 is a spread."""
    equal = paired_difference({1: 4.2, 2: 4.3, 3: 4.4}, {1: 4.0, 2: 4.1, 3: 4.2})
    rounding = paired_difference({1: 0.1 + 0.2, 2: 0.3, 3: 0.7 - 0.4}, {1: 0.0, 2: 0.0, 3: 0.0})
    assert 0 < rounding["half_width"] < 1e-14 and equal["half_width"] < 1e-14
    for interval in (equal, rounding, t_interval([0.2, 0.2])):
        found = power.sensitivity(interval)
        assert found["no_spread"] and found["detectable"] is None
        assert found["seeds_needed"] is None
        assert power.cell(interval) == power.NO_SPREAD_TEXT
        assert power.cell(interval, family=3, trained=lambda r: 2 * r - 1, gap=0.1) == (
            f"{power.NO_SPREAD_TEXT} / {power.NO_SPREAD_TEXT}")
    assert "±0.0000" not in power.cell(equal) and "1000" not in power.cell(rounding)
    small = t_interval([0.2, 0.2 + 1e-6, 0.2 - 1e-6])
    assert not power.sensitivity(small)["no_spread"]
    assert power.cell(small, gap=0.1).endswith(", 2 seeds")


def test_a_tuned_design_counts_every_seed_it_trains():
    """A tuned study's gaps are over its reported seeds; the seeds it needs are shown as
    those it trains, the selection's included (2·reported − 1)."""
    interval = t_interval([0.31, 0.27, 0.36])
    needed = power.sensitivity(interval, gap=0.1)["seeds_needed"]
    assert power.cell(interval, trained=lambda r: 2 * r - 1, gap=0.1).endswith(
        f", {2 * needed - 1} seeds ({needed} reported)")


def test_a_crossed_interval_whose_items_limit_it_says_no_number_of_seeds_does():
    """3 seeds x 400 items whose difference varies mostly by item: more seeds shrink only
    the by-seed part, so a gap below what the items allow is out of reach."""
    rng = np.random.default_rng(1)
    diff = 0.002 + rng.normal(0, 0.3, 400)[None, :] + rng.normal(0, 0.01, (3, 400))
    interval = crossed_interval(diff, np.zeros_like(diff))
    found = power.sensitivity(interval, gap=0.002)
    assert found["items_limit"] and found["seeds_needed"] is None
    assert power.cell(interval, gap=0.002).endswith(", no number of seeds (the items' part "
                                                    "alone)")
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


def test_seeds_that_measured_no_spread_report_no_p_value_and_holm_does_not_count_them():
    """Issue 57: equal per-seed differences (a spread of 0, or of rounding) printed p = 0,
    which Holm's adjustment then counted as significant. They report no p-value (None,
    not 0 and not 1), which the adjustment leaves out."""
    equal = paired_difference({1: 4.2, 2: 4.3, 3: 4.4}, {1: 4.0, 2: 4.1, 3: 4.2})
    rounding = paired_difference({1: 0.1 + 0.2, 2: 0.3, 3: 0.7 - 0.4}, {1: 0.0, 2: 0.0, 3: 0.0})
    crossed = crossed_interval([[1.0, 1.0]] * 2, [[0.0, 0.0]] * 2)
    same = crossed_interval([[1.0, 0.0]] * 2, [[1.0, 0.0]] * 2)
    for interval in (equal, rounding, t_interval([0.2, 0.2]), crossed, same):
        assert interval["p"] is None, interval
    assert holm([equal["p"], 0.04]) == [None, 0.04]
    assert t_interval([0.2, 0.2 + 1e-6, 0.2 - 1e-6])["p"] < 1e-6    # a spread: a p-value


def test_the_equivalence_bound_is_the_90_percent_intervals_and_tost_holds_its_size():
    """The bound is max(|low|, |high|) of the 90% t interval; at a true gap equal to the
    margin the two one-sided tests claim equivalence at most 5% of the time (computed
    exactly over a 3-seed study's mean and spread); the seeds for non-inferiority are the
    fewest whose upper end falls below the margin with 80% expected power at a gap of 0."""
    interval = t_interval([0.31, 0.27, 0.36])
    ninety = t_interval([0.31, 0.27, 0.36], 0.90)
    found = power.equivalence(interval, 0.5)
    assert found["bound"] == pytest.approx(ninety["high"]) and found["within"]
    assert power.equivalence(interval, 0.3)["within"] is False
    assert power.equivalence(t_interval([0.2, 0.2]), 0.1) is None       # no spread
    # P(|mean| + t·s/√3 < m) at a true gap m = 1 (sd 1, 3 seeds): over s, the normal mean
    t90 = scipy_stats.t.isf(0.05, 2)

    def claimed(s):
        half = t90 * s / math.sqrt(3)
        width = max(2 * (1 - half), 0.0)     # mean in (half - 1, 1 - half), centred at 1
        return (scipy_stats.norm.cdf((1 - half - 1) * math.sqrt(3))
                - scipy_stats.norm.cdf((half - 1 - 1) * math.sqrt(3))) if width else 0.0
    size = integrate.quad(lambda v: claimed(math.sqrt(v / 2)) * scipy_stats.chi2.pdf(v, 2),
                          0, np.inf)[0]
    assert 0.0 < size <= 0.05
    parts, seeds = power.design(interval)
    needed = power.non_inferiority_seeds(0.05, parts, seeds)
    assert power.expected_detection(0.05, power.with_seeds(parts, seeds, needed), 0.1) >= 0.8
    assert power.expected_detection(0.05, power.with_seeds(parts, seeds, needed - 1), 0.1) < 0.8
