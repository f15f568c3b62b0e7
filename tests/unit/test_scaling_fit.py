"""The scaling fit in model size and budget (megatron_ext/study/fit.py's two-term law,
L(N, D) = E + A·(N/N₀)^(−α) + B·(D/D₀)^(−β)) on synthetic points from a known law: it
recovers the law, with intervals of the right size; too few sizes or budgets refuse the fit
or its extrapolation, saying why; a parameter at its bound is flagged, with no interval."""

from __future__ import annotations

import numpy as np
import pytest

from megatron_ext.study import fit

LAW = {"learned": (3.5, 0.5, 0.3, 1.2, 0.5), "binary": (3.8, 0.6, 0.3, 1.2, 0.5)}
START = np.array([1e5, 6e4])
TARGET = (1.7e9, 1e11)


def loss(law, n, d) -> float:
    return float(fit.saturating_law(np.array([[n, d]]), law, START)[0])


def grid_points(sizes: int, budgets: int, noise: float, seeds=(1, 2, 3), laws=LAW,
                seed: int = 0) -> dict:
    """Every size x budget (2 decades of N, 1 of D from START), each seed's loss scattered."""
    rng = np.random.default_rng(seed)
    return {f"n{i}d{j}": {"N": n, "D": d, "loss": {
        arm: {s: loss(law, n, d) + noise * rng.standard_normal() for s in seeds}
        for arm, law in laws.items()}}
        for i, n in enumerate(START[0] * np.logspace(0, 2, sizes))
        for j, d in enumerate(START[1] * np.logspace(0, 1, budgets))}


def near(interval: dict, truth: float) -> bool:
    """The truth within 2 half widths of the estimate (its coverage in simulation is the
    calibration suite's; one draw here checks the interval is of the right size)."""
    half = (interval["high"] - interval["low"]) / 2
    return half > 0 and abs(interval["value"] - truth) < 2 * half


def test_the_joint_law_is_recovered_with_intervals_of_the_right_size():
    fits = fit.fit_arms(grid_points(4, 4, 0.005), "learned", TARGET, axes=("N", "D"))
    assert fits["extrapolated"] and fits["levels"] == 16 and fits["values"] == [4, 4]
    for arm, (e, a, alpha, b, beta) in LAW.items():
        f = fits["arms"][arm]
        assert not f["fit"]["at_bound"]
        assert f["fit"]["reference"] == [START[0], START[1]]
        assert [f["fit"][k] for k in ("A", "B")] == pytest.approx([a, b], abs=0.05)
        for name, truth in (("alpha", alpha), ("beta", beta), ("E", e)):
            assert near(f[name], truth), (arm, name, f[name])
        assert near(f["at_target"], loss(LAW[arm], *TARGET)), (arm, f["at_target"])
    truth = loss(LAW["binary"], *TARGET) - loss(LAW["learned"], *TARGET)
    assert near(fits["arms"]["binary"]["gap_at_target"], truth)
    # both arms share the exponents: the fixed-exponent sensitivity holds the truth too
    fixed = fits["fixed_alpha"]
    assert fixed["alpha"] == fits["arms"]["learned"]["fit"]["alpha"]
    assert near(fixed["arms"]["binary"]["gap_at_target"], truth)


def test_the_direct_gap_in_n_and_d_recovers_a_known_trend():
    """binary = learned + 0.3 − 0.05 per decade of N + 0.02 per decade of D (noise-free):
    the direct fit's slopes and its value at the target are the known ones."""
    def trend(n, d):
        return 0.3 - 0.05 * np.log10(n / START[0]) + 0.02 * np.log10(d / START[1])

    points = grid_points(4, 4, 0.0, laws={"learned": LAW["learned"]})
    for p in points.values():
        p["loss"]["binary"] = {s: v + trend(p["N"], p["D"]) for s, v in
                               p["loss"]["learned"].items()}
    gaps = fit.fit_arms(points, "learned", TARGET, axes=("N", "D"))["gaps"]["binary"]
    assert [s["value"] for s in gaps["slopes"]] == pytest.approx([-0.05, 0.02])
    assert gaps["at_target"]["value"] == pytest.approx(trend(*TARGET))


def test_three_sizes_are_fitted_but_not_extrapolated_and_two_refused():
    """3 sizes x 5 budgets: 15 points, yet the size term passes through the 3 sizes' means,
    so no extrapolation and no intervals, and it says why; 2 sizes cannot fit α at all."""
    fits = fit.fit_arms(grid_points(3, 5, 0.005), "learned", TARGET, axes=("N", "D"))
    assert not fits["extrapolated"]
    assert fits["why_not"].startswith("3 sizes and 5 budgets: an extrapolation needs at "
                                      "least 4 of each")
    assert fits["arms"]["binary"]["at_target"] is None
    assert fits["arms"]["binary"]["alpha"]["low"] is None
    assert fits["gaps"]["binary"]["at_target"] is None
    with pytest.raises(ValueError, match=r"arm learned: the law L\(N, D\) needs at least 3 "
                                         r"sizes and 3 budgets .* got 2 sizes and 4 budgets"):
        fit.fit_arms(grid_points(2, 4, 0.005), "learned", TARGET, axes=("N", "D"))
    one_seed = fit.fit_arms(grid_points(4, 4, 0.005, seeds=(1,)), "learned", TARGET,
                            axes=("N", "D"))
    assert not one_seed["extrapolated"] and "one seed per level" in one_seed["why_not"]


def test_a_term_with_no_trend_ends_at_its_bound_and_gets_no_interval():
    """Losses that do not depend on D (B = 0): the fit ends at the bound B = 0, flagged, and
    that arm's parameters and extrapolation get no interval, never a zero-width one."""
    flat = (3.5, 0.5, 0.3, 0.0, 0.5)
    fits = fit.fit_arms(grid_points(4, 4, 0.005, laws={"learned": flat, "binary": flat}),
                        "learned", TARGET, axes=("N", "D"))
    f = fits["arms"]["learned"]
    assert "B" in f["fit"]["at_bound"] or "beta" in f["fit"]["at_bound"], f["fit"]
    assert f["alpha"]["low"] is None and f["E"]["low"] is None
    assert f["at_target"]["low"] is None


def test_one_axis_points_keep_the_law_in_compute():
    """A sequence of compute values is the one-term law (E, A, α), as before."""
    compute = np.geomspace(1e15, 1e19, 6)
    got = fit.fit_power_law(compute, fit.power_law(compute, 2.1, 3.0, 0.3, 1e15))
    assert set(got) == {"E", "A", "alpha", "reference", "at_bound", "residuals"}
    assert got["reference"] == [1e15]
    assert (got["E"], got["A"], got["alpha"]) == pytest.approx((2.1, 3.0, 0.3), abs=1e-3)
    assert fit.predict(got, 1e21) == pytest.approx(fit.power_law(1e21, 2.1, 3.0, 0.3, 1e15),
                                                   abs=1e-3)
