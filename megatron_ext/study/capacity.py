"""Trainable input parameters as a study's axis: a study whose arms differ in how many
parameters their input trains (the codes and the frozen table 0, a code's projection n x h,
a factorised table of rank r V x r + r x h, the learned table V x h) gets each arm's gap to
the control on the held-out loss against that count, paired by seed, with its interval, as a
table and a figure (``input_capacity.png``). The count is the evaluated checkpoint's own
(evaluation.training_compute: total minus non-input parameters), never a formula.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..metrics.reporting import colours, pyplot, save_figure, signed_range
from . import power
from .evaluation import metric_names
from .spec import Study


def input_parameters(arm_summary: dict) -> Optional[int]:
    """The trainable input parameters of an arm's final checkpoint, or None (not evaluated)."""
    final = arm_summary.get("final")
    if not final:
        return None
    counts = final["parameters"]
    return counts["total"] - counts["non_embedding"]


def points(study: Study, summary: dict) -> list[dict]:
    """``[{"arm", "input_parameters", "gap"}]`` by count: each arm's final held-out loss minus
    the control's, paired by seed (the control: gap None, at its own count); [] when the
    arms other than the control do not span two counts (nothing to put on an axis)."""
    if "valid_loss" not in metric_names(study) or summary["final_iteration"] is None:
        return []
    out = []
    for arm in study.arms:
        count = input_parameters(summary["arms"][arm.name])
        if count is None:
            return []
        gap = None if arm.name == study.control else \
            summary["differences"][arm.name]["valid_loss"]["by_seed"]
        out.append({"arm": arm.name, "input_parameters": count, "gap": gap})
    if len({p["input_parameters"] for p in out if p["arm"] != study.control}) < 2:
        return []
    return sorted(out, key=lambda p: (p["input_parameters"], p["arm"]))


def markdown(study: Study, capacity: list[dict], final: int, family: int = 1,
             depth: int = 2) -> list[str]:
    """The table of the gaps against the count; ``family``: the size of the report's family
    of differences these gaps belong to (the power at Holm's 0.05/family beside 95%)."""
    lines = [f"{'#' * depth} Gap against trainable input parameters", "",
             f"Each arm's final held-out loss (iteration {final:,}) minus `{study.control}`'s, "
             f"paired by seed, mean [95% t interval]; the count is the arm's trainable input "
             f"parameters (its checkpoint's); beside it, what the design detects (as in the "
             f"family table: the smallest gap at 80% expected power and, with a gap of "
             f"interest, its expected power and the seeds for 80%, at 95%"
             + (f" / at Holm's 0.05/{family}" if family > 1 else "") + ").", "",
             f"| arm | trainable input parameters | Δ held-out loss (by seed) | seeds | "
             f"{power.header(family)} |", "|---|---:|---:|---:|---:|"]
    for p in capacity:
        gap, control = p["gap"], p["arm"] == study.control
        lines.append(f"| {p['arm']} | {p['input_parameters']:,} | "
                     + ("control" if control else signed_range(gap)) + " | "
                     + ("" if control else str(gap["n"] if gap else 0)) + " | "
                     + ("" if control else power.cell(
                         gap, family=family, gap=study.reading(p["arm"], study.control)[0]))
                     + " |")
    return lines + ["", "![gap against trainable input parameters](input_capacity.png)", ""]


def plot(study: Study, capacity: list[dict], path: Path) -> None:
    """The gap against the count (symmetric-log axis: 0 is a count here), 95% intervals."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    colour = colours([p["arm"] for p in capacity])
    for p in capacity:
        if p["arm"] != study.control and p["gap"] is None:
            continue  # no seed shared with the control
        gap = p["gap"] or {"mean": 0.0, "low": None}  # the control: 0 by definition
        error = None if gap["low"] is None else [[gap["mean"] - gap["low"]],
                                                 [gap["high"] - gap["mean"]]]
        ax.errorbar([p["input_parameters"]], [gap["mean"]], yerr=error, fmt="o", capsize=4,
                    color=colour[p["arm"]], label=p["arm"])
    smallest = min((p["input_parameters"] for p in capacity if p["input_parameters"]),
                   default=1)
    ax.set_xscale("symlog", linthresh=smallest)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("trainable input parameters (symlog)")
    ax.set_ylabel(f"held-out loss − {study.control}")
    ax.legend(fontsize="small")
    ax.set_title("gap to the control, paired by seed, 95% interval")
    save_figure(fig, path)
