"""The scaling section of a study with factors: the held-out loss and the gap to the control
against training compute over every level, and the saturating power-law fit of each arm
(:mod:`.fit`) extrapolated to the paper's model and budget. :mod:`.report` writes it into
the top ``STUDY.md`` after every level's tables.

Compute is each checkpoint's training FLOPs as the training log's MFU counts them
(:func:`megatron_ext.study.evaluation.training_compute`). A study whose points vary in one
of model size and token budget is fitted in compute, ``L(C)``, extrapolated to the paper's
compute: its recipe's (``examples/smollm2_1p7b/recipe.args``, the SmolLM2 vocabulary) FLOPs
per token times :data:`PAPER_TOKENS`. One that varies both is fitted in both, ``L(N, D)``
(``N`` the control's non-embedding parameters at the level, ``D`` its tokens), never in
compute alone: sizes and budgets trade against each other differently, and one law over
both on one compute axis leaves neither's trend. It is extrapolated to the paper's
recipe's non-embedding parameters and :data:`PAPER_TOKENS`. The fit's rules (the
degrees of freedom to extrapolate, parameters at a bound flagged, the gap also fitted
directly) are :mod:`.fit`'s. Figures: ``loss_vs_flops.png`` (per arm, one line per level
with its 95% band across seeds, the fit dashed: in ``(N, D)``, one dashed line per size
over its budgets), ``gap_vs_flops.png`` (arm − control paired by seed at every evaluated
checkpoint, 95% t interval) and, with downstream tasks, ``downstream_vs_flops.png`` (each
task's metric and its gap, the same way; no fit).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..metrics.reporting import colours, number, pyplot, save_figure, signed_range

from . import fit, power
from .evaluation import label, metric_value
from .spec import REPORTED_SEEDS, Study, read_study_recipe, seeds_for_reported
from .stats import paired_difference

PAPER_RECIPE = "examples/smollm2_1p7b/recipe.args"
TUNED_NEEDS = ("no interval (1 reported seed): an interval needs 2 reported seeds, and one "
               "that detects a gap of a few spreads 3 (5 seeds: the first half choose)")
PAPER_PRESET = "smollm2-1.7b"  # its vocabulary
PAPER_TOKENS = 100e9


def paper_compute() -> float:
    """The paper's training FLOPs: its recipe's FLOPs per token (the log's count) times
    :data:`PAPER_TOKENS`."""
    from ..config.arguments import read_training_flags
    from ..config.model_config import PRESETS, padded_vocab_size
    from ..metrics.flops import flops_per_token
    from ..launch.slurm import REPO
    model = read_training_flags(read_study_recipe(str(REPO / PAPER_RECIPE))).model
    vocab = padded_vocab_size(PRESETS[PAPER_PRESET]["vocab_size"],
                              model.make_vocab_size_divisible_by, 1)
    return flops_per_token(model, vocab) * PAPER_TOKENS


def paper_parameters() -> int:
    """The paper's non-embedding parameters (all but the input table, as the evaluation
    records count them): its recipe's model, counted on the meta device (the local
    implementation: the same parameters as Transformer Engine's)."""
    from ..config.arguments import read_training_flags
    from ..config.model_config import PRESETS
    from ..launch.slurm import REPO
    from ..model.param_count import count_arms
    config = read_training_flags(read_study_recipe(str(REPO / PAPER_RECIPE))).replace(
        vocab_size=PRESETS[PAPER_PRESET]["vocab_size"], transformer_impl="local")
    counts = count_arms(config, ["learned"])["learned"]
    return counts["total"] - counts["input"]


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


def markdown(study: Study, result: dict) -> list[str]:
    points = result["points"]
    others = [a.name for a in study.arms if a.name != study.control]
    needs, trained = (TUNED_NEEDS, seeds_for_reported) if study.tune else (power.NEEDS, None)
    seeds_note = (f" In a tuned study the gaps are over the reported seeds, and the seeds "
                  f"column and the seeds a gap needs count every seed the design trains "
                  f"(the first half choose: {seeds_for_reported(REPORTED_SEEDS)} seeds report "
                  f"{REPORTED_SEEDS})." if study.tune else "")
    lines = ["## Across levels: loss and gap against training compute", "",
             f"Beside each gap, at 95% (unadjusted, as the intervals are). "
             f"{power.NOTE}{seeds_note}", "",
             "| level | FLOPs | tokens | parameters (non-embedding / total, "
             f"{study.control}) | seeds | " + " | ".join(f"{a.name} loss" for a in study.arms)
             + "".join(f" | {arm} − {study.control} (by seed) | 80% expected power"
                       + (" · at the gap of interest: expected power, seeds for 80%"
                          if study.reading(arm, study.control)[0] else "")
                       for arm in others) + " |",
             "|---|---:|---:|---:|---:|" + "---:|" * (len(study.arms) + 2 * len(others))]
    for level, p in sorted(points.items(), key=lambda kv: kv[1]["compute"]):
        params = p["parameters"][study.control]
        # paired at the row's own final iteration (a gap series may run further when a
        # third arm's runs are evaluated less far)
        final_gaps = [paired_difference(p["loss"][arm], p["loss"][study.control])
                      for arm in others]
        reported = len(p["loss"][study.control])
        seeds = (f"{len(study.seeds)} ({reported} reported)" if study.tune else str(reported))
        lines.append(f"| {level} | {p['compute']:.3g} | {p['tokens']:,} | "
                     f"{params['non_embedding']:,} / {params['total']:,} | {seeds} | "
                     + " | ".join(number(np.mean(list(p["loss"][a.name].values())), ".4f")
                                  for a in study.arms)
                     + "".join(f" | {signed_range(gap)} | "
                               + power.cell(gap, needs=needs, trained=trained,
                                            gap=study.reading(arm, study.control)[0])
                               for arm, gap in zip(others, final_gaps)) + " |")
    lines += ["", "![loss against FLOPs](loss_vs_flops.png)", "",
              "![gap to the control against FLOPs](gap_vs_flops.png)", ""]
    if result["task_gaps"]:
        lines += [f"Downstream ({', '.join(result['task_gaps'])}): each task's metric per arm "
                  f"and its difference to {study.control} (paired by seed, 95% t interval) "
                  f"against training FLOPs, every level; no fit.", "",
                  "![downstream metrics against FLOPs](downstream_vs_flops.png)", ""]
    joint = result["axes"] == ["N", "D"]
    return lines + (_fit_in_size_and_budget if joint else _fit_in_compute)(study, result)


def _fit_in_compute(study: Study, result: dict) -> list[str]:
    """The fit section of a study whose points vary in one of size and budget."""
    fits = result["fits"]
    lines = ["### Fit: L(C) = E + A·(C/C₀)^(−α) per arm", ""]
    if fits is None:
        return lines + [f"No fit: {result['refused']}.", ""]
    target, orders = result["target"]["compute"], result["orders_of_magnitude"]["compute"]
    arms = fits["arms"]
    first = next(iter(arms.values()))
    lines += [f"Weighted least squares (scipy, E in [0, min L], α in [0, {fit.ALPHA_MAX:g}]) "
              f"to each level's final mean loss over {fits['levels']} compute levels; 95% "
              f"t intervals ({fits['dof']} degrees of freedom) from the seeds' spread within "
              f"each level, pooled over the levels and paired across arms, through the "
              f"fit's linearisation. C₀ = {first['fit']['reference'][0]:.3g} FLOPs. A "
              f"parameter that ended at a bound is flagged and gets no interval.", ""]
    if not fits["extrapolated"]:
        lines += [f"**No extrapolation to the paper's compute and no intervals: "
                  f"{fits['why_not']}.** The fit below describes the levels only.", ""]
    else:
        lines += [f"**Warning: the value at the paper's compute ({target:.3g} FLOPs, 1.7B "
                  f"parameters × {fit_tokens()} tokens) is an extrapolation over {orders:.1f} "
                  f"orders of magnitude beyond the largest level fitted.** It assumes the "
                  f"same law holds the whole way (same data, recipe and schedule shape); it "
                  f"is a hypothesis to test, not a result.", ""]
    lines += _law_table(study, fits, f"{target:.3g} FLOPs", "per level, by compute")
    if fits["levels"] == fit.MIN_POINTS:
        lines += ["", f"With {fit.MIN_POINTS} levels the fit passes through every point "
                      f"(3 parameters): residuals of 0 say nothing about the law's shape."]
    alpha = arms[study.control]["fit"]["alpha"]
    return lines + [
        "", f"The gap fitted directly, g(C) = g₀ + g₁·log₁₀(C/C₀) (2 parameters, "
            f"paired by seed), and a sensitivity fit with every arm's α fixed at "
            f"{study.control}'s ({alpha:.3f}: the anchor; E and A refitted, the interval "
            f"holds α fixed):", ""] + _gap_table(
        study, fits, ["g₁ (per decade of compute)"], f"{target:.3g} FLOPs",
        f"α fixed at {study.control}'s")


def _fit_in_size_and_budget(study: Study, result: dict) -> list[str]:
    """The fit section of a study whose points vary in both size and budget: L(N, D)."""
    fits = result["fits"]
    lines = ["### Fit: L(N, D) = E + A·(N/N₀)^(−α) + B·(D/D₀)^(−β) per arm", "",
             "The points vary in both model size and token budget, so each arm's loss is "
             "fitted in both (Chinchilla's form), not in compute alone: N is the control's "
             "non-embedding parameters at the level (the backbone every arm of the level "
             "shares), D its tokens trained.", ""]
    if fits is None:
        return lines + [f"No fit: {result['refused']}.", ""]
    target, orders = result["target"], result["orders_of_magnitude"]
    arms = fits["arms"]
    n0, d0 = next(iter(arms.values()))["fit"]["reference"]
    where = f"N = {target['N']:.3g}, D = {target['D']:.3g}"
    lines += [f"Weighted least squares (scipy, E in [0, min L], α and β in "
              f"[0, {fit.ALPHA_MAX:g}]) to each level's final mean loss over {fits['levels']} "
              f"(N, D) points ({fits['values'][0]} sizes, {fits['values'][1]} budgets); 95% "
              f"t intervals ({fits['dof']} degrees of freedom) from the seeds' spread within "
              f"each level, pooled over the levels and paired across arms, through the "
              f"fit's linearisation. N₀ = {n0:,.0f} parameters, D₀ = {d0:,.0f} tokens. A "
              f"parameter that ended at a bound is flagged and gets no interval.", ""]
    if not fits["extrapolated"]:
        lines += [f"**No extrapolation to the paper's model and budget and no intervals: "
                  f"{fits['why_not']}.** The fit below describes the points only.", ""]
    else:
        lines += [f"**Warning: the value at the paper's model and budget ({where}: its "
                  f"recipe's non-embedding parameters × {fit_tokens()} tokens) is an "
                  f"extrapolation over {orders['N']:.1f} orders of magnitude in parameters "
                  f"and {orders['D']:.1f} in tokens beyond the largest fitted.** It assumes "
                  f"the same law holds the whole way (same data, recipe and schedule shape); "
                  f"it is a hypothesis to test, not a result.", ""]
    lines += _law_table(study, fits, where, "per level, by N then D")
    anchor = arms[study.control]["fit"]
    return lines + [
        "", f"The gap fitted directly, g(N, D) = g₀ + g_N·log₁₀(N/N₀) + g_D·log₁₀(D/D₀) "
            f"(3 parameters, paired by seed), and a sensitivity fit with every arm's α and "
            f"β fixed at {study.control}'s ({anchor['alpha']:.3f}, {anchor['beta']:.3f}: the "
            f"anchor; E, A and B refitted, the interval holds α and β fixed):", ""
    ] + _gap_table(study, fits, ["g_N (per decade of parameters)",
                                 "g_D (per decade of tokens)"], where,
                   f"α, β fixed at {study.control}'s")


def _law_table(study: Study, fits: dict, where: str, order: str) -> list[str]:
    """Each arm's exponents, E, amplitudes, loss and gap at ``where`` and residuals."""
    terms = len(fits["axes"])
    exponents, amplitudes = fit.EXPONENTS[:terms], fit.AMPLITUDES[:terms]
    lines = ["| arm | " + " | ".join(fit.SYMBOLS[e] for e in exponents) + " | E | "
             + " | ".join(amplitudes) + f" | loss at {where} | gap to {study.control} there "
             f"| residuals ({order}) |",
             "|---|" + "---:|" * (2 * terms + 3) + "---|"]
    for arm in study.arms:
        f = fits["arms"][arm.name]
        bounds = f["fit"]["at_bound"]
        cells = [_parameter(f[e], bounds.get(e), ".3f") for e in exponents]
        cells.append(_parameter(f["E"], bounds.get("E"), ".3f"))
        cells += [f"{f['fit'][a]:.3f}" + (f" (**at its bound: {a} = 0**)" if a in bounds
                                          else "") for a in amplitudes]
        cells.append(_extrapolated(f["at_target"], bounds, ".3f"))
        cells.append("—" if arm.name == study.control else
                     _with_power(_extrapolated(f["gap_at_target"], bounds, "+.3f"),
                                 None if bounds else f["gap_at_target"]))
        cells.append(", ".join(f"{r:+.4f}" for r in f["fit"]["residuals"]))
        lines.append(f"| {arm.name} | " + " | ".join(cells) + " |")
    return lines


def _gap_table(study: Study, fits: dict, slopes: list[str], where: str, fixed: str
               ) -> list[str]:
    """The directly fitted gap (its slopes and value at ``where``) and the fixed-exponent
    sensitivity, per arm."""
    lines = [f"| arm − {study.control} | " + " | ".join(slopes) + f" | gap at {where} "
             f"(direct fit) | gap there ({fixed}) | direct fit's residuals |",
             "|---|" + "---:|" * (len(slopes) + 2) + "---|"]
    for arm, g in fits["gaps"].items():
        sensitivity = fits["fixed_alpha"]["arms"][arm]["gap_at_target"]
        direct = _with_power(_extrapolated(g["at_target"], {}, "+.3f"), g["at_target"])
        lines.append(f"| {arm} | " + " | ".join(_with_power(_range(s, "+.4f"), s)
                                                for s in g["slopes"])
                     + f" | {direct} | "
                     f"{_with_power(_extrapolated(sensitivity, {}, '+.3f'), sensitivity)} | "
                     + ", ".join(f"{r:+.4f}" for r in g["fit"]["residuals"]) + " |")
    return lines + [""]


def fit_tokens() -> str:
    return f"{PAPER_TOKENS / 1e9:.0f}B"


def _range(interval: dict, spec: str) -> str:
    if interval["low"] is None:
        return f"{format(interval['value'], spec)} (no interval)"
    return (f"{format(interval['value'], spec)} [{format(interval['low'], spec)}, "
            f"{format(interval['high'], spec)}]")


def _with_power(text: str, interval) -> str:
    """``text`` (a gap or slope and its interval) with what the design detects there
    (:func:`.power.cell`), where it has an interval."""
    if interval is None or interval.get("low") is None:
        return text
    return f"{text} (80% expected power: {power.cell(interval, 3)})"


def _parameter(interval: dict, bound, spec: str) -> str:
    """A parameter's value and interval, or its value flagged at its bound."""
    if bound:
        return f"{format(interval['value'], spec)} (**at its bound: {bound}**, no interval)"
    return _range(interval, spec)


def _extrapolated(interval, bounds: dict, spec: str) -> str:
    if interval is None:
        return "— (not extrapolated)"
    if bounds:
        return (f"{format(interval['value'], spec)} (no interval: "
                f"{', '.join(bounds.values())})")
    return _range(interval, spec)


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
