"""The calibration suite (megatron_ext/study/calibration/, tools/calibrate.py) at a reduced
trial count: every printed interval's coverage, and the false-positive rates, inside the
band stated for that count; the bands (a power row's 0.75-0.90, a false positive "at most"
row's upper end only); the tuned factor's seed split; the tool's files.

At 40 trials a false-positive row's band is 0-15%: it cannot catch a 10% rate. The unit
tier's guards of the false positives that matter are tests on cheaper statistics with their
power stated: the probes' selectivity on any text (tests/unit/test_probe_controls.py, the
chi-square of 360 models' means, simulated there to fail at a 10% rate), the power statements (tests/unit/test_study_power.py,
computed exactly over a study's spread). The power and frequency-mark scenarios (about
0.1 s a trial) run there and in the full run, not at 40 trials here."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from megatron_ext.study import power
from megatron_ext.study.calibration import suite
from megatron_ext.study.calibration.power import gap_of_interest_by_seed
from megatron_ext.study.spec import split_seeds
from megatron_ext.study.tuning import best_level
from tools import calibrate

TRIALS = 40


def test_the_band_is_the_stated_tolerance_for_the_trial_count():
    assert suite.tolerance(2000) == 0.02            # the full run: 0.93-0.97
    assert suite.tolerance(TRIALS) == pytest.approx(3 * math.sqrt(0.95 * 0.05 / TRIALS))


QUICK = ["t by seed", "downstream", "fit", "fit L(N, D)", "tuned", "probes", "equivalence",
         "gap of interest"]


@pytest.fixture(scope="module")
def quick():
    return suite.run(TRIALS, seed=1, checks=QUICK)


# the two tests of the module's `quick` run: on one worker, so that it is simulated once, and
# on one leg of `make test` (the simulation holds no megatron-core)
QUICK_RUN = "simulated statistics: no megatron-core in them"


@pytest.mark.xdist_group("calibration")
@pytest.mark.one_leg(2, QUICK_RUN)
def test_every_printed_interval_is_within_its_band_at_a_reduced_trial_count(quick):
    assert {c for c, *_ in suite.SCENARIOS} == {*QUICK, "power", "frequency mark"}
    asserted = [r for r in quick["rows"] if r["within"] is not None]
    checks = {r["check"] for r in asserted}
    assert checks == set(QUICK)
    outside = [r for r in asserted if not r["within"]]
    assert not outside, outside
    # the crossed interval is there in every downstream scenario, with 2 to 5 seeds
    crossed = [r for r in asserted if r["interval"] == "by seed and item (crossed)"]
    assert len(crossed) == sum(c == "downstream" and label != suite.ITEMS_DOMINATE
                               for c, label, *_ in suite.SCENARIOS)


@pytest.mark.xdist_group("calibration")
@pytest.mark.one_leg(2, QUICK_RUN)
def test_the_suite_separates_a_miscalibrated_interval(quick):
    """The choice made on the reported seeds is measured (not asserted) beside the split
    one; the family of 3 sizes, unadjusted, misses far more often than 5%."""
    family = [r for r in quick["rows"] if "unadjusted" in r["interval"]]
    assert family and all(r["rate"] > 0.05 for r in family)
    assert all(r["within"] is None for r in family)


def test_a_power_row_must_read_75_to_90_percent_and_an_at_most_row_no_more_than_7(
        monkeypatch):
    """The bands of the power rows (the share of fresh studies that detect what a report
    states at 80%) and of the rows bounded above only, at 2,000 trials and at 40 (where
    they widen to 3 standard errors), and the rows a scenario counts on fewer trials."""
    rates = {"p low": ("power", 0.74), "p in": ("power", 0.80), "p high": ("power", 0.905),
             "p counted": ("power", 0.70, 30), "fp at most": ("fp_at_most", 0.0),
             "fp over": ("fp_at_most", 0.08)}
    monkeypatch.setattr(suite, "SCENARIOS", [
        ("check", "scenario", lambda rng, trials: rates, {})])
    rows = {r["interval"]: r for r in suite.run(2000)["rows"]}
    assert (rows["p in"]["low"], rows["p in"]["high"]) == pytest.approx((0.75, 0.90))
    assert [rows[k]["within"] for k in ("p low", "p in", "p high")] == [False, True, False]
    assert rows["p counted"]["trials"] == 30 and rows["p counted"]["within"]   # 3 SE at 30
    assert (rows["fp at most"]["low"], rows["fp at most"]["high"]) == pytest.approx((0, 0.07))
    assert rows["fp at most"]["within"] and not rows["fp over"]["within"]
    wide = {r["interval"]: r for r in suite.run(40)["rows"]}["p in"]
    half = 3 * math.sqrt(0.825 * 0.175 / 40)
    assert (wide["low"], wide["high"]) == pytest.approx((0.825 - half, 1.0))   # capped at 1


def test_an_agreement_row_must_read_within_3_hundredths_or_its_3_standard_errors(
        monkeypatch):
    """A printed figure minus the rate achieved: within ±0.03, or ± the 3 standard errors
    the scenario gives where they are wider."""
    rates = {"in": ("agreement", 0.029, 2000, 0.02), "over": ("agreement", -0.031, 2000, 0.02),
             "wide": ("agreement", 0.1, 40, 0.15)}
    monkeypatch.setattr(suite, "SCENARIOS", [
        ("check", "scenario", lambda rng, trials: rates, {})])
    rows = {r["interval"]: r for r in suite.run(2000)["rows"]}
    assert (rows["in"]["low"], rows["in"]["high"]) == pytest.approx((-0.03, 0.03))
    assert [rows[k]["within"] for k in ("in", "over", "wide")] == [True, False, True]
    assert (rows["wide"]["low"], rows["wide"]["high"]) == pytest.approx((-0.15, 0.15))


def test_the_gap_of_interest_check_fails_a_printed_power_off_by_a_tenth(monkeypatch):
    """The expected power printed at a gap of interest, over studies whose true spread is
    drawn from the prior it assumes, agrees with the share of fresh studies that detect the
    gap (the quick run above); a figure 0.1 too high is caught at 400 trials (its band
    there about ±0.05)."""
    expected = power.expected_detection
    monkeypatch.setattr(power, "expected_detection",
                        lambda gap, parts: expected(gap, parts) + 0.1)
    rng = np.random.default_rng(3)
    found = gap_of_interest_by_seed(rng, 400, seeds=5, gap=0.03)
    _, difference, _, error = found["printed minus detected"]
    assert abs(difference) > max(suite.AGREEMENT, error)


def test_the_seeds_split_into_selection_and_reported():
    assert split_seeds([3, 1, 2]) == ([1], [2, 3])
    assert split_seeds([1, 2, 3, 4, 5]) == ([1, 2], [3, 4, 5])
    assert split_seeds([7]) == ([7], [7])
    losses = {"lo": {1: 3.0, 2: 2.0}, "mid": {1: 2.5, 2: 9.0}, "hi": {1: 2.5, 2: 1.0}}
    assert best_level(losses, [1]) == "mid"          # ties go to the first level listed
    assert best_level(losses, [2]) == "hi"
    assert best_level({"a": {1: None}, "b": {1: 5.0}}, [1]) == "b"


def test_the_tool_writes_the_table_and_its_json(tmp_path, capsys):
    result = calibrate.main(["--trials", "40", "--check", "t by seed",
                             "--output-dir", str(tmp_path)])
    table = (tmp_path / "calibration.md").read_text()
    assert table.startswith("`python tools/calibrate.py --trials 40 --check 't by seed' "
                            f"--output-dir {tmp_path.name}` (")
    assert "| t by seed | 2 seeds | by seed (t) | coverage |" in table
    assert json.loads((tmp_path / "calibration.json").read_text())["rows"] == result["rows"]
    assert "/work" not in table and str(tmp_path) not in table
    assert capsys.readouterr().out == table
