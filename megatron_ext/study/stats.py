"""The statistics of a study: means across seeds with Student-t intervals, differences
against the control paired by seed, and a paired bootstrap over the items of a downstream
task. Pure functions of numbers; intervals are 95% unless asked otherwise."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
from scipy import stats as scipy_stats


def t_interval(values: Sequence[float], confidence: float = 0.95) -> dict:
    """``{"mean", "n", "low", "high", "half_width"}``: the mean of ``values`` with a
    Student-t interval over them (n-1 degrees of freedom). With one value the interval is
    unavailable (None), never zero-width."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        raise ValueError("no values")
    mean = float(x.mean())
    if n < 2:
        return {"mean": mean, "n": n, "low": None, "high": None, "half_width": None}
    half = float(scipy_stats.t.ppf((1 + confidence) / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return {"mean": mean, "n": n, "low": mean - half, "high": mean + half, "half_width": half}


def paired_difference(arm: dict, control: dict, confidence: float = 0.95) -> Optional[dict]:
    """``arm - control`` over the seeds both have (``{seed: value}``), with the t interval
    of the per-seed differences; None when they share no seed."""
    seeds = sorted(set(arm) & set(control))
    if not seeds:
        return None
    out = t_interval([arm[s] - control[s] for s in seeds], confidence)
    out["seeds"] = seeds
    return out


def paired_bootstrap(arm: Sequence[float], control: Sequence[float], iterations: int = 10000,
                     seed: int = 0, confidence: float = 0.95) -> dict:
    """Mean of ``arm - control`` over paired items (e.g. per-item accuracy, averaged over
    seeds) with a percentile bootstrap interval from resampling the items."""
    a, c = np.asarray(arm, dtype=float), np.asarray(control, dtype=float)
    if a.shape != c.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"paired items must be two equal-length lists, got {a.shape} and "
                         f"{c.shape}")
    diff = a - c
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(iterations, len(diff)))].mean(axis=1)
    tail = (1 - confidence) / 2
    return {"mean": float(diff.mean()), "n": len(diff),
            "low": float(np.quantile(means, tail)), "high": float(np.quantile(means, 1 - tail))}
