"""The scaling section's markdown (:func:`markdown`): the levels' table of loss and gap
against training compute, each gap with the power its design has, then the fit, in compute
or in model size and budget (the method and the extrapolation's warning, each arm's law,
the gap fitted directly and the fixed-exponent sensitivity)."""

from __future__ import annotations

import numpy as np

from ...metrics.reporting import number, signed_range
from .. import fit, power
from ..spec import REPORTED_SEEDS, Study, seeds_for_reported
from ..stats import paired_difference
from .target import PAPER_TOKENS

TUNED_NEEDS = ("no interval (1 reported seed): an interval needs 2 reported seeds, and one "
               "that detects a gap of a few spreads 3 (5 seeds: the first half choose)")


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
    lines += _method(fits, "α", f"{fits['levels']} compute levels",
                     f"C₀ = {first['fit']['reference'][0]:.3g} FLOPs")
    lines += _extrapolation(
        fits, "the paper's compute", "levels",
        f"{target:.3g} FLOPs, 1.7B parameters × {fit_tokens()} tokens",
        f"{orders:.1f} orders of magnitude beyond the largest level fitted")
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
    lines += _method(fits, "α and β", f"{fits['levels']} (N, D) points ({fits['values'][0]} "
                     f"sizes, {fits['values'][1]} budgets)",
                     f"N₀ = {n0:,.0f} parameters, D₀ = {d0:,.0f} tokens")
    lines += _extrapolation(
        fits, "the paper's model and budget", "points",
        f"{where}: its recipe's non-embedding parameters × {fit_tokens()} tokens",
        f"{orders['N']:.1f} orders of magnitude in parameters and {orders['D']:.1f} in tokens "
        f"beyond the largest fitted")
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


def _method(fits: dict, exponents: str, over: str, references: str) -> list[str]:
    """How the law was fitted: ``exponents`` bounded, over the ``over`` points, the
    ``references`` (C₀; N₀ and D₀)."""
    return [f"Weighted least squares (scipy, E in [0, min L], {exponents} in "
            f"[0, {fit.ALPHA_MAX:g}]) to each level's final mean loss over {over}; 95% t "
            f"intervals ({fits['dof']} degrees of freedom) from the seeds' spread within each "
            f"level, pooled over the levels and paired across arms, through the fit's "
            f"linearisation. {references}. A parameter that ended at a bound is flagged and "
            f"gets no interval.", ""]


def _extrapolation(fits: dict, target: str, described: str, where: str, span: str
                   ) -> list[str]:
    """Why the fit is not extrapolated to ``target`` (it describes the ``described``
    only), or the warning that its value there (``where``) is an extrapolation over
    ``span``."""
    if not fits["extrapolated"]:
        return [f"**No extrapolation to {target} and no intervals: {fits['why_not']}.** The "
                f"fit below describes the {described} only.", ""]
    return [f"**Warning: the value at {target} ({where}) is an extrapolation over {span}.** "
            f"It assumes the same law holds the whole way (same data, recipe and schedule "
            f"shape); it is a hypothesis to test, not a result.", ""]


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
