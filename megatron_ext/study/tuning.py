"""A tuned factor (``tune = "lr"`` in a study file): one learning rate for every model size
confounds size with how well that rate suits it, so a study may sweep a factor and compare
each arm at its own best level of it. For every combination of the other factors' levels (a
*group*, e.g. ``d64`` or ``d64/budget_81920``), each arm's chosen level is the one with the
lowest mean final held-out loss over seeds; the scaling section (:mod:`.scaling`) then
reads the groups as its levels, each arm's runs taken from its chosen cell (differences
still paired by seed).

The choice is made on the same held-out tokens the point is then reported on, so the chosen
loss is slightly optimistic (selection over the levels); a choice at the edge of the grid
(its first or last level, as listed) says the optimum may lie outside it. The report says
both. A group is left out until every one of its cells is evaluated at the same final
iteration.
"""

from __future__ import annotations

from typing import Optional

from ..metrics.reporting import number

from .spec import Study


def tuned_levels(study: Study) -> list[str]:
    """The tuned factor's level names, in the order the study lists them."""
    return [lv.name for lv in next(f for f in study.factors if f.name == study.tune).levels]


def group_of(study: Study, folder: str) -> tuple[str, str]:
    """``(group, tuned level)`` of a cell's folder: the folder without the tuned factor's
    level, and that level."""
    index = [f.name for f in study.factors].index(study.tune)
    parts = folder.split("/")
    return "/".join(parts[:index] + parts[index + 1:]), parts[index]


def _final_loss(summary: dict, arm: str) -> Optional[float]:
    final = summary["arms"][arm]["final"]
    return None if not final or "valid_loss" not in final else final["valid_loss"]["mean"]


def choose(study: Study, runs: dict, summaries: dict) -> tuple[dict, dict, dict]:
    """``(runs, summaries, choices)`` by group: each arm's runs and summary taken from the
    cell of its chosen level (``runs``, ``summaries``: per cell folder, as
    :func:`.report.collect` and :func:`.report.summarise` give them); ``choices``:
    ``{group: {arm: {"level", "losses": {level: mean final loss}, "edge"}}}``, or
    ``{group: None}`` for a group not yet evaluated alike in all its cells."""
    levels = tuned_levels(study)
    groups: dict = {}
    for folder in summaries:
        group, level = group_of(study, folder)
        groups.setdefault(group, {})[level] = folder
    tuned_runs, tuned_summaries, choices = {}, {}, {}
    for group, folders in groups.items():
        cells = [summaries[folders[lv]] for lv in levels if lv in folders]
        finals = {s["final_iteration"] for s in cells}
        if len(cells) != len(levels) or None in finals or len(finals) != 1:
            choices[group] = None
            continue
        choices[group], arms = {}, {}
        tuned_runs[group] = {}
        for arm in study.arms:
            losses = {lv: _final_loss(summaries[folders[lv]], arm.name) for lv in levels}
            best = min(levels, key=lambda lv: (losses[lv] is None, losses[lv] or 0.0))
            choices[group][arm.name] = {"level": best, "losses": losses,
                                        "edge": best in (levels[0], levels[-1])}
            tuned_runs[group][arm.name] = runs[folders[best]][arm.name]
            arms[arm.name] = summaries[folders[best]]["arms"][arm.name]
        tuned_summaries[group] = {"final_iteration": cells[0]["final_iteration"],
                                  "final_tokens": cells[0]["final_tokens"], "arms": arms}
    return tuned_runs, tuned_summaries, choices


def markdown(study: Study, choices: dict) -> list[str]:
    """The tuned factor's table (each level's mean final loss per group and arm, the chosen
    one in bold) and its warnings."""
    levels = tuned_levels(study)
    lines = [f"## Tuned factor `{study.tune}`: each arm at its best level", "",
             f"For each group of the other factors' levels, each arm's `{study.tune}` is the "
             f"level with the lowest mean final held-out loss over seeds; the section below "
             f"compares the arms there, paired by seed. The choice is made on the same "
             f"held-out tokens, so the chosen losses are slightly optimistic.", "",
             "| group | arm | " + " | ".join(f"`{lv}`" for lv in levels) + " |",
             "|---|---|" + "---:|" * len(levels)]
    warnings = []
    for group, arms in choices.items():
        if arms is None:
            lines.append(f"| {group} | (not every cell evaluated at the same iteration yet) |"
                         + " |" * len(levels))
            continue
        for arm, choice in arms.items():
            cells = [f"**{number(loss, '.4f')}**" if lv == choice["level"]
                     else number(loss, ".4f") for lv, loss in choice["losses"].items()]
            lines.append(f"| {group} | {arm} | " + " | ".join(cells) + " |")
            if choice["edge"]:
                warnings.append(f"`{arm}` at `{group}`: its best `{study.tune}` "
                                f"(`{choice['level']}`) is at the edge of the grid")
    if warnings:
        lines += ["", "**Warning: the optimum may lie outside the grid** (widen it, levels "
                      "listed in order): " + "; ".join(warnings) + "."]
    return lines + [""]
