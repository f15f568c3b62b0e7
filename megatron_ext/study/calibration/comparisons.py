"""The calibration of one comparison's intervals (:mod:`..stats`): the paired t interval by
seed of a final loss (2, 3 and 5 seeds, seed effects skewed or shared by the arms), and the
by-seed and the crossed (by seed and item) intervals of 0/1 task scores (up to 10,000
items, seed spread small and large, the items' part dominating, a known effect)."""

from __future__ import annotations

import math

import numpy as np

from ..stats import crossed_interval, paired_difference
from .trials import covers

_NODES, _NODE_WEIGHTS = np.polynomial.hermite_e.hermegauss(20)
_NODE_WEIGHTS = _NODE_WEIGHTS / _NODE_WEIGHTS.sum()


def t_by_seed(rng, trials: int, seeds: int, spread: float, shared: float,
              skewed: bool) -> dict:
    """A final loss per arm and seed, the arms sharing a part ``shared`` of each seed's
    effect; the paired t interval of arm − control against the true gap (0.1)."""
    hits = 0
    for _ in range(trials):
        effect = rng.standard_normal((seeds, 3))
        if skewed:  # centred log-normal seed effects
            effect = (np.exp(effect) - math.exp(0.5)) / math.sqrt((math.e - 1) * math.e)
        common = math.sqrt(shared) * effect[:, 0]
        control = 3.0 + spread * (common + math.sqrt(1 - shared) * effect[:, 1])
        arm = 3.1 + spread * (common + math.sqrt(1 - shared) * effect[:, 2])
        hits += covers(paired_difference(dict(enumerate(arm)), dict(enumerate(control))), 0.1)
    return {"by seed (t)": hits / trials}


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _expected(logit: np.ndarray, spread: float) -> np.ndarray:
    """An item's expected score over a run's seed effect ``N(0, spread²)`` on the logit."""
    return (_sigmoid(logit[..., None] + spread * _NODES) * _NODE_WEIGHTS).sum(-1)


def downstream(rng, trials: int, seeds: int, items: int, spread: float, shared: float,
               interaction: float, effect: float) -> dict:
    """0/1 item scores: each item a difficulty on the logit (N(0, 1)), the arms' per-item
    deviations (``interaction``), each run (arm, seed) shifted by its seed effect
    (``spread``, a part ``shared`` by the arms of a seed), the arm better by ``effect``. The
    items are a fresh sample of the task's population each trial. The by-seed interval's
    truth is the expected difference on these items over seeds; the crossed interval's is
    the difference on the population (0 with no effect, by symmetry; else from 200,000
    items)."""
    population = 0.0
    if effect:
        big = np.random.default_rng(12345)
        b, a, c = (big.normal(0, s, 200_000) for s in (1.0, interaction, interaction))
        population = float((_expected(b + a + effect, spread) - _expected(b + c, spread)).mean())
    by_seed = crossed = 0
    for _ in range(trials):
        b = rng.normal(0, 1.0, items)
        a, c = rng.normal(0, interaction, (2, items))
        common = rng.standard_normal((seeds, 1))
        shift = [spread * (math.sqrt(shared) * common + math.sqrt(1 - shared)
                           * rng.standard_normal((seeds, 1))) for _ in range(2)]
        arm = (rng.random((seeds, items)) < _sigmoid(b + a + effect + shift[0])).astype(float)
        control = (rng.random((seeds, items)) < _sigmoid(b + c + shift[1])).astype(float)
        fixed = float((_expected(b + a + effect, spread) - _expected(b + c, spread)).mean())
        by_seed += covers(paired_difference(dict(enumerate(arm.mean(1))),
                                             dict(enumerate(control.mean(1)))), fixed)
        crossed += covers(crossed_interval(arm, control), population)
    return {"by seed (t)": by_seed / trials, "by seed and item (crossed)": crossed / trials}
