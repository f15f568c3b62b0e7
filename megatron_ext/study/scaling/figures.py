"""The scaling section's figures: ``loss_vs_flops.png`` (per arm, one line per level with its
95% band across seeds, the fit dashed: in ``(N, D)``, one dashed line per size over its
budgets), ``gap_vs_flops.png`` (arm − control paired by seed at every evaluated checkpoint,
95% t interval) and, with downstream tasks, ``downstream_vs_flops.png`` (each task's metric
and its gap, the same way; no fit)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...metrics.reporting import colours, pyplot, save_figure
from .. import fit
from ..evaluation import label
from ..spec import Study


def _metric_lines(ax, study: Study, summaries: dict, name: str, colour: dict,
                  markers: dict) -> None:
    """Each arm's mean ``name`` against FLOPs, one line per level, 95% band across seeds."""
    for level, summary in summaries.items():
        for arm in study.arms:
            curve = [p for p in summary["arms"][arm.name]["curve"] if name in p]
            if not curve:
                continue
            x = [p["flops"] for p in curve]
            ax.plot(x, [p[name]["mean"] for p in curve], color=colour[arm.name],
                    marker=markers.get(level, "o"), markersize=3, lw=1,
                    label=f"{arm.name} {level}")
            if all(p[name]["low"] is not None for p in curve):
                ax.fill_between(x, [p[name]["low"] for p in curve],
                                [p[name]["high"] for p in curve], color=colour[arm.name],
                                alpha=0.15)


def _gap_lines(ax, arm_gaps: dict, colour: dict, markers: dict) -> None:
    """Each arm's paired difference to the control against FLOPs (:func:`gaps`), one line per
    level, 95% interval band."""
    for arm, levels in arm_gaps.items():
        for level, series in levels.items():
            if not series:
                continue
            x = [c for c, _ in series]
            ax.plot(x, [d["mean"] for _, d in series], color=colour[arm],
                    marker=markers.get(level, "o"), markersize=3, lw=1, label=f"{arm} {level}")
            if all(d["low"] is not None for _, d in series):
                ax.fill_between(x, [d["low"] for _, d in series],
                                [d["high"] for _, d in series], color=colour[arm], alpha=0.15)
    ax.axhline(0, color="grey", lw=1)


def _fit_lines(study: Study, result: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(compute, points of the law)`` of each dashed fit line: one over the levels' compute;
    in (N, D), one per size over its budgets (compute ∝ tokens at a size)."""
    points = list(result["points"].values())
    if result["axes"] == ["compute"]:
        grid = np.geomspace(min(p["compute"] for p in points),
                            max(p["compute"] for p in points), 50)
        return [(grid, grid)]
    lines = []
    for n in sorted({p["parameters"][study.control]["non_embedding"] for p in points}):
        mine = [p for p in points if p["parameters"][study.control]["non_embedding"] == n]
        tokens = np.geomspace(min(p["tokens"] for p in mine), max(p["tokens"] for p in mine),
                              20)
        per_token = np.mean([p["compute"] / p["tokens"] for p in mine])
        lines.append((tokens * per_token, np.column_stack([np.full_like(tokens, n), tokens])))
    return lines


def _flops_axes(ax, ylabel: str) -> None:
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)


def plot(study: Study, runs_summaries: dict, result: dict, study_dir: Path) -> None:
    """``loss_vs_flops.png``, ``gap_vs_flops.png`` and, with tasks,
    ``downstream_vs_flops.png``."""
    plt = pyplot()
    colour = colours([a.name for a in study.arms])
    markers = dict(zip(runs_summaries, "osD^v<>ph*"))
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    _metric_lines(ax, study, runs_summaries, "valid_loss", colour, markers)
    if result["fits"]:
        for arm in study.arms:
            f = result["fits"]["arms"][arm.name]["fit"]
            for compute, where in _fit_lines(study, result):
                ax.plot(compute, fit.law_values(f, where), "--", color=colour[arm.name],
                        lw=1.5)
    _flops_axes(ax, "held-out loss")
    ax.set_title("mean over seeds, 95% band; fit dashed")
    save_figure(fig, study_dir / "loss_vs_flops.png")

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    _gap_lines(ax, result["gaps"], colour, markers)
    _flops_axes(ax, f"held-out loss − {study.control}'s")
    ax.set_title("paired by seed, 95% t interval")
    save_figure(fig, study_dir / "gap_vs_flops.png")

    tasks = list(result["task_gaps"])
    if not tasks:
        return
    fig, axes = plt.subplots(2, len(tasks), figsize=(5 * len(tasks), 7), dpi=110,
                             squeeze=False)
    for column, task in enumerate(tasks):
        top, bottom = axes[0][column], axes[1][column]
        _metric_lines(top, study, runs_summaries, task, colour, markers)
        _flops_axes(top, label(task))
        top.set_title("mean over seeds, 95% band")
        _gap_lines(bottom, result["task_gaps"][task], colour, markers)
        _flops_axes(bottom, f"{label(task)} − {study.control}'s")
        bottom.set_title("paired by seed, 95% t interval")
    save_figure(fig, study_dir / "downstream_vs_flops.png")
