"""The statistics of a study: means across seeds with Student-t intervals, differences
between arms paired by seed, and a hierarchical bootstrap over the seeds and then the items
of a downstream task. Pure functions of numbers; intervals are 95% unless asked otherwise."""

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


def hierarchical_bootstrap(arm: Sequence[Sequence[float]], control: Sequence[Sequence[float]],
                           iterations: int = 2000, seed: int = 0,
                           confidence: float = 0.95) -> dict:
    """Mean of ``arm - control`` over paired seeds and items (``[seeds, items]`` scores, the
    same seeds and items on both sides) with a percentile interval from resampling the
    seeds, then the items (the same item draw for every drawn seed: the items are crossed
    with the seeds, not nested in them). Both sources of variance are in the interval: a
    resampling of the items alone would ignore the spread between seeds.

    With one seed, only the items are resampled: the interval is then conditional on that
    run (``"conditional": True``), an interval for these two trained models, not for the
    arms. With few seeds the seed level is undercovered when the seed spread dominates (a
    bootstrap of 3 values); the by-seed t interval stands beside it for that case."""
    a, c = np.asarray(arm, dtype=float), np.asarray(control, dtype=float)
    if a.shape != c.shape or a.ndim != 2 or 0 in a.shape:
        raise ValueError(f"paired scores must be two [seeds, items] arrays of one shape, got "
                         f"{a.shape} and {c.shape}")
    diff = a - c
    seeds, items = diff.shape
    rng = np.random.default_rng(seed)
    means = np.empty(iterations)
    for start in range(0, iterations, 256):  # vectorised in chunks of draws
        b = min(256, iterations - start)
        drawn = diff[rng.integers(0, seeds, size=(b, seeds))]         # [b, seeds, items]
        picked = rng.integers(0, items, size=(b, 1, items))
        means[start:start + b] = np.take_along_axis(
            drawn, np.broadcast_to(picked, drawn.shape), axis=2).mean(axis=(1, 2))
    tail = (1 - confidence) / 2
    return {"mean": float(diff.mean()), "seeds": seeds, "n": items,
            "conditional": seeds == 1,
            "low": float(np.quantile(means, tail)), "high": float(np.quantile(means, 1 - tail))}
