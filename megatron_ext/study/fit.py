"""The scaling fit of a study with factors: a saturating power law of the held-out loss,
fitted per arm (scipy, bounded), either in training compute, ``L(C) = E + A·(C/C₀)^(−α)``,
or, where a study varies both model size and token budget, in both (Chinchilla's form),
``L(N, D) = E + A·(N/N₀)^(−α) + B·(D/D₀)^(−β)`` (:mod:`.scaling` chooses and feeds the
points); beside it the gap to the control fitted directly, linear in the logarithms
(``g₀ + g₁·log₁₀(C/C₀)``, or ``g₀ + g_N·log₁₀(N/N₀) + g_D·log₁₀(D/D₀)``), and a sensitivity
fit with every arm's exponents fixed at the control's (the anchor). Pure functions of
numbers; a law has one term (``A``, ``α``) per axis of its points.

Intervals (95%, Student-t) come from the seeds' spread within each level, pooled over the
levels (``Σ(S_l − 1)`` degrees of freedom; the arms' covariance too, so gaps stay paired by
seed), carried through the fit by its linearisation (the delta method). Rules, each
stated in the report where it applies:

- a law is fitted with at least :data:`MIN_POINTS` distinct values on each axis (and one
  distinct point per parameter), but extrapolated (and given intervals) only with 2
  degrees of freedom beyond its parameters: in compute, :data:`MIN_EXTRAPOLATION` levels
  (3 parameters: with 3 levels it passes through every point, at a bound or not); in
  ``(N, D)``, 7 distinct points (5 parameters) and at least :data:`MIN_AXIS_EXTRAPOLATION`
  sizes and as many budgets, so that each term keeps a degree of freedom of its own (with 3
  sizes the size term passes exactly through their mean losses whatever the budgets: the
  3-level failure again, on one axis);
- ``E`` is bounded to ``[0, min(L)]``, each exponent to ``[0, 3]`` and each amplitude to
  ``≥ 0``: a parameter that ends at a bound is flagged beside its value, and that arm's
  parameters and extrapolation get no interval (the linearisation does not hold there),
  never a zero-width one;
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
MIN_AXIS_EXTRAPOLATION = 4
ALPHA_MAX = 3.0
# each term's amplitude and exponent, in the order of the axes (compute; or N, then D)
AMPLITUDES, EXPONENTS = ("A", "B"), ("alpha", "beta")
SYMBOLS = {"alpha": "α", "beta": "β"}


def power_law(compute, e: float, a: float, alpha: float, reference: float):
    """``E + A·(C / reference)^(−α)`` (``A`` in the loss's units at ``C = reference``)."""
    return e + a * (np.asarray(compute, dtype=float) / reference) ** (-alpha)


def saturating_law(x: np.ndarray, params, reference: np.ndarray) -> np.ndarray:
    """``E + Σ_k A_k·(x_k / reference_k)^(−α_k)`` at the points ``x`` (``[points, axes]``;
    ``params``: ``E, A₁, α₁, A₂, α₂...``)."""
    p = np.asarray(params, dtype=float)
    return p[0] + ((x / reference) ** -p[2::2]) @ p[1::2]


def _as_points(x) -> np.ndarray:
    """``[points, axes]``: a sequence of compute values is one axis."""
    x = np.asarray(x, dtype=float)
    return x.reshape(-1, 1) if x.ndim < 2 else x


def _distinct(x: np.ndarray) -> tuple[int, list[int]]:
    """Distinct points, and distinct values on each axis."""
    return (len({tuple(row) for row in x.tolist()}),
            [len(set(column.tolist())) for column in x.T])


def fit_power_law(x, loss: Sequence[float], what: str = "the fit",
                  weights: Optional[Sequence[float]] = None) -> dict:
    """``{"E", "A", "alpha"[, "B", "beta"], "reference", "at_bound", "residuals"}`` of the
    (weighted) least-squares fit of the law to ``(x, loss)``: ``x`` a sequence of compute
    values (one term), or ``[points, 2]`` of ``(N, D)`` (two terms). Each axis is scaled by
    its smallest value (``reference``, one per axis) so the parameters are of order one.
    ``at_bound``: the parameters that ended at a bound, e.g. ``{"E": "E = 0"}``. Refused
    (``ValueError`` naming ``what``) with too few distinct points (:data:`MIN_POINTS`)."""
    from scipy.optimize import OptimizeWarning, curve_fit
    x, y = _as_points(x), np.asarray(loss, dtype=float)
    terms = x.shape[1]
    points, values = _distinct(x)
    if terms == 1 and points < MIN_POINTS:
        raise ValueError(f"{what}: a power law needs at least {MIN_POINTS} levels/budgets of "
                         f"different compute, got {points}")
    if terms > 1 and (min(values) < MIN_POINTS or points < 1 + 2 * terms):
        raise ValueError(f"{what}: the law L(N, D) needs at least {MIN_POINTS} sizes and "
                         f"{MIN_POINTS} budgets ({1 + 2 * terms} distinct points), got "
                         f"{values[0]} sizes and {values[1]} budgets")
    reference = x.min(0)
    floor = float(y.min())
    sigma = None if weights is None else 1 / np.sqrt(np.asarray(weights, dtype=float))
    with warnings.catch_warnings():  # an exact fit (3 points) has no covariance: unused
        warnings.simplefilter("ignore", OptimizeWarning)
        params, _ = curve_fit(lambda at, *p: saturating_law(at, p, reference), x, y,
                              p0=_start(x / reference, y, floor), sigma=sigma,
                              bounds=([0.0] * (1 + 2 * terms),
                                      [floor] + [np.inf, ALPHA_MAX] * terms),
                              maxfev=20000)
    e = float(params[0])
    out = {"E": e}
    at_bound = {}
    tolerance = 1e-6 * max(1.0, floor)
    if e <= tolerance:
        at_bound["E"] = "E = 0"
    elif e >= floor - tolerance:
        at_bound["E"] = "E = min L"
    for amplitude, exponent, a, alpha in zip(AMPLITUDES, EXPONENTS, params[1::2],
                                             params[2::2]):
        out[amplitude], out[exponent] = float(a), float(alpha)
        if alpha <= 1e-6:
            at_bound[exponent] = f"{SYMBOLS[exponent]} = 0"
        elif alpha >= ALPHA_MAX - 1e-6:
            at_bound[exponent] = f"{SYMBOLS[exponent]} = {ALPHA_MAX:g}"
        if a <= 1e-9:
            at_bound[amplitude] = f"{amplitude} = 0"
    return {**out, "reference": reference.tolist(), "at_bound": at_bound,
            "residuals": (y - saturating_law(x, params, reference)).tolist()}


def _start(x: np.ndarray, y: np.ndarray, floor: float) -> tuple[float, ...]:
    """A starting point inside the bounds: over a grid of exponents (one per axis of the
    scaled points ``x``), ``E`` and the amplitudes by linear least squares (clipped to the
    bounds); the exponents with the smallest squared error."""
    terms = x.shape[1]
    grid = np.linspace(0.02, 2.0, 100 if terms == 1 else 20)
    alphas = np.stack(np.meshgrid(*[grid] * terms, indexing="ij"), -1).reshape(-1, terms)
    power = x[None] ** -alphas[:, None, :]                           # [grid, points, axes]
    pc, yc = power - power.mean(1, keepdims=True), y - y.mean()
    gram = np.einsum("gpk,gpj->gkj", pc, pc)
    gram += 1e-12 * np.trace(gram, axis1=1, axis2=2)[:, None, None] * np.eye(terms)
    a = np.maximum(np.linalg.solve(gram, np.einsum("gpk,p->gk", pc, yc)[..., None])[..., 0],
                   1e-9)
    e = np.clip(y.mean() - (a * power.mean(1)).sum(1), 0.0, floor * (1 - 1e-9))
    error = ((e[:, None] + np.einsum("gpk,gk->gp", power, a) - y) ** 2).sum(1)
    best = int(error.argmin())
    return (float(e[best]), *(float(v) for pair in zip(a[best], alphas[best]) for v in pair))


def _params(fit: dict) -> list[float]:
    """``E, A, α[, B, β]``: the order of :func:`_law`'s parameters."""
    terms = len(fit["reference"])
    return [fit["E"], *(fit[name] for pair in zip(AMPLITUDES[:terms], EXPONENTS[:terms])
                        for name in pair)]


def law_values(fit: dict, x) -> np.ndarray:
    """The fitted law at the points ``x`` (compute values, or ``[points, 2]`` of (N, D))."""
    reference = np.asarray(fit["reference"])
    return saturating_law(_as_points(x).reshape(-1, len(reference)), _params(fit), reference)


def predict(fit: dict, point) -> float:
    """The fitted law at one point (a compute value, or ``(N, D)``)."""
    return float(law_values(fit, point)[0])


def _gradient(fit: dict, x) -> np.ndarray:
    """``∂L/∂(E, A, α[, B, β])`` at the points ``x``: ``[points, parameters]``."""
    reference = np.asarray(fit["reference"])
    x = _as_points(x).reshape(-1, len(reference)) / reference
    columns = [np.ones(len(x))]
    for amplitude, exponent, axis in zip(AMPLITUDES, EXPONENTS, x.T):
        power = axis ** -fit[exponent]
        columns += [power, -fit[amplitude] * power * np.log(axis)]
    return np.stack(columns, axis=-1)


def _sensitivity(fit: dict, x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``∂(parameters)/∂(level means)``: ``[parameters, levels]``, the weighted
    least-squares solution's linearisation."""
    j = _gradient(fit, x)
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
        variance = max(float(np.einsum("al,ab,bl->", h, self.covariance, h / self.sizes)), 0.0)
        half = self.quantile * math.sqrt(variance)
        return {"value": value, "low": value - half, "high": value + half,
                "variance": variance, "dof": self.dof, "seeds": int(self.sizes.min())}


def fit_arms(points: dict, control: str, target, confidence: float = 0.95,
             axes: Sequence[str] = ("compute",)) -> dict:
    """Every arm's law, the directly fitted gaps and the fixed-exponent sensitivity, with
    intervals.

    ``points``: ``{level: {axis: value for each of axes, "loss": {arm: {seed: loss}}}}``
    (each level's final point; the seeds every arm has are used, paired); ``axes``:
    ``("compute",)`` for the law in compute, ``("N", "D")`` for the law in parameters and
    tokens; ``target``: the point extrapolated to (a value per axis). Returns ``{"arms":
    {arm: {"fit", "E", "alpha"[, "beta"], "at_target", "gap_at_target" (not the
    control)}}, "gaps": {arm: {"fit", "slopes" (one per axis), "at_target"}},
    "fixed_alpha": {"alpha"[, "beta"], "arms": {arm: {"at_target", "gap_at_target"}}},
    "axes", "levels" (distinct points), "values" (distinct values per axis), "dof",
    "extrapolated", "why_not"}``; each interval is ``{"value", "low", "high"}`` (None bounds:
    no interval, ``why_not`` or a bound says why), with the estimate's ``variance``, the
    ``dof`` and ``seeds`` (the fewest of a level) that :mod:`.power` reads. Refused (``ValueError``) with too few
    distinct points (:func:`fit_power_law`)."""
    place = lambda level: tuple(points[level][axis] for axis in axes)  # noqa: E731
    levels = sorted(points, key=place)
    arms = list(points[levels[0]]["loss"])
    x = np.array([place(lv) for lv in levels], dtype=float)
    target = np.asarray(target, dtype=float).reshape(1, len(axes))
    seeds = {lv: sorted(set.intersection(*(set(points[lv]["loss"][arm]) for arm in arms)))
             for lv in levels}
    sizes = np.array([len(seeds[lv]) for lv in levels], dtype=float)
    means = {arm: np.array([np.mean([points[lv]["loss"][arm][s] for s in seeds[lv]])
                            for lv in levels]) for arm in arms}
    fits = {arm: fit_power_law(x, means[arm], f"arm {arm}", sizes) for arm in arms}
    covariance, dof = _pooled(points, levels, arms, seeds)
    linear = _Linear(arms, sizes, covariance, dof, confidence)
    distinct, values = _distinct(x)
    why_not = _why_not_extrapolated(distinct, values, dof)
    extrapolated = why_not is None

    def law_weights(arm: str, grad: np.ndarray) -> Optional[dict]:
        if not extrapolated or fits[arm]["at_bound"]:
            return None
        return {arm: grad @ _sensitivity(fits[arm], x, sizes)}

    out = {"arms": {}, "axes": list(axes), "levels": distinct, "values": values, "dof": dof,
           "extrapolated": extrapolated, "why_not": why_not}
    unit = np.eye(1 + 2 * len(axes))
    for arm in arms:
        f = fits[arm]
        at = law_weights(arm, _gradient(f, target)[0])
        entry = {"fit": f, "E": linear.interval(f["E"], law_weights(arm, unit[0])),
                 **{exponent: linear.interval(f[exponent], law_weights(arm, unit[2 + 2 * i]))
                    for i, exponent in enumerate(EXPONENTS[:len(axes)])},
                 "at_target": linear.interval(predict(f, target), at) if extrapolated
                 else None}
        if arm != control:
            mine = law_weights(control, _gradient(fits[control], target)[0])
            gap = None if at is None or mine is None else {arm: at[arm], control: -mine[control]}
            entry["gap_at_target"] = (linear.interval(predict(f, target)
                                                      - predict(fits[control], target), gap)
                                      if extrapolated else None)
        out["arms"][arm] = entry
    out["gaps"] = {arm: _direct_gap(x, means[arm] - means[control], sizes, linear, arm,
                                    control, target, extrapolated)
                   for arm in arms if arm != control}
    out["fixed_alpha"] = _fixed_alpha(x, means, sizes, linear, control, fits[control], target,
                                      extrapolated)
    return out


def _why_not_extrapolated(distinct: int, values: list[int], dof: int) -> Optional[str]:
    """Why a law fitted to ``distinct`` points (``values`` distinct values per axis) is not
    extrapolated, or None."""
    if len(values) == 1 and distinct < MIN_EXTRAPOLATION:
        return (f"{distinct} compute levels: an extrapolation needs at least "
                f"{MIN_EXTRAPOLATION} (2 degrees of freedom beyond the law's 3 parameters)")
    parameters = 1 + 2 * len(values)
    if len(values) > 1 and distinct < parameters + 2:
        return (f"{distinct} (N, D) points: an extrapolation needs at least {parameters + 2} "
                f"(2 degrees of freedom beyond the law's {parameters} parameters)")
    if len(values) > 1 and min(values) < MIN_AXIS_EXTRAPOLATION:
        return (f"{values[0]} sizes and {values[1]} budgets: an extrapolation needs at least "
                f"{MIN_AXIS_EXTRAPOLATION} of each (with 3, that term of the law passes "
                f"exactly through their mean losses)")
    if not dof:
        return "one seed per level: no seed spread to estimate the intervals from"
    return None


def _linear_fit(design: np.ndarray, y: np.ndarray, sizes: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Weighted least squares: ``(coefficients, ∂coefficients/∂y)``."""
    xw = design.T * sizes
    solve = np.linalg.solve(xw @ design, xw)
    return solve @ y, solve


def _direct_gap(x: np.ndarray, gap: np.ndarray, sizes: np.ndarray, linear: _Linear,
                arm: str, control: str, target: np.ndarray, extrapolated: bool) -> dict:
    """``g = g₀ + Σ_k g_k·log₁₀(x_k/x_k,0)`` fitted to the level means of the paired gap:
    the slopes (per decade of each axis) and, when extrapolated, the value at ``target``."""
    reference = x.min(0)
    design = np.column_stack([np.ones(len(x)), np.log10(x / reference)])
    coefficients, solve = _linear_fit(design, gap, sizes)
    paired = lambda w: {arm: w, control: -w}  # noqa: E731
    x_target = np.concatenate([[1.0], np.log10(target[0] / reference)])
    return {"fit": {"g0": float(coefficients[0]), "slopes": coefficients[1:].tolist(),
                    "reference": reference.tolist(),
                    "residuals": (gap - design @ coefficients).tolist()},
            "slopes": [linear.interval(float(c), paired(solve[1 + i]))
                       for i, c in enumerate(coefficients[1:])],
            "at_target": linear.interval(float(x_target @ coefficients),
                                         paired(x_target @ solve)) if extrapolated else None}


def _fixed_alpha(x: np.ndarray, means: dict, sizes: np.ndarray, linear: _Linear,
                 control: str, anchor: dict, target: np.ndarray, extrapolated: bool) -> dict:
    """Every arm's law with its exponents fixed at the control's fitted ones (``anchor``,
    its fit), ``E`` and the amplitudes by linear least squares: the extrapolation if the
    arms shared the control's exponents (its interval holds them fixed)."""
    reference = x.min(0)
    names = EXPONENTS[:x.shape[1]]
    exponents = np.array([anchor[name] for name in names])
    design = np.column_stack([np.ones(len(x)), (x / reference) ** -exponents])
    x_target = np.concatenate([[1.0], (target[0] / reference) ** -exponents])
    weights, values = {}, {}
    for arm, y in means.items():
        coefficients, solve = _linear_fit(design, y, sizes)
        weights[arm], values[arm] = x_target @ solve, float(x_target @ coefficients)
    out = {**{name: anchor[name] for name in names}, "arms": {}}
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
