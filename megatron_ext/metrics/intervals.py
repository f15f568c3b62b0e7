"""The Student-t interval of a mean, shared by the probes (over probe seeds) and the study
(over training seeds, :mod:`megatron_ext.study.stats`); its coverage is measured by
simulation in :mod:`megatron_ext.study.calibration`."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
from scipy import stats as scipy_stats


def t_interval(values: Sequence[float], confidence: float = 0.95) -> dict:
    """``{"mean", "n", "low", "high", "half_width", "p"}``: the mean of ``values`` with a
    Student-t interval over them (n-1 degrees of freedom) and the two-sided p-value of a
    mean of 0. With one value the interval and p are unavailable (None), never zero-width;
    with no spread (:func:`no_spread`), p is None."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        raise ValueError("no values")
    mean = float(x.mean())
    if n < 2:
        return {"mean": mean, "n": n, "low": None, "high": None, "half_width": None,
                "p": None}
    se = float(x.std(ddof=1)) / math.sqrt(n)
    half = float(scipy_stats.t.ppf((1 + confidence) / 2, n - 1)) * se
    return {"mean": mean, "n": n, "low": mean - half, "high": mean + half, "half_width": half,
            "p": two_sided_p(mean, se, n - 1)}


# A standard error at most this share of the mean's size (or of 1, for a smaller mean) is
# rounding: float64 differences of values of order 1 carry errors near 1e-15.
NO_SPREAD = 1e-10


def no_spread(se: float, mean: float) -> bool:
    """Whether a standard error is 0 or at the level of rounding (:data:`NO_SPREAD`): the
    values measured no spread, so no p-value or power can be computed from them."""
    return se <= NO_SPREAD * max(abs(mean), 1.0)


def two_sided_p(mean: float, se: float, dof: float) -> Optional[float]:
    """The two-sided p-value of a mean of 0 with standard error ``se``; None where the
    values measured no spread (:func:`no_spread`): not 0, which a multiple-comparison
    adjustment would count as significant, nor 1."""
    if no_spread(se, mean):
        return None
    return float(2 * scipy_stats.t.sf(abs(mean) / se, dof))
