"""The calibration suite's runner: the scenarios (each a check of this package's modules,
with its parameters), the band each row must lie in, :func:`run` and the table that
``tools/calibrate.py`` prints and writes.

Each row is one interval in one scenario: the share of trials whose interval holds the
truth (or, for ``false_positive`` rows, excludes the null's 0; for ``power`` rows, whose
fresh study detects what the report states), and the band it must lie in: 0.95 (0.05) ±
:func:`tolerance`, max(0.02, 3 binomial standard errors of the trial count), so a full run
(2,000 trials) asserts 0.93–0.97 and a quick one a wider band it states; 0.75–0.90 for power
(0.825 ± max(0.075, 3 standard errors)); at most 0.05 + the tolerance for a false positive
bounded above only; ±max(0.03, 3 standard errors of the paired difference) for an
agreement row (a printed figure minus the rate achieved). One-seed intervals are conditional
on that seed and stay out.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .comparisons import downstream, t_by_seed
from .fits import direct_gap, joint_fit, scaling_fit
from .power import equivalence_by_seed, gap_of_interest_by_seed, power_by_seed, power_crossed
from .probes import frequency_mark, probe_selectivity
from .tuning import tuned

NOMINAL = 0.95


def tolerance(trials: int, rate: float = NOMINAL, floor: float = 0.02) -> float:
    """The band's half width around the nominal ``rate`` for ``trials`` trials: max(``floor``,
    3 binomial standard errors)."""
    return max(floor, 3 * math.sqrt(rate * (1 - rate) / trials))


# reported, not asserted: the crossed interval is conservative where the arms' difference
# varies from item to item more than anything else varies (its two parts' t quantiles add in
# quadrature)
ITEMS_DOMINATE = "the arms' per-item deviations dominate (sd 1.5 logit; 3 seeds, 400 items)"

SCENARIOS: list[tuple[str, str, Callable, dict]] = [
    ("t by seed", "2 seeds", t_by_seed, dict(seeds=2, spread=0.02, shared=0.0, skewed=False)),
    ("t by seed", "3 seeds, skewed seed effects", t_by_seed,
     dict(seeds=3, spread=0.02, shared=0.0, skewed=True)),
    ("t by seed", "5 seeds, shared seed effects (0.8)", t_by_seed,
     dict(seeds=5, spread=0.02, shared=0.8, skewed=False)),
    ("downstream", "item noise dominates (3 seeds, 400 items, no seed spread)", downstream,
     dict(seeds=3, items=400, spread=0.0, shared=0.0, interaction=0.5, effect=0.0)),
    ("downstream", "HellaSwag-like (3 seeds, 10,000 items, seed sd ≈ 0.6 pp)", downstream,
     dict(seeds=3, items=10_000, spread=0.025, shared=0.0, interaction=0.3, effect=0.0)),
    ("downstream", "2 seeds, 10,000 items, seed sd ≈ 0.6 pp", downstream,
     dict(seeds=2, items=10_000, spread=0.025, shared=0.0, interaction=0.3, effect=0.0)),
    ("downstream", "2 seeds, 1,000 items, seed sd ≈ 2.5 pp", downstream,
     dict(seeds=2, items=1000, spread=0.1, shared=0.0, interaction=0.3, effect=0.0)),
    ("downstream", "large seed spread (3 seeds, seed sd ≈ 7 pp)", downstream,
     dict(seeds=3, items=1000, spread=0.3, shared=0.0, interaction=0.3, effect=0.0)),
    ("downstream", "5 seeds, 1,000 items, seed sd ≈ 2.5 pp", downstream,
     dict(seeds=5, items=1000, spread=0.1, shared=0.0, interaction=0.3, effect=0.0)),
    ("downstream", ITEMS_DOMINATE, downstream,
     dict(seeds=3, items=400, spread=0.0, shared=0.0, interaction=1.5, effect=0.0)),
    ("downstream", "shared seed effects (0.8), known effect (+0.2 logit)", downstream,
     dict(seeds=3, items=1000, spread=0.2, shared=0.8, interaction=0.3, effect=0.2)),
    ("fit", "5 levels, 3 seeds, noise 0.01", scaling_fit,
     dict(seeds=3, levels=5, noise=0.01, shared=0.0)),
    ("fit", "5 levels, 2 seeds, noise 0.02, shared seed effects (0.5)", scaling_fit,
     dict(seeds=2, levels=5, noise=0.02, shared=0.5)),
    ("fit", "7 levels, 5 seeds, noise 0.01", scaling_fit,
     dict(seeds=5, levels=7, noise=0.01, shared=0.0)),
    ("fit", "direct gap, 5 levels, 3 seeds, noise 0.02", direct_gap,
     dict(seeds=3, levels=5, noise=0.02)),
    ("fit L(N, D)", "the CPU preset's grid: 4 sizes (1.2 decades) x 4 budgets (0.43 "
     "decades), 3 seeds, noise 0.02", joint_fit,
     dict(seeds=3, sizes=4, budgets=4, decades=(1.16, 0.43), noise=0.02, shared=0.0,
          null=False, narrow=True)),
    ("fit L(N, D)", "null gap (both arms one law), the CPU preset's grid, 3 seeds, noise 0.02",
     joint_fit, dict(seeds=3, sizes=4, budgets=4, decades=(1.16, 0.43), noise=0.02,
                     shared=0.0, null=True, narrow=True)),
    ("fit L(N, D)", "6 sizes (2 decades) x 6 budgets (1.5 decades), 2 seeds, noise 0.02, "
     "shared seed effects (0.5)", joint_fit,
     dict(seeds=2, sizes=6, budgets=6, decades=(2.0, 1.5), noise=0.02, shared=0.5,
          null=False)),
    ("tuned", "3 sizes x 4 rates, 3 seeds, arm flat, control sharp", tuned,
     dict(seeds=3, sizes=3, noise=0.02, flat=0.0, sharp=0.05)),
    ("tuned", "3 sizes x 4 rates, 5 seeds, arm flat, control sharp", tuned,
     dict(seeds=5, sizes=3, noise=0.02, flat=0.0, sharp=0.05)),
    ("probes", "no signal (types as random vectors), random ids, 3 seeds x 2 probe seeds "
     "sharing each text", probe_selectivity,
     dict(seeds=3, probe_seeds=2, signal=0.0, random_ids=True)),
    ("probes", "no signal (types as random vectors), ids ordered by frequency, 3 seeds x 2 "
     "probe seeds sharing each text", probe_selectivity,
     dict(seeds=3, probe_seeds=2, signal=0.0, random_ids=False)),
    ("probes", "known selectivity (the ids' bits in noise), one text, 3 seeds x 2 probe seeds",
     probe_selectivity, dict(seeds=3, probe_seeds=2, signal=0.5, random_ids=False)),
    ("frequency mark", "no signal but frequency: ids in exact frequency order, states of the "
     "tokens' frequencies beside type vectors, 3 seeds x 2 probe seeds sharing each text",
     frequency_mark, dict(seeds=3, probe_seeds=2)),
    ("equivalence", "3 seeds, margin 1 spread", equivalence_by_seed,
     dict(seeds=3, spread=0.03, margin=0.03)),
    ("equivalence", "5 seeds, margin 1 spread", equivalence_by_seed,
     dict(seeds=5, spread=0.03, margin=0.03)),
    ("equivalence", "3 seeds, margin 1 spread, heavy-tailed seeds (t, 4 df)",
     equivalence_by_seed, dict(seeds=3, spread=0.03, margin=0.03, heavy=True)),
    ("power", "2 seeds", power_by_seed, dict(seeds=2, spread=0.03)),
    ("power", "3 seeds", power_by_seed, dict(seeds=3, spread=0.03)),
    ("power", "5 seeds", power_by_seed, dict(seeds=5, spread=0.03)),
    ("power", "3 seeds, a family of 3 judged by Holm", power_by_seed,
     dict(seeds=3, spread=0.03, family=3)),
    ("power", "3 seeds x 400 items, seed and item parts alike", power_crossed,
     dict(seeds=3, items=400, seed_sd=0.02, item_sd=0.5, noise_sd=0.5)),
    ("power", "5 seeds x 1,000 items, the items' part dominates", power_crossed,
     dict(seeds=5, items=1000, seed_sd=0.005, item_sd=0.6, noise_sd=0.3)),
    # (after the others: each scenario's random stream is its index's)
    ("gap of interest", "2 seeds, true spread log-uniform (gap/64 to 64·gap)",
     gap_of_interest_by_seed, dict(seeds=2, gap=0.03)),
    ("gap of interest", "3 seeds, true spread log-uniform (gap/64 to 64·gap)",
     gap_of_interest_by_seed, dict(seeds=3, gap=0.03)),
    ("gap of interest", "5 seeds, true spread log-uniform (gap/64 to 64·gap)",
     gap_of_interest_by_seed, dict(seeds=5, gap=0.03)),
    ("gap of interest", "3 seeds, true spread log-uniform, heavy-tailed seeds (t, 4 df)",
     gap_of_interest_by_seed, dict(seeds=3, gap=0.03, heavy=True)),
]


KINDS = {"fp": "false_positive", "fp_at_most": "false_positive_at_most", "share": "share",
         "reference": "coverage_not_asserted", "power": "power", "agreement": "agreement"}
AGREEMENT = 0.03   # an agreement row: a printed figure minus the rate achieved, within ±this
# The rate each asserted kind must read, and the least half width of its band: a power
# row (the share of fresh studies that detect what a report states at 80%) must lie in
# 0.75-0.90 (seeds come whole: a count that reaches 80% may reach more).
CENTRES = {"coverage": (NOMINAL, 0.02), "false_positive": (1 - NOMINAL, 0.02),
           "false_positive_at_most": (1 - NOMINAL, 0.02), "power": (0.825, 0.075)}


def run(trials: int, seed: int = 0, checks=None) -> dict:
    """Every scenario (or those whose check is in ``checks``) at ``trials`` trials. Returns
    ``{"trials", "rows": [{"check", "scenario", "interval", "kind", "rate", "trials",
    "low", "high", "within"}]}``; ``kind`` is ``coverage``, ``false_positive``,
    ``false_positive_at_most`` (0.05 + its tolerance at most), ``power``
    (the share of fresh studies that detect what a report states at 80%: 0.75-0.90, or
    0.825 ± 3 standard errors when wider), ``agreement`` (a printed figure minus the rate
    achieved: within ±:data:`AGREEMENT`, or ± 3 standard errors when wider), or ``share``
    and ``coverage_not_asserted``
    (reported, not asserted: a rate with no nominal value, or an interval the reports no
    longer print). A row's ``trials`` are those it counts (a scenario may leave some
    out, and says which)."""
    rows = []
    for index, (check, scenario, simulate, params) in enumerate(SCENARIOS):
        if checks and check not in checks:
            continue
        rng = np.random.default_rng([seed, index])
        for interval, value in simulate(rng, trials, **params).items():
            kind, rate, counted = (("coverage", value, trials) if not isinstance(value, tuple)
                                   else (KINDS[value[0]], value[1], (*value, trials)[2]))
            if scenario == ITEMS_DOMINATE and kind == "coverage":
                kind = "coverage_not_asserted"
            asserted = (kind in CENTRES or kind == "agreement") and counted > 0
            centre, floor = CENTRES.get(kind, (NOMINAL, 0.02))
            if kind == "agreement":     # a difference: ±0.03, or ± its 3 standard errors
                band = max(AGREEMENT, value[3])
                low, high = -band, band
            else:
                band = tolerance(max(counted, 1), centre, floor)
                low = 0.0 if kind == "false_positive_at_most" else max(centre - band, 0.0)
                high = min(centre + band, 1.0)
            rows.append({"check": check, "scenario": scenario, "interval": interval,
                         "kind": kind, "rate": rate, "trials": counted,
                         "low": low if asserted else None, "high": high if asserted else None,
                         "within": bool(low <= rate <= high) if asserted else None})
    return {"trials": trials, "seed": seed, "rows": rows}


def markdown(result: dict) -> list[str]:
    """The calibration table."""
    lines = ["| check | scenario | interval | measures | rate | trials | band | within |",
             "|---|---|---|---|---:|---:|---|---|"]
    for r in result["rows"]:
        band = "—" if r["low"] is None else f"{r['low']:.3f}–{r['high']:.3f}"
        within = {True: "yes", False: "**no**", None: "(reported)"}[r["within"]]
        lines.append(f"| {r['check']} | {r['scenario']} | {r['interval']} | "
                     f"{r['kind'].replace('_', ' ')} | {r['rate']:.3f} | {r['trials']} | "
                     f"{band} | {within} |")
    return lines
