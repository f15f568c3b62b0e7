"""The scaling fit of a study with factors: a saturating power law ``L(C) = E + A·C^(−α)``
of the held-out loss against training compute, fitted per arm (scipy, bounded), with 95%
intervals on ``α``, ``E`` and the extrapolated gap from a bootstrap over the seeds. Pure
functions of numbers; :mod:`.scaling` feeds them a study's points.

A fit needs at least 3 distinct compute values (levels or budgets): with 3 it passes
through them exactly (3 parameters), so its residuals are 0 and only the bootstrap says how
unsure it is. ``E`` is bounded to ``[0, min(L)]`` (the loss it saturates at lies below every
observed loss) and ``α`` to ``[0, 3]``.
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np

MIN_POINTS = 3


def power_law(compute, e: float, a: float, alpha: float, reference: float):
    """``E + A·(C / reference)^(−α)`` (``A`` in the loss's units at ``C = reference``)."""
    return e + a * (np.asarray(compute, dtype=float) / reference) ** (-alpha)


def fit_power_law(compute: Sequence[float], loss: Sequence[float], what: str = "the fit"
                  ) -> dict:
    """``{"E", "A", "alpha", "reference", "residuals"}`` of the least-squares fit of
    :func:`power_law` to ``(compute, loss)``; compute is scaled by its smallest value
    (``reference``) so the parameters are of order one. Refused (``ValueError`` naming
    ``what``) with fewer than :data:`MIN_POINTS` distinct compute values."""
    from scipy.optimize import OptimizeWarning, curve_fit
    c, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    if len(set(c.tolist())) < MIN_POINTS:
        raise ValueError(f"{what}: a power law needs at least {MIN_POINTS} levels/budgets of "
                         f"different compute, got {len(set(c.tolist()))}")
    reference = float(c.min())
    floor = float(y.min())
    with warnings.catch_warnings():  # an exact fit (3 points) has no covariance: unused
        warnings.simplefilter("ignore", OptimizeWarning)
        params, _ = curve_fit(lambda x, e, a, alpha: power_law(x, e, a, alpha, reference), c,
                              y, p0=_start(c / reference, y, floor),
                              bounds=([0.0, 0.0, 0.0], [floor, np.inf, 3.0]), maxfev=20000)
    e, a, alpha = (float(p) for p in params)
    return {"E": e, "A": a, "alpha": alpha, "reference": reference,
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


def bootstrap_fits(points: dict, control: str, target: float, iterations: int = 400,
                   seed: int = 0, confidence: float = 0.95) -> dict:
    """Fits of every arm with bootstrap intervals over the seeds.

    ``points``: ``{level: {"compute": C, "loss": {arm: {seed: loss}}}}`` (each level's final
    point). Each draw resamples, independently per level, that level's seeds with
    replacement (the same draw for every arm, so differences stay paired by seed), fits
    every arm to the mean losses, and extrapolates to ``target`` compute (no draws, and no
intervals, when a level has one seed). Returns ``{arm:
    {"fit", "alpha", "E", "at_target", "gap_at_target" (not the control)}}``, each interval
    ``{"mean"|"value", "low", "high"}`` (percentiles over the draws that converged) and
    ``"draws"``, the number of those."""
    levels = sorted(points, key=lambda level: points[level]["compute"])
    arms = list(points[levels[0]]["loss"])
    compute = [points[level]["compute"] for level in levels]

    def fits(draw: dict) -> dict:
        return {arm: fit_power_law(compute, [np.mean([points[lv]["loss"][arm][s]
                                                      for s in draw[lv]]) for lv in levels],
                                   f"arm {arm}")
                for arm in arms}

    seeds = {lv: sorted(set.intersection(*(set(points[lv]["loss"][arm]) for arm in arms)))
             for lv in levels}
    point = fits(seeds)
    rng = np.random.default_rng(seed)
    drawn = []
    # a level of one seed has no seed spread to resample: no interval at all, never a
    # zero-width one
    for _ in range(iterations if min(len(s) for s in seeds.values()) > 1 else 0):
        draw = {lv: list(rng.choice(seeds[lv], size=len(seeds[lv]))) for lv in levels}
        try:
            drawn.append(fits(draw))
        except RuntimeError:  # curve_fit did not converge on this draw
            continue
    tail = 100 * (1 - confidence) / 2

    def interval(value: float, values: list) -> dict:
        low, high = (np.percentile(values, [tail, 100 - tail]).tolist() if len(values) > 1
                     else (None, None))
        return {"value": value, "low": low, "high": high}

    out = {}
    for arm in arms:
        at = lambda f: predict(f[arm], target)  # noqa: E731
        gap = lambda f: predict(f[arm], target) - predict(f[control], target)  # noqa: E731
        out[arm] = {"fit": point[arm],
                    "alpha": interval(point[arm]["alpha"], [f[arm]["alpha"] for f in drawn]),
                    "E": interval(point[arm]["E"], [f[arm]["E"] for f in drawn]),
                    "at_target": interval(at(point), [at(f) for f in drawn]),
                    "draws": len(drawn)}
        if arm != control:
            out[arm]["gap_at_target"] = interval(gap(point), [gap(f) for f in drawn])
    return out


def orders_of_magnitude(largest: float, target: float) -> float:
    """How far ``target`` compute lies beyond the ``largest`` fitted, in powers of ten."""
    return math.log10(target / largest)
