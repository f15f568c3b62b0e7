"""The Student-t interval of a mean, shared by the probes (over probe seeds) and the study
(over training seeds, :mod:`megatron_ext.study.stats`); its coverage is measured by
simulation in :mod:`megatron_ext.study.calibration`."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import stats as scipy_stats


def t_interval(values: Sequence[float], confidence: float = 0.95) -> dict:
    """``{"mean", "n", "low", "high", "half_width", "p"}``: the mean of ``values`` with a
    Student-t interval over them (n-1 degrees of freedom) and the two-sided p-value of a
    mean of 0. With one value the interval and p are unavailable (None), never zero-width."""
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


def two_sided_p(mean: float, se: float, dof: float) -> float:
    """The two-sided p-value of a mean of 0 with standard error ``se``."""
    if se == 0:
        return 1.0 if mean == 0 else 0.0
    return float(2 * scipy_stats.t.sf(abs(mean) / se, dof))
