"""The calibration of a tuned factor (:mod:`..tuning`): the tuned gap's paired t interval
when each arm's best level is chosen on the reported seeds and on the selection seeds
(:func:`..spec.split_seeds`), and the family of sizes with and without Holm's adjustment."""

from __future__ import annotations

import numpy as np

from ..spec import split_seeds
from ..stats import holm, t_interval
from ..tuning import best_level
from .trials import covers


def tuned(rng, trials: int, seeds: int, sizes: int, noise: float, flat: float,
          sharp: float) -> dict:
    """At every size both arms' best loss is the same, at the same of 4 learning rates; the
    arm's loss is flat in the rate (``flat`` per grid step squared), the control's sharp
    (``sharp``); each run's loss scattered by ``noise``. The truth of the tuned gap is the
    true difference at the levels chosen. Coverage of its paired t interval when the
    choice is made on the reported runs themselves and when it is made on the selection
    seeds and reported on the others (:func:`.spec.split_seeds`); and the family of sizes:
    the share of trials where any size's interval misses its truth, unadjusted (reported)
    and Holm-adjusted (a false-positive rate)."""
    grid = np.arange(4)
    curve = {"arm": flat * (grid - 1) ** 2, "control": sharp * (grid - 1) ** 2}
    selection, reported = split_seeds(list(range(seeds)))
    hits = {"same": 0, "split": 0}
    family = {"same": 0, "split": 0, "split Holm": 0}
    for _ in range(trials):
        p_values: dict = {"same": [], "split": []}
        for _ in range(sizes):
            loss = {name: c[:, None] + noise * rng.standard_normal((len(grid), seeds))
                    for name, c in curve.items()}     # [levels, seeds]
            for key, (chooses, reports) in (("same", (list(range(seeds)),) * 2),
                                             ("split", (selection, reported))):
                level = {name: best_level({lv: dict(enumerate(y[lv])) for lv in grid}, chooses)
                         for name, y in loss.items()}
                truth = curve["arm"][level["arm"]] - curve["control"][level["control"]]
                d = (loss["arm"][level["arm"], reports]
                     - loss["control"][level["control"], reports])
                hits[key] += covers(t_interval(d), truth)
                p_values[key].append(t_interval(d - truth)["p"])
        family["same"] += min(p_values["same"]) < 0.05
        family["split"] += min(p_values["split"]) < 0.05
        family["split Holm"] += min(holm(p_values["split"])) < 0.05
    per_size = trials * sizes
    return {"tuned gap, chosen on the reported seeds (no longer printed)":
                ("reference", hits["same"] / per_size),
            "tuned gap, chosen on the selection seeds": hits["split"] / per_size,
            f"any of {sizes} sizes misses, chosen on the reported seeds":
                ("share", family["same"] / trials),
            f"any of {sizes} sizes misses, selection seeds, unadjusted":
                ("share", family["split"] / trials),
            f"any of {sizes} sizes misses, selection seeds, Holm":
                ("fp", family["split Holm"] / trials)}
