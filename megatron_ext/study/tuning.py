"""A tuned factor (``tune = "lr"`` in a study file): one learning rate for every model size
confounds size with how well that rate suits it, so a study may sweep a factor and compare
each arm at its own best level of it. For every combination of the other factors' levels (a
*group*, e.g. ``d64`` or ``d64/budget_81920``), each arm's chosen level is the one with the
lowest mean final held-out loss over the *selection seeds*; the scaling section
(:mod:`.scaling`) then reads the groups as its levels, each arm's runs of the other seeds
(the *reported seeds*) taken from its chosen cell (differences still paired by seed).

The seeds are split (:func:`.spec.split_seeds`: the first half, rounded down, chooses; the
rest report), so a reported loss is never the one its level was chosen on: a choice made on
the reported runs themselves picks the level whose runs were lucky (the winner's curse:
the chosen loss biased low, most for an arm flat in the factor), which no interval over
those runs accounts for. With one seed the split is impossible: that seed chooses and
reports, and the table says the loss is biased low. A choice at the edge of the grid (its
first or last level, as listed) says the optimum may lie outside it. A group is left out
until every one of its cells is evaluated at the same final iteration. The calibration
suite (:mod:`.calibration`) measures both ways of choosing.
"""

from __future__ import annotations

from ..metrics.reporting import number

from .spec import Study, split_seeds


def tuned_levels(study: Study) -> list[str]:
    """The tuned factor's level names, in the order the study lists them."""
    return [lv.name for lv in next(f for f in study.factors if f.name == study.tune).levels]


def group_of(study: Study, folder: str) -> tuple[str, str]:
    """``(group, tuned level)`` of a cell's folder: the folder without the tuned factor's
    level, and that level."""
    index = [f.name for f in study.factors].index(study.tune)
    parts = folder.split("/")
    return "/".join(parts[:index] + parts[index + 1:]), parts[index]


def best_level(losses: dict, seeds: list):
    """The level (``losses``: ``{level: {seed: loss}}``, in order; ties to the first) with
    the lowest mean loss over ``seeds``; a level missing a loss ranks last."""
    def mean(level) -> float:
        values = [losses[level].get(s) for s in seeds]
        return float("inf") if None in values else sum(values) / len(values)
    return min(losses, key=mean)


def _final_losses(runs: dict, summary: dict) -> dict:
    """``{seed: final held-out loss}`` of one arm's runs in one cell."""
    final = summary["final_iteration"]
    return {seed: run["evals"][final].get("valid_loss") for seed, run in runs.items()}


def choose(study: Study, runs: dict, summaries: dict) -> tuple[dict, dict, dict]:
    """``(runs, summaries, choices)`` by group: each arm's runs of the reported seeds and its
    summary taken from the cell of its chosen level (``runs``, ``summaries``: per cell
    folder, as :func:`.report.collect` and :func:`.report.summarise` give them);
    ``choices``: ``{group: {arm: {"level", "losses": {level: mean final loss over the
    selection seeds}, "edge", "selection", "reported"}}}``, or ``{group: None}`` for a
    group not yet evaluated alike in all its cells."""
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
            losses = {lv: _final_losses(runs[folders[lv]][arm.name], summaries[folders[lv]])
                      for lv in levels}
            seeds = sorted(set.intersection(*(set(v) for v in losses.values())))
            selection, reported = split_seeds(seeds)
            best = best_level(losses, selection)
            means = {lv: (None if None in (v := [losses[lv][s] for s in selection])
                          else sum(v) / len(v)) for lv in levels}
            choices[group][arm.name] = {"level": best, "losses": means,
                                        "edge": best in (levels[0], levels[-1]),
                                        "selection": selection, "reported": reported}
            tuned_runs[group][arm.name] = {s: runs[folders[best]][arm.name][s]
                                           for s in reported}
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
             f"level with the lowest mean final held-out loss over the selection seeds (the "
             f"losses below); the section below compares the arms there on the other seeds "
             f"(the reported seeds), paired by seed, so no reported loss is the one its "
             f"level was chosen on.", "",
             "| group | arm | " + " | ".join(f"`{lv}`" for lv in levels) + " |",
             "|---|---|" + "---:|" * len(levels)]
    warnings = []
    same_runs = set()
    for group, arms in choices.items():
        if arms is None:
            lines.append(f"| {group} | (not every cell evaluated at the same iteration yet) |"
                         + " |" * len(levels))
            continue
        for arm, choice in arms.items():
            cells = [f"**{number(loss, '.4f')}**" if lv == choice["level"]
                     else number(loss, ".4f") for lv, loss in choice["losses"].items()]
            lines.append(f"| {group} | {arm} | " + " | ".join(cells) + " |")
            if choice["selection"] == choice["reported"]:
                same_runs.add(f"`{arm}` at `{group}`")
            if choice["edge"]:
                warnings.append(f"`{arm}` at `{group}`: its best `{study.tune}` "
                                f"(`{choice['level']}`) is at the edge of the grid")
    split = next((c for arms in choices.values() if arms for c in arms.values()), None)
    if split is not None:
        lines += ["", f"Selection seeds: {', '.join(map(str, split['selection']))}; reported "
                      f"seeds: {', '.join(map(str, split['reported']))}."]
    if same_runs:
        lines += ["", "**One seed: chosen and reported on the same run** (biased low by the "
                      "selection over the levels, the winner's curse): " + ", ".join(
                          sorted(same_runs)) + "."]
    if warnings:
        lines += ["", "**Warning: the optimum may lie outside the grid** (widen it, levels "
                      "listed in order): " + "; ".join(warnings) + "."]
    return lines + [""]
