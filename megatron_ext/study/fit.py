"""The scaling fit of a study with factors: a saturating power law ``L(C) = E + A·C^(−α)``
of the held-out loss against training compute, fitted per arm (scipy, bounded), beside the
gap to the control fitted directly (``g(C) = g₀ + g₁·log₁₀(C/C₀)``, 2 parameters) and a
sensitivity fit with every arm's ``α`` fixed at the control's (the anchor). Pure functions
of numbers; :mod:`.scaling` feeds them a study's points.

Intervals (95%, Student-t) come from the seeds' spread within each level, pooled over the
levels (``Σ(S_l − 1)`` degrees of freedom; the arms' covariance too, so gaps stay paired by
seed), carried through the fit by its linearisation (the delta method). Rules, each
stated in the report where it applies:

- a law is fitted with at least :data:`MIN_POINTS` distinct compute values, but extrapolated
  (and given intervals) only with :data:`MIN_EXTRAPOLATION` (2 degrees of freedom beyond the
  3 parameters): with 3 it passes through every point, at a bound or not;
- ``E`` is bounded to ``[0, min(L)]`` and ``α`` to ``[0, 3]``: a parameter that ends at a
  bound is flagged beside its value, and that arm's parameters and extrapolation get no
  interval (the linearisation does not hold there), never a zero-width one;
- a level of one seed leaves no spread to pool: no intervals.
Their coverage is measured by simulation in :mod:`.calibration`.
"""

from __future__ import annotations

import math
import warnings
from typing import Optional, Sequence

import numpy as np
from scipy import stats as scipy_stats

MIN_POINTS = 3
MIN_EXTRAPOLATION = 5
ALPHA_MAX = 3.0


def power_law(compute, e: float, a: float, alpha: float, reference: float):
    """``E + A·(C / reference)^(−α)`` (``A`` in the loss's units at ``C = reference``)."""
    return e + a * (np.asarray(compute, dtype=float) / reference) ** (-alpha)


def fit_power_law(compute: Sequence[float], loss: Sequence[float], what: str = "the fit",
                  weights: Optional[Sequence[float]] = None) -> dict:
    """``{"E", "A", "alpha", "reference", "residuals", "at_bound"}`` of the (weighted)
    least-squares fit of :func:`power_law` to ``(compute, loss)``; compute is scaled by its
    smallest value (``reference``) so the parameters are of order one. ``at_bound``: the
    parameters that ended at a bound, e.g. ``{"E": "E = 0"}``. Refused (``ValueError``
    naming ``what``) with fewer than :data:`MIN_POINTS` distinct compute values."""
    from scipy.optimize import OptimizeWarning, curve_fit
    c, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    if len(set(c.tolist())) < MIN_POINTS:
        raise ValueError(f"{what}: a power law needs at least {MIN_POINTS} levels/budgets of "
                         f"different compute, got {len(set(c.tolist()))}")
    reference = float(c.min())
    floor = float(y.min())
    sigma = None if weights is None else 1 / np.sqrt(np.asarray(weights, dtype=float))
    with warnings.catch_warnings():  # an exact fit (3 points) has no covariance: unused
        warnings.simplefilter("ignore", OptimizeWarning)
        params, _ = curve_fit(lambda x, e, a, alpha: power_law(x, e, a, alpha, reference), c,
                              y, p0=_start(c / reference, y, floor), sigma=sigma,
                              bounds=([0.0, 0.0, 0.0], [floor, np.inf, ALPHA_MAX]),
                              maxfev=20000)
    e, a, alpha = (float(p) for p in params)
    at_bound = {}
    tolerance = 1e-6 * max(1.0, floor)
    if e <= tolerance:
        at_bound["E"] = "E = 0"
    elif e >= floor - tolerance:
        at_bound["E"] = "E = min L"
    if alpha <= 1e-6:
        at_bound["alpha"] = "α = 0"
    elif alpha >= ALPHA_MAX - 1e-6:
        at_bound["alpha"] = f"α = {ALPHA_MAX:g}"
    if a <= 1e-9:
        at_bound["A"] = "A = 0"
    return {"E": e, "A": a, "alpha": alpha, "reference": reference, "at_bound": at_bound,
            "residuals": (y - power_law(c, e, a, alpha, reference)).tolist()}


def _start(x: np.ndarray, y: np.ndarray, floor: float) -> tuple[float, float, float]:
    """A starting point inside the bounds: over a grid of α, ``E`` and ``A`` by linear least
    squares (clipped to the bounds); the α with the smallest squared error."""
    alphas = np.linspace(0.02, 2.0, 100)[:, None]
    power = x[None, :] ** -alphas                                        # [grid, points]
    pc, yc = power - power.mean(1, keepdims=True), y - y.mean()
    a = np.maximum((pc * yc).sum(1) / (pc * pc).sum(1), 1e-9)
    e = np.clip(y.mean() - a * power.mean(1), 0.0, floor * (1 - 1e-9))
    best = int((((e[:, None] + a[:, None] * power) - y) ** 2).sum(1).argmin())
    return float(e[best]), float(a[best]), float(alphas[best, 0])


def predict(fit: dict, compute: float) -> float:
    return float(power_law(compute, fit["E"], fit["A"], fit["alpha"], fit["reference"]))


def _gradient(fit: dict, compute) -> np.ndarray:
    """``∂L/∂(E, A, α)`` at ``compute``: ``[points, 3]``."""
    x = np.asarray(compute, dtype=float) / fit["reference"]
    power = x ** -fit["alpha"]
    return np.stack([np.ones_like(x), power, -fit["A"] * power * np.log(x)], axis=-1)


def _sensitivity(fit: dict, compute: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``∂(E, A, α)/∂(level means)``: ``[3, levels]``, the weighted least-squares solution's
    linearisation."""
    j = _gradient(fit, compute)
    jw = j.T * weights
    return np.linalg.solve(jw @ j, jw)


def _pooled(points: dict, levels: list, arms: list, seeds: dict) -> tuple[np.ndarray, int]:
    """The arms' covariance of one seed's loss within a level, pooled over the levels
    (``[arms, arms]``), and its degrees of freedom."""
    total, dof = np.zeros((len(arms), len(arms))), 0
    for lv in levels:
        y = np.array([[points[lv]["loss"][arm][s] for s in seeds[lv]] for arm in arms])
        r = y - y.mean(1, keepdims=True)
        total += r @ r.T
        dof += len(seeds[lv]) - 1
    return (total / dof if dof else total), dof


class _Linear:
    """Intervals of quantities linear (or linearised) in the level means: a quantity is
    given by its weights ``h[arm]`` over the levels; its variance is
    ``Σ_l Σ_{a,b} h_a[l] h_b[l] Σ_ab / S_l``."""

    def __init__(self, arms: list, sizes: np.ndarray, covariance: np.ndarray, dof: int,
                 confidence: float):
        self.index = {arm: i for i, arm in enumerate(arms)}
        self.sizes, self.covariance, self.dof = sizes, covariance, dof
        self.quantile = (float(scipy_stats.t.ppf((1 + confidence) / 2, dof)) if dof
                         else None)

    def interval(self, value: float, weights: Optional[dict]) -> dict:
        if weights is None or self.quantile is None:
            return {"value": value, "low": None, "high": None}
        h = np.zeros((len(self.index), len(self.sizes)))
        for arm, w in weights.items():
            h[self.index[arm]] += w
        variance = float(np.einsum("al,ab,bl->", h, self.covariance, h / self.sizes))
        half = self.quantile * math.sqrt(max(variance, 0.0))
        return {"value": value, "low": value - half, "high": value + half}


def fit_arms(points: dict, control: str, target: float, confidence: float = 0.95) -> dict:
    """Every arm's law, the directly fitted gaps and the fixed-α sensitivity, with intervals.

    ``points``: ``{level: {"compute": C, "loss": {arm: {seed: loss}}}}`` (each level's final
    point; the seeds every arm has are used, paired). Returns ``{"arms": {arm: {"fit",
    "alpha", "E", "at_target", "gap_at_target" (not the control)}}, "gaps": {arm: {"fit",
    "slope", "at_target"}}, "fixed_alpha": {"alpha", "arms": {arm: {"at_target",
    "gap_at_target"}}}, "levels", "dof", "extrapolated", "why_not"}``; each interval is
    ``{"value", "low", "high"}`` (None bounds: no interval, ``why_not`` or a bound says
    why). Refused (``ValueError``) with fewer than :data:`MIN_POINTS` levels."""
    levels = sorted(points, key=lambda level: points[level]["compute"])
    arms = list(points[levels[0]]["loss"])
    compute = np.array([points[lv]["compute"] for lv in levels])
    seeds = {lv: sorted(set.intersection(*(set(points[lv]["loss"][arm]) for arm in arms)))
             for lv in levels}
    sizes = np.array([len(seeds[lv]) for lv in levels], dtype=float)
    means = {arm: np.array([np.mean([points[lv]["loss"][arm][s] for s in seeds[lv]])
                            for lv in levels]) for arm in arms}
    fits = {arm: fit_power_law(compute, means[arm], f"arm {arm}", sizes) for arm in arms}
    covariance, dof = _pooled(points, levels, arms, seeds)
    linear = _Linear(arms, sizes, covariance, dof, confidence)
    distinct = len(set(compute.tolist()))
    why_not = None
    if distinct < MIN_EXTRAPOLATION:
        why_not = (f"{distinct} compute levels: an extrapolation needs at least "
                   f"{MIN_EXTRAPOLATION} (2 degrees of freedom beyond the law's 3 parameters)")
    elif not dof:
        why_not = "one seed per level: no seed spread to estimate the intervals from"
    extrapolated = why_not is None

    def law_weights(arm: str, grad: np.ndarray) -> Optional[dict]:
        if not extrapolated or fits[arm]["at_bound"]:
            return None
        return {arm: grad @ _sensitivity(fits[arm], compute, sizes)}

    out = {"arms": {}, "levels": distinct, "dof": dof, "extrapolated": extrapolated,
           "why_not": why_not}
    unit = np.eye(3)
    for arm in arms:
        f = fits[arm]
        at = law_weights(arm, _gradient(f, target))
        entry = {"fit": f,
                 "alpha": linear.interval(f["alpha"], law_weights(arm, unit[2])),
                 "E": linear.interval(f["E"], law_weights(arm, unit[0])),
                 "at_target": linear.interval(predict(f, target), at) if extrapolated
                 else None}
        if arm != control:
            mine = law_weights(control, _gradient(fits[control], target))
            gap = None if at is None or mine is None else {arm: at[arm], control: -mine[control]}
            entry["gap_at_target"] = (linear.interval(predict(f, target)
                                                      - predict(fits[control], target), gap)
                                      if extrapolated else None)
        out["arms"][arm] = entry
    out["gaps"] = {arm: _direct_gap(compute, means[arm] - means[control], sizes, linear, arm,
                                    control, target, extrapolated)
                   for arm in arms if arm != control}
    out["fixed_alpha"] = _fixed_alpha(compute, means, sizes, linear, control,
                                      fits[control]["alpha"], target, extrapolated)
    return out


def _linear_fit(design: np.ndarray, y: np.ndarray, sizes: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Weighted least squares: ``(coefficients, ∂coefficients/∂y)``."""
    xw = design.T * sizes
    solve = np.linalg.solve(xw @ design, xw)
    return solve @ y, solve


def _direct_gap(compute: np.ndarray, gap: np.ndarray, sizes: np.ndarray, linear: _Linear,
                arm: str, control: str, target: float, extrapolated: bool) -> dict:
    """``g(C) = g₀ + g₁·log₁₀(C/C₀)`` fitted to the level means of the paired gap: the slope
    (per decade of compute) and, when extrapolated, the value at ``target``."""
    reference = float(compute.min())
    design = np.stack([np.ones_like(compute), np.log10(compute / reference)], axis=1)
    (g0, g1), solve = _linear_fit(design, gap, sizes)
    paired = lambda w: {arm: w, control: -w}  # noqa: E731
    x_target = np.array([1.0, math.log10(target / reference)])
    return {"fit": {"g0": float(g0), "g1": float(g1), "reference": reference,
                    "residuals": (gap - design @ np.array([g0, g1])).tolist()},
            "slope": linear.interval(float(g1), paired(solve[1])),
            "at_target": linear.interval(float(x_target @ [g0, g1]), paired(x_target @ solve))
            if extrapolated else None}


def _fixed_alpha(compute: np.ndarray, means: dict, sizes: np.ndarray, linear: _Linear,
                 control: str, alpha: float, target: float, extrapolated: bool) -> dict:
    """Every arm's ``E + A·(C/C₀)^(−α)`` with ``α`` fixed at the control's fitted value (the
    anchor), ``E`` and ``A`` by linear least squares: the extrapolation if the arms shared
    the control's exponent (its interval holds ``α`` fixed)."""
    reference = float(compute.min())
    design = np.stack([np.ones_like(compute), (compute / reference) ** -alpha], axis=1)
    x_target = np.array([1.0, (target / reference) ** -alpha])
    weights, values = {}, {}
    for arm, y in means.items():
        coefficients, solve = _linear_fit(design, y, sizes)
        weights[arm], values[arm] = x_target @ solve, float(x_target @ coefficients)
    out = {"alpha": alpha, "arms": {}}
    for arm in means:
        entry = {"at_target": linear.interval(values[arm], {arm: weights[arm]})
                 if extrapolated else None}
        if arm != control:
            entry["gap_at_target"] = (linear.interval(
                values[arm] - values[control], {arm: weights[arm], control: -weights[control]})
                if extrapolated else None)
        out["arms"][arm] = entry
    return out


def orders_of_magnitude(largest: float, target: float) -> float:
    """How far ``target`` compute lies beyond the ``largest`` fitted, in powers of ten."""
    return math.log10(target / largest)
