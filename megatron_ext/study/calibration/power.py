"""The calibration of the power statements (:mod:`..power`): the share of fresh studies
that detect the gap a report prints at 80% expected power (by seed, under Holm, crossed),
what equivalence and non-inferiority claim at the margin, and what the expected power at a
gap of interest promises averaged over studies."""

from __future__ import annotations

import math

import numpy as np

from .. import power
from ..stats import crossed_interval, t_interval
from .trials import detects


def power_by_seed(rng, trials: int, seeds: int, spread: float, family: int = 1) -> dict:
    """Each trial a study of ``seeds`` seeds whose paired differences are ``N(spread,
    spread²)`` (a true gap of one spread), read as a report reads it, then fresh studies
    judged at the α the report states (0.05, or Holm's 0.05/``family``):

    - at the smallest gap printed from the study's own spread (80% expected power,
      :func:`.power.sensitivity`), the share of fresh studies of ``seeds`` seeds that detect
      it (asserted: what "80%" says);
    - reported (the reports no longer print it: planned from the measured gap, it is the
      p-value restated): with the seeds at 80% expected power for the gap it measured, the
      share of fresh studies of that many seeds, at a true gap of that size, that detect it
      (a trial beyond :data:`.power.MOST_SEEDS` names no count and is not counted);
    - the formula: at the gap of 80% power at the true spread (asserted);
    - reported: the gap and the seeds with the study's own spread taken as the truth, the
      rule the reports printed before expected power (below 80% with few seeds: the spread
      of a few seeds is itself uncertain)."""
    alpha = power.ALPHA / family
    truth = [power.Part(spread ** 2 / seeds, seeds - 1, 1.0)]
    formula = power.detectable(truth, alpha, expected=False)
    hits = dict.fromkeys(("formula", "gap", "seeds", "old gap", "old seeds"), 0)
    counted = {"seeds": 0, "old seeds": 0}

    def fresh(gap: float, n: int) -> bool:
        return detects(t_interval(gap + spread * rng.standard_normal(n), 1 - alpha))

    for _ in range(trials):
        hits["formula"] += fresh(formula, seeds)
        measured = t_interval(spread + spread * rng.standard_normal(seeds))
        parts, _ = power.design(measured)
        found = power.sensitivity(measured, alpha)
        hits["gap"] += fresh(found["detectable"], seeds)
        hits["old gap"] += fresh(power.detectable(parts, alpha, expected=False), seeds)
        old = power.seeds_needed(measured["mean"], parts, seeds, alpha, expected=False)
        planned = power.seeds_needed(measured["mean"], parts, seeds, alpha)
        for key, named in (("seeds", planned), ("old seeds", old)):
            if named is not None:
                counted[key] += 1
                hits[key] += fresh(measured["mean"], named)
    at = "" if family == 1 else f", at Holm's 0.05/{family}"
    old = "the study's spread taken as the truth (the old rule)"
    return {f"formula: detected at the gap of 80% power at the true spread{at}":
                ("power", hits["formula"] / trials),
            f"detected at the printed gap (80% expected power, the study's own spread){at}":
                ("power", hits["gap"] / trials),
            f"detected with the seeds for the measured gap (no longer printed){at}":
                ("share", hits["seeds"] / max(counted["seeds"], 1), counted["seeds"]),
            f"{old}: detected at its gap{at}": ("share", hits["old gap"] / trials),
            f"{old}: detected with its seeds{at}":
                ("share", hits["old seeds"] / max(counted["old seeds"], 1),
                 counted["old seeds"])}


def power_crossed(rng, trials: int, seeds: int, items: int, seed_sd: float, item_sd: float,
                  noise_sd: float) -> dict:
    """Per-item differences ``gap + seed effect (seed_sd) + item effect (item_sd, a fresh
    sample of the task's items each study) + noise (noise_sd)``: each trial a study read as
    a report reads it (its crossed interval's parts), then a fresh study of the design at
    the gap printed from them (80% expected power): the share that detects it; and the
    formula, at the gap of 80% power at the true parts."""
    truth = [power.Part((seed_sd ** 2 + noise_sd ** 2 / items) / seeds, seeds - 1, 1.0),
             power.Part(item_sd ** 2 / items, items - 1, 0.0)]
    formula = power.detectable(truth, expected=False)

    def study(gap: float) -> dict:
        diff = (gap + seed_sd * rng.standard_normal((seeds, 1))
                + item_sd * rng.standard_normal((1, items))
                + noise_sd * rng.standard_normal((seeds, items)))
        return crossed_interval(diff, np.zeros_like(diff))

    at_formula = at_printed = 0
    for _ in range(trials):
        at_formula += detects(study(formula))
        printed = power.detectable(power.design(study(formula))[0])
        at_printed += detects(study(printed))
    return {"formula: detected at the gap of 80% power at the true parts (crossed)":
                ("power", at_formula / trials),
            "detected at the printed gap (80% expected power, the study's own parts; "
            "crossed)": ("power", at_printed / trials)}


# ----------------------------------------------------------- equivalence and gap of interest

def equivalence_by_seed(rng, trials: int, seeds: int, spread: float, margin: float,
                        heavy: bool = False) -> dict:
    """Paired differences of ``seeds`` seeds with a per-seed spread ``spread`` (normal, or
    with ``heavy`` Student t with 4 degrees of freedom scaled to that sd), read as a report
    reads them (:func:`.power.equivalence`, :func:`.power.sensitivity`):

    - true gap = ``margin``: the share of studies that claim equivalence within ±margin
      (TOST at 5%; asserted at most 5%);
    - true gap 0: with the seeds the study prints for non-inferiority at ``margin``, the
      share of fresh studies of that many seeds that show it (asserted: a power row);
    - the gap of interest (= ``margin``): the mean expected power printed and the share of
      fresh studies of the design that detect that gap, reported: at one fixed true spread
      the two differ (expected power averages over the spread, not over studies)."""
    def draw(n: int, gap: float) -> np.ndarray:
        noise = (rng.standard_t(4, n) / math.sqrt(2.0)) if heavy else rng.standard_normal(n)
        return gap + spread * noise

    claimed = shown = counted = detected = 0
    printed = 0.0
    for _ in range(trials):
        at_margin = t_interval(draw(seeds, margin))
        claimed += bool(power.equivalence(at_margin, margin)["within"])
        null = t_interval(draw(seeds, 0.0))
        named = power.non_inferiority_seeds(margin, *power.design(null))
        if named is not None:
            counted += 1
            shown += power.equivalence(t_interval(draw(named, 0.0)), margin)["high"] < margin
        printed += power.sensitivity(null, power.ALPHA, margin)["power"]
        detected += detects(t_interval(draw(seeds, margin)))
    tail = ", t(4) seeds" if heavy else ""
    fp, pw = ("share", "share") if heavy else ("fp_at_most", "power")
    return {f"equivalence claimed at a true gap equal to the margin{tail}":
                (fp, claimed / trials),
            f"non-inferiority shown with the seeds printed for it, true gap 0{tail}":
                (pw, shown / max(counted, 1), counted),
            f"expected power printed at the gap of interest (mean){tail}":
                ("share", printed / trials),
            f"detected at the gap of interest by a fresh study{tail}":
                ("share", detected / trials)}


SPAN = 64   # the true spreads of :func:`gap_of_interest_by_seed`: gap/SPAN to gap·SPAN


def gap_of_interest_by_seed(rng, trials: int, seeds: int, gap: float,
                            heavy: bool = False) -> dict:
    """What the expected power printed at a gap of interest promises: averaged over
    studies, the share of fresh studies (each reading its own pilot) that detect the gap.
    Expected power averages over the spread given the pilot's with the reference prior
    1/σ, so the trials draw theirs from it: each trial's true per-seed spread is
    log-uniform from ``gap``/:data:`SPAN` to ``gap``·:data:`SPAN` (wide enough that the
    range's ends move the average by under 0.01, 2 seeds included); a pilot of ``seeds``
    paired differences measures it (normal, or with ``heavy`` Student t with 4 degrees of
    freedom scaled to that sd), the report's expected power at ``gap`` is read from the
    pilot (:func:`.power.sensitivity`'s figure, :func:`.power.expected_detection`), and a
    fresh study of the same seeds at the true spread and gap is detected or not.

    Rows: the mean printed power and the share detected (reported), and their difference
    (an ``agreement`` row: asserted within ±0.03, or ± 3 Monte Carlo standard errors of the
    paired difference where wider; reported for ``heavy``); and the old rule's (the
    pilot's spread taken as the truth) difference, reported, to show what the check
    separates. At one fixed true spread the printed mean and the power differ (the docs'
    table): the figure is an average over studies, not this study's power."""
    def draw(n: int, mean: float, spread: float) -> np.ndarray:
        noise = (rng.standard_t(4, n) / math.sqrt(2.0)) if heavy else rng.standard_normal(n)
        return mean + spread * noise

    printed = np.empty(trials)
    old = np.empty(trials)
    detected = np.empty(trials)
    for i in range(trials):
        spread = gap * math.exp(rng.uniform(-math.log(SPAN), math.log(SPAN)))
        parts, _ = power.design(t_interval(draw(seeds, 0.0, spread)))
        printed[i] = power.expected_detection(gap, parts)
        old[i] = power.detection(gap, parts)
        detected[i] = detects(t_interval(draw(seeds, gap, spread)))

    def agreement(figure: np.ndarray) -> tuple:
        difference = figure - detected
        error = float(difference.std(ddof=1)) / math.sqrt(trials) if trials > 1 else 1.0
        return float(difference.mean()), 3 * error

    tail = ", t(4) seeds" if heavy else ""
    kind = "share" if heavy else "agreement"
    diff, error = agreement(printed)
    old_diff, old_error = agreement(old)
    return {f"expected power printed at the gap of interest (mean over studies){tail}":
                ("share", float(printed.mean())),
            f"detected at the gap of interest by a fresh study (share){tail}":
                ("share", float(detected.mean())),
            f"printed minus detected{tail}": (kind, diff, trials, error),
            f"the pilot's spread taken as the truth (old rule): printed minus detected{tail}":
                ("share", old_diff, trials, old_error)}
