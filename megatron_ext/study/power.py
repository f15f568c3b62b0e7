"""What a study's design can detect and rule out: for each difference interval a report
prints, the smallest true gap that a fresh study of the same design detects (its interval
excludes 0) with 80% expected power; for a gap of interest fixed in advance, the expected
power a fresh study of this size has for it and the seeds that would detect it (never
planned from the measured gap: that is the p-value restated); and the smallest
equivalence margin its 90% interval rules out (:func:`equivalence`, TOST at 5%). Pure
functions of the intervals (:mod:`.stats`, :mod:`.fit`), and their table cells; the report
modules print them beside the intervals and :mod:`.calibration` checks them by simulation.

An interval's estimate has variance parts (:class:`Part`): the seeds' spread (the paired t
interval's one part; the crossed interval's by-seed part; a fit's pooled spread over its
levels), whose variance falls as 1/seeds and whose degrees of freedom grow with them, and,
for a downstream task's crossed interval, the items' part, which no number of seeds
shrinks. The interval's half width adds the parts' t half widths in quadrature
(:func:`megatron_ext.study.stats.crossed_interval`); its power at a true gap ``δ`` and
given variances is the noncentral t's with the parts' Satterthwaite degrees of freedom and
the interval's own critical ratio (:func:`detection`; for one part exactly the t test's).

**The planning method: expected power** (assurance; O'Hagan, Stevens & Campbell 2005,
"Assurance in clinical trial design", Pharmaceutical Statistics 4:187-201). The seeds'
spread is itself measured, with few degrees of freedom; taken as the truth (the power at
the measured spread), the gap printed for 80% is detected by a fresh study of the same
design only 0.580 (2 seeds), 0.629 (3) and 0.685 (5) of the time (at 95%). Here the power is
averaged over what the seeds' part of the variance could be given its measured value ``v``
with ``m`` degrees of freedom: ``v·m/χ²_m`` (the reference prior 1/σ), by Gauss-Legendre quadrature
(:func:`expected_detection`). The t statistic is pivotal, so that average is exactly the
share of studies of the design, measuring their own spread, whose printed gap a fresh
study of the same design detects, whatever the true spread: 80% (the calibration's power
rows, 2, 3 and 5 seeds). The upper confidence limit of the spread (Browne 1995, Statistics
in Medicine 14:1933-1940; Kieser & Wassmer 1996, Biometrical Journal 38:941-949), the
other standard remedy, makes the 80% a lower bound held with a chosen confidence instead
(at its 80% limit the share detected is 0.88, for any number of seeds): the share is what a
reader of "80%" expects. The items' part of a crossed interval (hundreds of degrees of
freedom) is taken as measured.

**The α**: every figure is given at the unadjusted 95% of the printed intervals, and,
where the report judges a family by Holm's adjustment, at ``0.05/m`` for a family of
``m``: a p-value below it is significant after Holm's adjustment whatever the family's
other results (its smallest p is compared with ``0.05/m``, the others with larger
thresholds), so the power of the Holm finding is at least the power there: the figure at
``0.05/m`` is a lower bound on Holm's power (its gap an upper bound, its seeds at most as
many as Holm needs).

A spread of 0 or at the level of rounding (:func:`no_spread`) measures nothing: its cell
says so, never ``±0`` or a seed count.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Optional, Sequence

import numpy as np
from scipy import stats as scipy_stats
from scipy.optimize import brentq

from ..metrics.intervals import no_spread as spread_is_rounding

POWER = 0.8
ALPHA = 0.05
MOST_SEEDS = 1000  # seeds searched for a measured gap; beyond: "more than"

_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(64)
_NODES, _WEIGHTS = (_NODES + 1) / 2, _WEIGHTS / 2        # on (0, 1): probabilities


@dataclasses.dataclass(frozen=True)
class Part:
    """One part of an estimate's variance: ``variance``, the interval's degrees of freedom
    ``dof`` for it, and ``groups`` > 0 for a part estimated from the seeds' spread (over
    seeds ``S`` its variance goes as 1/S and ``dof`` = groups × (S − 1): 1 for a paired t
    interval, the levels for a fit pooled over them), 0 for one that seeds do not shrink
    (the items'). ``measured``: the degrees of freedom the variance was estimated with,
    where they differ from ``dof`` (the part as a design of more seeds would give it)."""
    variance: float
    dof: float
    groups: float
    measured: Optional[float] = None

    @property
    def estimated_with(self) -> float:
        return self.dof if self.measured is None else self.measured


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


def two_sided_power(critical, dof, shift) -> np.ndarray:
    """``P(|T| > critical)`` for ``T`` noncentral t with ``dof`` degrees of freedom and
    noncentrality ``shift`` ≥ 0, elementwise, from scipy's ``nct``: the upper tail
    ``sf(critical, shift)`` and the lower one as ``sf(critical, −shift)`` (``cdf(−critical,
    shift)``, the same number, is NaN at scattered noncentralities from about 7). Where
    scipy gives no finite value (a noncentrality near 1e10: a spread near 0), the normal
    approximation of the noncentral t (Abramowitz & Stegun 26.7.10), the lower tail capped
    at its bound ``Φ(−shift)``."""
    critical, dof, shift = np.broadcast_arrays(*(np.asarray(x, dtype=float)
                                                 for x in (critical, dof, shift)))
    with np.errstate(all="ignore"):
        upper = scipy_stats.nct.sf(critical, dof, shift)
        lower = scipy_stats.nct.sf(critical, dof, -shift)

        def below(t):  # P(T <= t), approximately
            return scipy_stats.norm.cdf((t * (1 - 1 / (4 * dof)) - shift)
                                        / np.sqrt(1 + t * t / (2 * dof)))
        upper = np.where(np.isfinite(upper), upper, 1 - below(critical))
        lower = np.where(np.isfinite(lower), lower,
                         np.minimum(below(-critical), scipy_stats.norm.sf(shift)))
    return np.clip(upper + lower, 0.0, 1.0)


def _power(gap: float, variances: np.ndarray, dofs: Sequence[float], alpha: float
           ) -> np.ndarray:
    """The power at ``gap`` of the interval of parts of ``variances`` (``[parts, ...]``,
    each column one set of true variances) and ``dofs``, at level ``alpha``."""
    variances = np.asarray(variances, dtype=float)
    dofs = np.asarray(dofs, dtype=float).reshape((-1,) + (1,) * (variances.ndim - 1))
    total = variances.sum(0)
    some = total > 0
    half = np.sqrt((scipy_stats.t.isf(alpha / 2, dofs) ** 2 * variances).sum(0))
    with np.errstate(all="ignore"):
        dof = np.where(some, total ** 2 / (variances ** 2 / dofs).sum(0), 1.0)
        scale = np.sqrt(np.where(some, total, 1.0))
        found = two_sided_power(half / scale, dof, abs(gap) / scale)
    return np.where(some, found, float(gap != 0))


def detection(gap: float, parts: Sequence[Part], alpha: float = ALPHA) -> float:
    """The chance that the interval of ``parts`` (their variances taken as the truth)
    excludes 0 at level ``alpha`` when the true difference is ``gap``."""
    return float(_power(gap, [p.variance for p in parts], [p.dof for p in parts], alpha))


@functools.lru_cache(maxsize=64)
def _spread_factors(measured: float) -> np.ndarray:
    """What the seeds' variance could be, as multiples of its measured value with
    ``measured`` degrees of freedom: ``m/χ²_m`` at the quadrature's nodes."""
    return measured / scipy_stats.chi2.ppf(_NODES, measured)


def expected_detection(gap: float, parts: Sequence[Part], alpha: float = ALPHA) -> float:
    """:func:`detection` averaged over what the seeds' part of the variance could be given
    its measured value (``v·m/χ²_m``, ``m`` the degrees of freedom it was measured with):
    the expected power. Parts that seeds do not shrink are taken as measured."""
    if not any(p.groups for p in parts):
        return detection(gap, parts, alpha)
    seeds_part = next(p for p in parts if p.groups)
    factors = _spread_factors(seeds_part.estimated_with)
    variances = [p.variance * (factors if p.groups else np.ones_like(factors)) for p in parts]
    return float(_power(gap, variances, [p.dof for p in parts], alpha) @ _WEIGHTS)


def no_spread(parts: Sequence[Part], gap: float) -> bool:
    """Whether the interval's spread is 0 or at the level of rounding
    (:func:`megatron_ext.metrics.intervals.no_spread`): then the seeds measured nothing a
    gap or a seed count could be planned from (and the interval has no p-value)."""
    return spread_is_rounding(math.sqrt(sum(p.variance for p in parts)), gap)


def detectable(parts: Sequence[Part], alpha: float = ALPHA, power: float = POWER,
               expected: bool = True) -> float:
    """The smallest true gap the interval of ``parts`` detects with ``power`` at ``alpha``:
    in expectation over the seeds' spread (``expected``), or at the spread taken as the
    truth. It scales with the parts' total standard deviation, so it is solved once per
    shape of the parts."""
    total = sum(p.variance for p in parts)
    if total <= 0:
        return 0.0
    shape = tuple(dataclasses.replace(p, variance=p.variance / total) for p in parts)
    return math.sqrt(total) * _unit_detectable(shape, alpha, power, expected)


@functools.lru_cache(maxsize=4096)
def _unit_detectable(parts: tuple, alpha: float, power: float, expected: bool) -> float:
    chance = expected_detection if expected else detection
    high = 4.0
    while chance(high, parts, alpha) < power:
        high *= 2
    return float(brentq(lambda gap: chance(gap, parts, alpha) - power, 0.0, high))


def with_seeds(parts: Sequence[Part], seeds: int, more: int) -> list[Part]:
    """``parts`` measured with ``seeds`` seeds, as a design of ``more`` seeds would give
    them (the spread measured as before)."""
    return [Part(p.variance * seeds / more, p.groups * (more - 1), p.groups, p.estimated_with)
            if p.groups else p for p in parts]


def seeds_needed(gap: float, parts: Sequence[Part], seeds: int, alpha: float = ALPHA,
                 power: float = POWER, expected: bool = True) -> Optional[int]:
    """The fewest seeds (at least 2) whose interval detects a true ``gap`` with ``power``
    at ``alpha`` (in expectation over the measured spread, or at the spread taken as the
    truth); None when :data:`MOST_SEEDS` do not (or the gap is 0)."""
    chance = expected_detection if expected else detection

    def reaches(more: int) -> bool:
        return chance(gap, with_seeds(parts, seeds, more), alpha) >= power
    if gap == 0 or not reaches(MOST_SEEDS):
        return None
    if reaches(2):
        return 2
    low, high = 2, MOST_SEEDS         # not reaches(low), reaches(high)
    while high - low > 1:
        middle = (low + high) // 2
        if reaches(middle):
            high = middle
        else:
            low = middle
    return high


def sensitivity(interval: Optional[dict], alpha: float = ALPHA,
                gap: Optional[float] = None) -> Optional[dict]:
    """``{"detectable", "seeds", "power", "seeds_needed", "items_limit", "no_spread"}`` of a
    difference interval at ``alpha`` (None where it has none): the smallest gap detected
    with 80% expected power, the seeds it was measured with and, for a ``gap`` of interest
    fixed in advance, the expected power a fresh study of this design has for it and the
    seeds that would detect it with 80% (None: more than :data:`MOST_SEEDS`), whether no
    number of seeds would (the items' part alone keeps the power below 80%), and whether
    the seeds measured no spread (then every figure is None). No figure is planned from
    the measured gap: at a given seed count it is a function of the p-value (observed
    power; Hoenig & Heisey 2001)."""
    found = design(interval)
    if found is None:
        return None
    parts, seeds = found
    out = {"detectable": None, "seeds": seeds, "power": None, "seeds_needed": None,
           "items_limit": False, "no_spread": True}
    if no_spread(parts, interval["mean"] if "mean" in interval else interval["value"]):
        return out
    fixed = [p for p in parts if not p.groups]
    out.update(detectable=detectable(parts, alpha), no_spread=False)
    if gap:
        out.update(power=expected_detection(gap, parts, alpha),
                   seeds_needed=seeds_needed(gap, parts, seeds, alpha),
                   items_limit=bool(fixed) and detection(gap, fixed, alpha) < POWER)
    return out


def equivalence(interval: Optional[dict], margin: Optional[float] = None) -> Optional[dict]:
    """What a difference interval rules out (Lakens, Scheel & Isager 2018): ``{"low",
    "high", "bound", "within"}``, the 90% interval of its parts (the two one-sided tests at
    5%: every margin above ``bound`` = max(|low|, |high|) is shown, "the difference lies
    within ±bound"; ``high`` alone is the non-inferiority bound of a loss) and, for a
    ``margin``, whether equivalence within it is shown. None without an interval or a
    spread."""
    found = design(interval)
    mean = None if interval is None else interval.get("mean", interval.get("value"))
    if found is None or no_spread(found[0], mean):
        return None
    half = math.sqrt(sum(float(scipy_stats.t.isf(ALPHA, p.dof)) ** 2 * p.variance
                         for p in found[0]))
    low, high = mean - half, mean + half
    bound = max(abs(low), abs(high))
    return {"low": low, "high": high, "bound": bound,
            "within": None if margin is None else bool(bound < margin)}


def non_inferiority_seeds(margin: float, parts: Sequence[Part], seeds: int) -> Optional[int]:
    """The fewest seeds (at least 2) whose 90% interval's upper end falls below ``margin``
    with 80% expected power when the true gap is 0 (non-inferiority at ``margin``, one-sided
    5%): the two-sided power at 10% of a gap ``margin`` counts both tails, the lower one
    negligible for any useful design (None beyond :data:`MOST_SEEDS`)."""
    return seeds_needed(margin, parts, seeds, 2 * ALPHA)


def header(family: int = 1) -> str:
    """The power column's heading; with a family of more than one, both figures."""
    return HEADER if family <= 1 else f"{HEADER} (95% / Holm's 0.05/{family})"


def gap_text(gap: float) -> str:
    """A loss gap in nats and as % perplexity."""
    return f"{gap:.4f} nats ({100 * math.expm1(gap):.1f}% perplexity)"


HEADER = ("80% expected power: smallest gap · at the gap of interest: expected power, "
          "seeds for 80%")

NOTE = ("What the design detects: the smallest true gap a fresh study of the same design "
        "detects (its interval excludes 0) with 80% expected power and, for a gap of "
        "interest fixed before the study (`gap_of_interest`), the expected power a fresh "
        "study of this size has for it and the seeds per arm that would detect it with 80%. "
        "Expected power (assurance: O'Hagan, Stevens & Campbell 2005) averages the power "
        "over what the seeds' spread could be given the spread they measured (the items' "
        "part of a task's crossed interval taken as measured): averaged over studies of the "
        "design, 80% of them print a gap that a fresh study detects (for the study in hand "
        "the chance may be lower or higher); no figure is planned from the measured gap, "
        "which restates the p-value.")

NEEDS = "no interval (1 seed): an interval needs 2 seeds"
NO_SPREAD_TEXT = "the seeds measured no spread: no detectable gap, no seed count"


def cell(interval: Optional[dict], digits: int = 4, needs: str = NEEDS, family: int = 1,
         trained: Optional[Callable[[int], int]] = None, gap: Optional[float] = None) -> str:
    """The table cell of :func:`sensitivity`: ``±gap`` at 95% and, with a ``gap`` of
    interest, ``· power P, N seeds`` for it; then, for a family of ``family`` > 1, ``/``
    the same at Holm's ``0.05/family``; ``trained`` turns the interval's seeds into the
    seeds the design trains (a tuned study's), shown as ``N seeds (R reported)``. Where
    the design gives no interval for the arms, ``needs`` (what it lacks and the seeds that
    give one); where the seeds measured no spread, that."""
    if interval is None:
        return "—"
    if design(interval) is None:
        return ("conditional on its 1 seed: an interval for the arms needs 2 seeds"
                if interval.get("conditional") else needs)
    alphas = [ALPHA] + ([ALPHA / family] if family > 1 else [])
    return " / ".join(_figures(interval, alpha, digits, trained, gap) for alpha in alphas)


def _figures(interval: dict, alpha: float, digits: int,
             trained: Optional[Callable[[int], int]], gap: Optional[float]) -> str:
    found = sensitivity(interval, alpha, gap)
    if found["no_spread"]:
        return NO_SPREAD_TEXT
    text = f"±{found['detectable']:.{digits}f}"
    if not gap:
        return text
    needed = found["seeds_needed"]
    if found["items_limit"]:
        seeds = "no number of seeds (the items' part alone)"
    elif needed is None:
        seeds = f"more than {MOST_SEEDS:,} {'' if trained is None else 'reported '}seeds"
    else:
        seeds = (f"{needed} seeds" if trained is None
                 else f"{trained(needed)} seeds ({needed} reported)")
    return f"{text} · power {found['power']:.2f}, {seeds}"
