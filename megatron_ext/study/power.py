"""What a study's design can detect: for each difference interval a report prints, the
smallest true gap its test (the 95% interval excluding 0) detects with 80% power, from the
interval's own spread, and how many seeds would detect the gap it measured. Pure functions
of the intervals (:mod:`.stats`, :mod:`.fit`), and their table cells; the report modules
print them beside the intervals and :mod:`.calibration` checks them by simulation.

An interval's estimate has variance parts (:class:`Part`): the seeds' spread (the paired t
interval's one part; the crossed interval's by-seed part; a fit's pooled spread over its
levels), whose variance falls as 1/seeds and whose degrees of freedom grow with them, and,
for a downstream task's crossed interval, the items' part, which no number of seeds
shrinks. The interval's half width adds the parts' t half widths in quadrature
(:func:`megatron_ext.study.stats.crossed_interval`); its power at a true gap ``δ`` is
taken from the noncentral t distribution with the parts' Satterthwaite degrees of freedom
and the interval's own critical ratio (for one part: exactly the t test's power). The
spread is the one measured, taken as the truth: with few seeds it is itself uncertain,
and the calibration table says how much that costs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

from scipy import stats as scipy_stats
from scipy.optimize import brentq

POWER = 0.8
MOST_SEEDS = 1000  # seeds searched for a measured gap; beyond: "more than"


@dataclasses.dataclass(frozen=True)
class Part:
    """One part of an estimate's variance: ``variance``, its degrees of freedom ``dof``, and
    ``groups`` > 0 for a part estimated from the seeds' spread (over seeds ``S`` its
    variance goes as 1/S and ``dof`` = groups × (S − 1): 1 for a paired t interval, the
    levels for a fit pooled over them), 0 for one that seeds do not shrink (the items')."""
    variance: float
    dof: float
    groups: float


def design(interval: Optional[dict]) -> Optional[tuple[list[Part], int]]:
    """``(parts, seeds)`` of a difference interval as the study's modules return it: a t
    interval over seeds (``n``, ``half_width``), a crossed seeds x items interval
    (``variance_parts``) or a fit's (``variance``, ``dof``, ``seeds``); None where it has no
    interval for the arms (none, or one conditional on a single seed)."""
    if interval is None or interval.get("low") is None or interval.get("conditional"):
        return None
    if "variance_parts" in interval:
        seeds_part, items_part = interval["variance_parts"]
        return ([Part(*seeds_part, 1.0), *([Part(*items_part, 0.0)] if items_part else [])],
                interval["seeds"])
    if "variance" in interval:
        seeds = interval["seeds"]
        return [Part(interval["variance"], interval["dof"], interval["dof"] / (seeds - 1))], seeds
    n = interval["n"]
    se = interval["half_width"] / float(scipy_stats.t.ppf(0.975, n - 1))
    return [Part(se * se, n - 1, 1.0)], n


def detection(gap: float, parts: Sequence[Part], confidence: float = 0.95) -> float:
    """The chance that the interval of ``parts`` excludes 0 when the true difference is
    ``gap``."""
    total = sum(p.variance for p in parts)
    if total <= 0:
        return float(gap != 0)
    quantile = (1 + confidence) / 2
    half = math.sqrt(sum(scipy_stats.t.ppf(quantile, p.dof) ** 2 * p.variance for p in parts))
    dof = total ** 2 / sum(p.variance ** 2 / p.dof for p in parts)
    critical, shift = half / math.sqrt(total), abs(gap) / math.sqrt(total)
    wrong_side = float(scipy_stats.nct.cdf(-critical, dof, shift))  # NaN where negligible
    return float(scipy_stats.nct.sf(critical, dof, shift)) + (
        wrong_side if math.isfinite(wrong_side) else 0.0)


def detectable(parts: Sequence[Part], power: float = POWER) -> float:
    """The smallest true gap the interval of ``parts`` detects with ``power``."""
    scale = math.sqrt(sum(p.variance for p in parts))
    if scale == 0:
        return 0.0
    high = 4 * scale
    while detection(high, parts) < power:
        high *= 2
    return float(brentq(lambda gap: detection(gap, parts) - power, 0.0, high))


def with_seeds(parts: Sequence[Part], seeds: int, more: int) -> list[Part]:
    """``parts`` measured with ``seeds`` seeds, as ``more`` seeds would give them."""
    return [Part(p.variance * seeds / more, p.groups * (more - 1), p.groups) if p.groups
            else p for p in parts]


def seeds_needed(gap: float, parts: Sequence[Part], seeds: int, power: float = POWER
                 ) -> Optional[int]:
    """The fewest seeds (at least 2) whose interval detects ``gap`` with ``power``, the
    spread per seed as measured; None when :data:`MOST_SEEDS` do not (or the gap is 0)."""
    if gap == 0 or detection(gap, with_seeds(parts, seeds, MOST_SEEDS)) < power:
        return None
    if detection(gap, with_seeds(parts, seeds, 2)) >= power:
        return 2
    low, high = 2, MOST_SEEDS         # detection(low) < power <= detection(high)
    while high - low > 1:
        middle = (low + high) // 2
        if detection(gap, with_seeds(parts, seeds, middle)) >= power:
            high = middle
        else:
            low = middle
    return high


def sensitivity(interval: Optional[dict]) -> Optional[dict]:
    """``{"detectable", "seeds", "seeds_needed", "items_limit"}`` of a difference interval
    (None where it has none): the smallest gap detected with 80% power, the seeds it was
    measured with, those that would detect its measured gap (None: more than
    :data:`MOST_SEEDS`), and whether no number of seeds would (the items' part alone
    keeps the power below 80%)."""
    found = design(interval)
    if found is None:
        return None
    parts, seeds = found
    gap = interval["mean"] if "mean" in interval else interval["value"]
    fixed = [p for p in parts if not p.groups]
    return {"detectable": detectable(parts), "seeds": seeds,
            "seeds_needed": seeds_needed(gap, parts, seeds),
            "items_limit": bool(fixed) and gap != 0 and detection(gap, fixed) < POWER}


HEADER = "80% power: smallest gap · seeds for the measured gap"


NEEDS = "no interval (1 seed): an interval needs 2 seeds"


def cell(interval: Optional[dict], digits: int = 4, needs: str = NEEDS) -> str:
    """The table cell of :func:`sensitivity`: ``±gap · N seeds``; where the design gives no
    interval for the arms, ``needs`` (what it lacks and the seeds that give one)."""
    if interval is None:
        return "—"
    found = sensitivity(interval)
    if found is None:
        return ("conditional on its 1 seed: an interval for the arms needs 2 seeds"
                if interval.get("conditional") else needs)
    needed = found["seeds_needed"]
    gap = interval["mean"] if "mean" in interval else interval["value"]
    text = ("no gap measured" if gap == 0 else
            "no number of seeds (the items' part alone)" if found["items_limit"] else
            f"more than {MOST_SEEDS:,} seeds" if needed is None else f"{needed} seeds")
    return f"±{found['detectable']:.{digits}f} · {text}"
