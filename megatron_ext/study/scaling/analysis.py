"""The scaling analysis of a study with factors: each level's final points (compute, tokens,
parameters, the loss of every run), the gap to the control paired by seed at every
evaluated checkpoint (held-out loss and each task's metric), and the saturating power-law
fit of :mod:`..fit` extrapolated to the paper's model and budget (:mod:`.target`).

Compute is each checkpoint's training FLOPs as the training log's MFU counts them
(:func:`megatron_ext.study.evaluation.training_compute`). A study whose points vary in one
of model size and token budget is fitted in compute, ``L(C)``, extrapolated to the paper's
compute. One that varies both is fitted in both, ``L(N, D)`` (``N`` the control's
non-embedding parameters at the level, ``D`` its tokens), never in compute alone: sizes and
budgets trade against each other differently, and one law over both on one compute axis
leaves neither's trend. It is extrapolated to the paper's non-embedding parameters and
tokens. The fit's rules (the degrees of freedom to extrapolate, parameters at a bound
flagged, the gap also fitted directly) are :mod:`..fit`'s.
"""

from __future__ import annotations

import numpy as np

from .. import fit
from ..evaluation import metric_value
from ..spec import Study
from ..stats import paired_difference
from .target import PAPER_TOKENS, paper_compute, paper_parameters


def final_points(study: Study, runs: dict, summaries: dict) -> dict:
    """``{level: {"compute", "tokens", "parameters": {arm: {"total", "non_embedding"}},
    "loss": {arm: {seed: loss}}}}`` at each level's
    final iteration, for levels evaluated in every run (``runs``, ``summaries``: per level,
    :func:`.report.collect` and :func:`.report.summarise`)."""
    points = {}
    for level, summary in summaries.items():
        final = summary["final_iteration"]
        if final is None:
            continue
        loss = {arm.name: {s: r["evals"][final]["valid_loss"]
                           for s, r in runs[level][arm.name].items()} for arm in study.arms}
        points[level] = {"compute": float(np.mean([r["evals"][final]["flops"]
                                                   for arm in runs[level].values()
                                                   for r in arm.values()])),
                         "parameters": {a: next(iter(seeds.values()))["evals"][final]
                                        ["parameters"] for a, seeds in runs[level].items()},
                         "tokens": summary["final_tokens"], "loss": loss}
    return points


def gaps(study: Study, runs: dict, name: str = "valid_loss") -> dict:
    """``{arm: {level: [(flops, difference interval)]}}``: arm − control ``name`` (the
    held-out loss or a task's metric), paired by seed, at every iteration both evaluated in
    all their runs."""
    out = {}
    for arm in study.arms:
        if arm.name == study.control:
            continue
        for level, level_runs in runs.items():
            mine, control = level_runs.get(arm.name, {}), level_runs.get(study.control, {})
            if not mine or not control:
                continue
            common = set.intersection(*(set(r["evals"]) for r in [*mine.values(),
                                                                  *control.values()]))
            series = []
            for it in sorted(common):
                d = paired_difference(
                    {s: metric_value(r["evals"][it], name) for s, r in mine.items()},
                    {s: metric_value(r["evals"][it], name) for s, r in control.items()})
                if d is not None:
                    series.append((mine[d["seeds"][0]]["evals"][it]["flops"], d))
            out.setdefault(arm.name, {})[level] = series
    return out


def in_size_and_budget(points: dict, control: str) -> bool:
    """Whether the points vary in both model size (the control's non-embedding
    parameters) and token budget."""
    return (len({p["parameters"][control]["non_embedding"] for p in points.values()}) > 1
            and len({p["tokens"] for p in points.values()}) > 1)


def analyse(study: Study, runs: dict, summaries: dict) -> dict:
    """The points, gaps and (with enough levels) the fits of a study with factors: in
    ``(N, D)`` where the points vary in both, else in compute."""
    points = final_points(study, runs, summaries)
    if in_size_and_budget(points, study.control):
        axes, target = ("N", "D"), {"N": paper_parameters(), "D": PAPER_TOKENS}
        fit_points = {level: {"N": p["parameters"][study.control]["non_embedding"],
                              "D": p["tokens"], "loss": p["loss"]}
                      for level, p in points.items()}
    else:
        axes, target, fit_points = ("compute",), {"compute": paper_compute()}, points
    result = {"points": points, "gaps": gaps(study, runs), "axes": list(axes),
              "target": target,
              "task_gaps": {task: gaps(study, runs, task) for task in study.eval.tasks},
              "fits": None, "refused": None}
    try:
        result["fits"] = fit.fit_arms(fit_points, study.control,
                                      [target[a] for a in axes], axes=axes)
    except ValueError as e:
        result["refused"] = str(e)
    if points:
        result["orders_of_magnitude"] = {
            a: fit.orders_of_magnitude(max(p[a] for p in fit_points.values()), target[a])
            for a in axes}
    return result
