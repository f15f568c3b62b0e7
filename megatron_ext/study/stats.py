"""The statistics of a study: means across seeds with Student-t intervals, differences
between arms paired by seed (with their two-sided p-value), the crossed seeds x items
interval of a downstream task, and Holm's adjustment of a family of p-values. Pure
functions of numbers; intervals are 95% unless asked otherwise. Their coverage is measured
by simulation in :mod:`.calibration`. The t interval itself is
:mod:`megatron_ext.metrics.intervals`' (the probes use it too)."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
from scipy import stats as scipy_stats
from scipy.optimize import brentq

from ..metrics.intervals import no_spread, t_interval
from ..runtime.errors import StudyError


def paired_difference(arm: dict, control: dict, confidence: float = 0.95) -> Optional[dict]:
    """``arm - control`` over the seeds both have (``{seed: value}``), with the t interval
    of the per-seed differences; None when they share no seed. Seeds only one side has are
    listed under ``dropped`` (absent when none is); a missing or non-finite value is
    refused naming its seed."""
    for side in (arm, control):
        bad = next((s for s, v in side.items() if v is None or not math.isfinite(v)), None)
        if bad is not None:
            raise StudyError(f"seed {bad}: {side[bad]!r}: a paired difference cannot take a "
                             f"missing or non-finite value")
    seeds = sorted(set(arm) & set(control))
    if not seeds:
        return None
    out = t_interval([arm[s] - control[s] for s in seeds], confidence)
    out["seeds"] = seeds
    dropped = sorted(set(arm) ^ set(control))
    if dropped:
        out["dropped"] = dropped
    return out


def crossed_interval(arm: Sequence[Sequence[float]], control: Sequence[Sequence[float]],
                     confidence: float = 0.95) -> dict:
    """Mean of ``arm - control`` over paired seeds and items (``[seeds, items]`` scores, the
    same seeds and items on both sides) with an interval for the arms' difference on the
    task's population of items: seeds and items are two crossed random factors, and each
    source of variance is counted once.

    The variance of the grand mean is the by-seed part (the variance of the per-seed means
    over ``S``: the seeds' spread and the items' noise within a run, ``S − 1`` degrees of
    freedom) plus the items' own part (``max(MS_items − MS_residual, 0) / (S·I)``: how much
    the arms' difference varies from item to item, ``I − 1`` degrees of freedom). The half
    width adds the two in quadrature, each with its own t quantile: with no item part it
    is the by-seed t interval. (A bootstrap of the seeds, then the items, counts the items'
    noise twice: once inside each seed's mean, once again.)

    With one seed only the items vary: a t interval over the items' differences,
    conditional on that run (``"conditional": True``): an interval for these two trained
    models, not for the arms. With two seeds or more, ``variance_parts`` holds the by-seed
    and the items' parts ``[variance, degrees of freedom]`` (the items' None with one item),
    from which :mod:`.power` reads what the design detects."""
    a, c = np.asarray(arm, dtype=float), np.asarray(control, dtype=float)
    if a.shape != c.shape or a.ndim != 2 or 0 in a.shape:
        raise ValueError(f"paired scores must be two [seeds, items] arrays of one shape, got "
                         f"{a.shape} and {c.shape}")
    diff = a - c
    seeds, items = diff.shape
    mean = float(diff.mean())
    out = {"mean": mean, "seeds": seeds, "n": items, "conditional": seeds == 1}
    if seeds == 1:
        if items < 2:
            return {**out, "low": None, "high": None, "half_width": None, "p": None}
        return {**out, **_interval(mean, [(float(diff[0].var(ddof=1)) / items, items - 1)],
                                   confidence)}
    row = diff.mean(1)
    parts = [(float(row.var(ddof=1)) / seeds, seeds - 1)]
    if items > 1:
        col = diff.mean(0)
        ms_items = seeds * float(((col - mean) ** 2).sum()) / (items - 1)
        resid = diff - row[:, None] - col[None, :] + mean
        ms_resid = float((resid ** 2).sum()) / ((seeds - 1) * (items - 1))
        parts.append((max(ms_items - ms_resid, 0.0) / (seeds * items), items - 1))
    return {**out, **_interval(mean, parts, confidence),
            "variance_parts": [list(parts[0]), list(parts[1]) if items > 1 else None]}


def _interval(mean: float, parts: list, confidence: float) -> dict:
    """``low``, ``high``, ``half_width`` and ``p`` from variance parts ``[(variance, dof)]``,
    their t half widths added in quadrature (the p-value inverts that interval; None where
    the parts measured no spread, :func:`megatron_ext.metrics.intervals.no_spread`)."""
    quantile = (1 + confidence) / 2
    half = math.sqrt(sum(scipy_stats.t.ppf(quantile, dof) ** 2 * v for v, dof in parts))
    if no_spread(math.sqrt(sum(v for v, _ in parts)), mean):
        p = None  # no spread measured: no p-value (0 would count as significant)
    else:  # the level at which the interval's edge reaches 0 (at most 1e-15 reported)

        def excess(q: float) -> float:
            return math.sqrt(sum(scipy_stats.t.isf(q / 2, dof) ** 2 * v
                                 for v, dof in parts)) - abs(mean)
        p = 1e-15 if excess(1e-15) <= 0 else float(brentq(excess, 1e-15, 1.0))
    return {"low": mean - half, "high": mean + half, "half_width": half, "p": p}


def holm(p_values: Sequence[Optional[float]]) -> list[Optional[float]]:
    """Holm's step-down adjustment of a family of p-values (None stays None and is not
    counted): the family-wise error rate is at most the level for any dependence."""
    present = [(p, i) for i, p in enumerate(p_values) if p is not None]
    if any(math.isnan(p) for p, _ in present):  # sorted() would misplace it, and the rest
        raise ValueError(f"holm: a NaN among the p-values {list(p_values)}")
    out: list[Optional[float]] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(present)):
        running = max(running, min(1.0, (len(present) - rank) * p))
        out[i] = running
    return out
