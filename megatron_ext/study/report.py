"""The study report: ``STUDY.md``, ``study.json`` and figures, recomputed from the runs' own
records (their ``metrics.jsonl`` and the cached checkpoint evaluations) every time.

Per arm and evaluated iteration: the mean across seeds with a 95% Student-t interval
(unavailable with one seed). At the final iteration (the last one every run has evaluated):
each arm against the control and every other two arms, paired by seed (t interval of the
per-seed differences: the primary interval), and for downstream tasks also the crossed
seeds x items interval (:func:`.stats.crossed_interval`: the task's population of items;
with one seed conditional on that seed, and labelled so in the table). The differences form
one family, named with its size, and each carries its Holm-adjusted p-value beside the
unadjusted one and what its design detects (:mod:`.power`: the smallest gap at 80%
expected power and, for a gap of interest, its expected power and seeds, at 95% and at
Holm's 0.05/m), then what each rules out (its 90% interval: the equivalence bound, TOST at
5%, and with a margin the verdict and the seeds for non-inferiority). Every
row carries the tokens seen and the steps skipped. When the arms differ in trainable input
parameters, the gap against that count (:mod:`.capacity`). With ``[probes]``, the probes of
the final checkpoints per layer (:mod:`.probing`). Each arm has one colour in every figure
(:func:`megatron_ext.metrics.reporting.colours`).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
from pathlib import Path
from typing import Optional

import numpy as np

import megatron_ext
from ..checkpoint.layout import completed_iterations
from ..metrics.reporting import (colours, mean_interval, number, pyplot, save_figure, shown_path,
                                 signed_range, tokens_axis)
from ..metrics.sinks import summarise_run
from ..runtime.errors import StudyError
from ..runtime.files import write_text

from . import capacity, power
from .evaluation import label, metric_names, metric_value, read_cached
from .spec import Study, run_dir
from .stats import crossed_interval, holm, paired_difference, t_interval


def collect(study: Study, study_dir: Path) -> dict:
    """``{arm: {seed: {"tokens_per_iteration", "skipped", "trained", "evals": {it: rec}}}}``
    for the runs that have records."""
    runs, planned = {}, {arm.name: _planned_iterations(study, arm) for arm in study.arms}
    for arm, seed in study.runs():
        run = run_dir(study_dir, arm, seed)
        metrics = run / "checkpoints" / "metrics.jsonl"
        trained = summarise_run(str(metrics)) if metrics.exists() else None
        if trained is None:
            continue
        evals = {}
        for it in completed_iterations(run / "checkpoints"):
            record = read_cached(run, it, study.eval)
            if record is not None:
                evals[it] = record
        runs.setdefault(arm.name, {})[seed] = {
            "tokens_per_iteration": trained["tokens_per_iteration"],
            "skipped": trained["skipped"],
            "trained": trained["iteration"],
            "planned": planned[arm.name],
            "evals": evals,
        }
    return runs


def _planned_iterations(study: Study, arm) -> Optional[int]:
    """The iterations a run of ``arm`` trains for under the study's flags (None where the
    global batch is the data-parallel default, which only the job knows; a study refuses
    batch ramps)."""
    from ..config.arguments import read_training_flags
    from ..config.schedule import train_iters_of_samples
    training = read_training_flags([*study.recipe, *arm.training_flags()]).training
    if training.train_iters is not None:
        return training.train_iters
    if training.global_batch_size:
        return train_iters_of_samples(training.train_samples, training.global_batch_size)
    return None


def summarise(study: Study, runs: dict) -> dict:
    names = metric_names(study)
    evaluated = [set(r["evals"]) for arm in runs.values() for r in arm.values()]
    all_runs = len(evaluated) == len(study.runs())
    common = set.intersection(*evaluated) if evaluated and all_runs else set()
    final = max(common) if common else None
    arms = {}
    for arm in study.arms:
        seeds = runs.get(arm.name, {})
        iterations = sorted(set().union(*(r["evals"] for r in seeds.values()))) if seeds else []
        curve = []
        for it in iterations:
            records = [r["evals"][it] for r in seeds.values() if it in r["evals"]]
            point = {"iteration": it, "tokens": it * _tokens_per_iteration(seeds),
                     "flops": float(np.mean([r["flops"] for r in records])),
                     "parameters": records[0]["parameters"]}
            for name in names:
                values = [_value(r, it, name, arm.name, s) for s, r in seeds.items()
                          if it in r["evals"]]
                if values:
                    point[name] = t_interval(values)
            curve.append(point)
        arms[arm.name] = {
            "flags": arm.training_flags(), "seeds": sorted(seeds),
            "trained_iterations": {s: r["trained"] for s, r in seeds.items()},
            "skipped_steps": {s: r["skipped"] for s, r in seeds.items()},
            "curve": curve,
            "final": next((p for p in curve if p["iteration"] == final), None),
        }
    hashes = sorted({r["valid_tokens_sha256"] for arm in runs.values() for run in arm.values()
                     for r in run["evals"].values() if "valid_tokens_sha256" in r})
    unfinished = [f"{arm} seed {seed} (iteration {r['trained']:,} of {r['planned']:,})"
                  for arm, seeds in runs.items() for seed, r in seeds.items()
                  if r["planned"] is not None and r["trained"] < r["planned"]]
    return {"final_iteration": final, "held_out_sha256": hashes, "unfinished": unfinished,
            "final_tokens": None if final is None else final * _tokens_per_iteration(
                next(iter(runs.values()))),
            "arms": arms,
            "differences": _differences(study, runs, final, names) if final else {},
            "pairwise": _pairwise(study, runs, final, names) if final else []}


def final_iteration(study: Study, study_dir: Path) -> Optional[int]:
    """The last iteration evaluated in every run (the one the report reads), or None."""
    return summarise(study, collect(study, study_dir))["final_iteration"]


def _tokens_per_iteration(seeds: dict) -> int:
    return next(iter(seeds.values()))["tokens_per_iteration"] if seeds else 0


def _differences(study: Study, runs: dict, final: int, names: list[str]) -> dict:
    """Each arm minus the control: ``{arm: {metric: {"by_seed", "by_item"}}}``."""
    return {arm.name: _difference(runs[arm.name], runs[study.control], final, names,
                                  arm.name, study.control)
            for arm in study.arms if arm.name != study.control}


def _pairwise(study: Study, runs: dict, final: int, names: list[str]) -> list[dict]:
    """Every two arms, neither the control (those are :func:`_differences`), in study
    order: ``[{"a", "b", metric: {"by_seed", "by_item"}}]`` of ``b - a``."""
    others = [a.name for a in study.arms if a.name != study.control]
    return [{"a": a, "b": b, **_difference(runs[b], runs[a], final, names, b, a)}
            for i, a in enumerate(others) for b in others[i + 1:]]


def _difference(seeds: dict, control: dict, final: int, names: list[str], arm: str,
                against: str) -> dict:
    shared = sorted(set(seeds) & set(control))
    row = {}
    for name in names:
        row[name] = {"by_seed": paired_difference(_final_by_seed(seeds, final, name, arm),
                                                  _final_by_seed(control, final, name,
                                                                 against))}
        if name != "valid_loss" and shared:
            row[name]["by_item"] = crossed_interval(
                _items_by_seed(seeds, shared, final, name),
                _items_by_seed(control, shared, final, name))
    return row


def _final_by_seed(seeds: dict, final: int, name: str, arm: str) -> dict:
    return {s: _value(r, final, name, arm, s) for s, r in seeds.items()}


def _value(run: dict, iteration: int, name: str, arm: str, seed: int) -> float:
    """Metric ``name`` of run ``arm``/``seed`` at ``iteration``; a missing or non-finite
    value is refused naming the run (never averaged, never a TypeError)."""
    value = metric_value(run["evals"][iteration], name)
    if value is None or not math.isfinite(value):
        raise StudyError(f"{arm}/seed{seed}: {label(name)} at iteration {iteration:,} is "
                         f"{'missing' if value is None else value}: a study's means and "
                         f"intervals cannot take it (evaluate the checkpoint again: "
                         f"`tools/study.py eval`, or remove the run)")
    return value


def _items_by_seed(seeds: dict, shared: list, final: int, name: str) -> np.ndarray:
    """``[seeds, items]``: each item's score at ``final`` in each of the ``shared`` seeds."""
    return np.array([seeds[s]["evals"][final]["tasks"][name]["items"] for s in shared])


def header(study: Study, title: str, hashes: list[str], generated: dict) -> list[str]:
    """The report's title, provenance, recipe, seeds, held-out set, tasks and arms."""
    lines = [f"# Study `{title}`", "",
             f"Generated by `tools/study.py report` on {generated['time']} "
             f"({generated['machine']}; fixedcode {generated['fixedcode']}, megatron-core "
             f"{generated['megatron_core']}) from the runs' metrics files and checkpoint "
             f"evaluations. Intervals are 95%: Student-t over seeds; paired by seed between "
             f"arms (the primary interval); for tasks also one over seeds and items crossed "
             f"(the task's population of items; with one seed it is conditional on that "
             f"seed: an interval for those two trained models, not for the arms). Their "
             f"coverage is measured by simulation: `tools/calibrate.py`.", "",
             f"- Recipe: `{shown_path(study.recipe_path)}`: `{' '.join(study.recipe)}`",
             f"- Seeds: {', '.join(map(str, study.seeds))} (`--seed`); control: "
             f"`{study.control}`"]
    if study.eval.data_path:
        same = ("the same tokens for every run and checkpoint" if len(hashes) <= 1 else
                f"**not the same tokens for every run**: {len(hashes)} different windows "
                f"(arms or levels that change the sequence length or the tokenizer)")
        lines.append(f"- Held-out set: the first {study.eval.tokens:,} tokens of "
                     f"`{shown_path(study.eval.data_path)}` ({same}; sha256 "
                     f"{', '.join(h[:16] + '…' for h in hashes) or '—'})"
                     + (" — **held-out check overridden (`allow_train_text`): this may be "
                        "training text**" if study.eval.allow_train_text else ""))
    if study.eval.tasks:
        lines.append(f"- Tasks: {', '.join(study.eval.tasks)} from "
                     f"`{shown_path(study.eval.data_dir)}`"
                     + (f" (first {study.eval.limit} documents)" if study.eval.limit else ""))
    lines += ["", "| arm | flags |", "|---|---|"]
    lines += [f"| {a.name} | `{' '.join(a.training_flags())}` |" for a in study.arms]
    return lines


NOT_EVALUATED = ("No iteration has been evaluated in every run yet: run `tools/study.py "
                 "eval` once the runs have saved checkpoints.")


def final_sections(study: Study, summary: dict, depth: int = 2) -> list[str]:
    """The final metrics per arm and the differences between arms, under headings of
    ``depth``."""
    names, final, h = metric_names(study), summary["final_iteration"], "#" * depth
    if final is None:
        return [NOT_EVALUATED]
    unfinished = summary.get("unfinished")
    title = "Final metrics" if not unfinished else "Metrics of the runs so far"
    lines = [f"{h} {title}: iteration {final:,} ({summary['final_tokens']:,} tokens)", ""]
    if unfinished:
        lines += [f"Not the runs' final metrics: the last iteration evaluated in every run, "
                  f"while {', '.join(unfinished)} have not finished training.", ""]
    lines += ["| arm | seeds | skipped steps | " + " | ".join(map(label, names)) + " |",
              "|---|---|---|" + "---:|" * len(names)]
    for arm in study.arms:
        a = summary["arms"][arm.name]
        cells = [mean_interval((a["final"] or {}).get(n)) for n in names]
        skipped = sum(a["skipped_steps"].values())
        lines.append(f"| {arm.name} | {len(a['seeds'])} | {skipped} | " + " | ".join(cells)
                     + " |")
    lines += ["", f"{h} Against the control (`{study.control}`): arm − control", ""]
    lines += _difference_table(names, [(arm, row) for arm, row in
                                       summary["differences"].items()], "arm")
    if summary["pairwise"]:
        lines += ["", f"{h} Between the other arms: b − a", ""]
        lines += _difference_table(names, [(f"{p['b']} − {p['a']}", p)
                                           for p in summary["pairwise"]], "b − a")
    lines += [""] + family_table(summary, study) + [""]
    return lines


def family(summary: dict) -> list[tuple[str, str, str, dict]]:
    """The report's differences as one family: ``[(pair, metric, interval kind,
    interval)]`` in table order, each with its unadjusted ``p``."""
    rows = [(f"{arm} − control", row) for arm, row in summary["differences"].items()]
    rows += [(f"{p['b']} − {p['a']}", p) for p in summary["pairwise"]]
    out = []
    for pair, row in rows:
        for name, intervals in row.items():
            if name in ("a", "b"):
                continue
            for kind in ("by_seed", "by_item"):
                if intervals.get(kind) is not None:
                    out.append((pair, name, kind, intervals[kind]))
    return out


def family_size(summary: dict) -> int:
    """The differences of the report's family with a p-value: the ``m`` of its Holm
    adjustment."""
    return sum(interval["p"] is not None for *_, interval in family(summary))


def _pair(pair: str, study: Optional[Study]) -> tuple[str, str]:
    """``(b, a)`` of a family row's ``"b − a"`` (``"arm − control"``)."""
    b, a = pair.split(" − ")
    return b, (study.control if a == "control" and study is not None else a)


def _reading(study: Optional[Study], pair: str, name: str) -> tuple:
    """``(gap of interest, margin)`` of a family row: the study's, for the held-out loss
    only (nats); none for a task's metric."""
    if study is None or name != "valid_loss":
        return None, None
    return study.reading(*_pair(pair, study))


def family_table(summary: dict, study: Optional[Study] = None) -> list[str]:
    """Each difference's unadjusted and Holm-adjusted p-value over the family of every
    difference the report shows (pairs of arms x metrics x intervals), what its design
    detects at 95% and at Holm's 0.05/m (:mod:`.power`; for the held-out loss with the
    study's gap of interest, its expected power and seeds), then what each rules out
    (:func:`equivalence_table`)."""
    members = family(summary)
    adjusted = holm([interval["p"] for *_, interval in members])
    tested = family_size(summary)
    lines = [f"Family of comparisons: the {len(members)} difference intervals above (pairs "
             f"of arms × metrics × by seed / by seed and item), {tested} with a p-value, "
             f"which the Holm adjustment is over. Each interval is 95% unadjusted; the "
             f"Holm-adjusted p-values keep the chance of any false difference in the family at "
             f"5% (a difference is significant after adjustment when its Holm p < 0.05).", "",
             power.NOTE + ("" if tested <= 1 else
                           f" Each is given at the intervals' 95% and, after the `/`, at "
                           f"Holm's 0.05/{tested}: a p-value below it is significant after "
                           f"adjustment whatever the family's other results."), "",
             "| difference | metric | interval | p | Holm p (family of "
             f"{tested}) | {power.header(tested)} | gap of interest |",
             "|---|---|---|---:|---:|---:|---:|"]
    for (pair, name, kind, interval), p_holm in zip(members, adjusted):
        gap, _ = _reading(study, pair, name)
        lines.append(f"| {pair} | {label(name)} | {_kind(kind, interval)} | "
                     f"{number(interval['p'], '.3g')} | {number(p_holm, '.3g')} | "
                     f"{power.cell(interval, family=tested, gap=gap)} | "
                     f"{'—' if gap is None else power.gap_text(gap)} |")
    return lines + [""] + equivalence_table(summary, study)


def _kind(kind: str, interval: dict) -> str:
    return ("by seed" if kind == "by_seed" else
            "by item, conditional on the one seed" if interval.get("conditional") else
            "by seed and item")


def equivalence(summary: dict, study: Optional[Study] = None) -> list[dict]:
    """What each difference of the family rules out (:func:`.power.equivalence`): its 90%
    interval, the smallest equivalence margin shown (TOST at 5%) and, for the held-out loss
    with a margin, the verdict; for an arm against the control, the seeds that would show
    non-inferiority at the margin (80% expected power at a true gap of 0, at the measured
    spread)."""
    out = []
    for pair, name, kind, interval in family(summary):
        _, margin = _reading(study, pair, name)
        found = power.equivalence(interval, margin)
        row = {"pair": pair, "metric": name, "interval": kind, "margin": margin,
               "equivalence": found, "non_inferiority_seeds": None}
        design = power.design(interval)
        if (found is not None and margin is not None and pair.endswith(" − control")
                and design is not None):
            row["non_inferiority_seeds"] = power.non_inferiority_seeds(margin, *design)
        out.append(row)
    return out


def equivalence_table(summary: dict, study: Optional[Study] = None) -> list[str]:
    """The rows of :func:`equivalence` as a table with its note."""
    lines = ["What each difference rules out (Lakens, Scheel & Isager 2018): its 90% "
             "interval, whose two ends are the two one-sided tests at 5% (TOST): the study "
             "shows the difference lies within ±bound for every margin above the bound, and "
             "its upper end is the non-inferiority bound of an arm's held-out loss against "
             "the control (one-sided 5%). With a margin fixed before the study (`margin`), "
             "the verdict, and the seeds per arm that would show an arm non-inferior to the "
             "control at that margin with 80% expected power if the true gap were 0, at the "
             "measured spread. Unadjusted for the family.", "",
             "| difference | metric | interval | 90% interval | equivalence shown for "
             "margins above (TOST 5%) | margin | verdict | seeds for non-inferiority |",
             "|---|---|---|---|---:|---:|---|---:|"]
    for r in equivalence(summary, study):
        found, margin = r["equivalence"], r["margin"]
        interval = next(i for p, n, k, i in family(summary)
                        if (p, n, k) == (r["pair"], r["metric"], r["interval"]))
        seeds = r["non_inferiority_seeds"]
        lines.append(
            f"| {r['pair']} | {label(r['metric'])} | {_kind(r['interval'], interval)} | "
            + ("— | — | " if found is None else
               f"[{found['low']:+.4f}, {found['high']:+.4f}] | ±{found['bound']:.4f} | ")
            + ("—" if margin is None else power.gap_text(margin)) + " | "
            + ("—" if margin is None or found is None else
               f"within ±{margin:.4f}" if found["within"] else "not shown") + " | "
            + ("—" if seeds is None and (margin is None or found is None
                                         or not r["pair"].endswith(" − control"))
               else f"more than {power.MOST_SEEDS:,}" if seeds is None else str(seeds))
            + " |")
    return lines


def markdown(study: Study, title: str, summary: dict, generated: dict) -> str:
    names = metric_names(study)
    lines = header(study, title, summary["held_out_sha256"], generated) + [""]
    lines += final_sections(study, summary)
    if summary["final_iteration"] is None:
        return "\n".join(lines) + "\n"
    if study.eval.data_path:
        lines += ["![validation loss](valid_loss.png)", ""]
    if study.eval.tasks:
        lines += ["![downstream tasks](downstream.png)", ""]
    lines += ["![differences from the control](differences.png)", "",
              "## Every evaluated checkpoint", "",
              "| arm | iteration | tokens | FLOPs | " + " | ".join(map(label, names)) + " |",
              "|---|---:|---:|---:|" + "---:|" * len(names)]
    for arm in study.arms:
        for p in summary["arms"][arm.name]["curve"]:
            lines.append(f"| {arm.name} | {p['iteration']:,} | {p['tokens']:,} | "
                         f"{number(p.get('flops'), '.3g')} | "
                         + " | ".join(mean_interval(p.get(n)) for n in names) + " |")
    return "\n".join(lines) + "\n"


def _difference_table(names: list[str], rows: list, title: str) -> list[str]:
    tasks = [n for n in names if n != "valid_loss"]
    lines = ["| " + title + " | " + " | ".join(f"Δ {label(n)} (by seed)" for n in names)
             + "".join(f" | Δ {label(n)} (by seed and item)" for n in tasks) + " |",
             "|---|" + "---:|" * (len(names) + len(tasks))]
    for name, row in rows:
        cells = [signed_range(row[n]["by_seed"]) for n in names]
        cells += [signed_range(row[n].get("by_item")) for n in tasks]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _plot_curves(study: Study, summary: dict, names: list[str], path: Path) -> None:
    plt = pyplot()
    colour = colours([a.name for a in study.arms])
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4), dpi=110,
                             squeeze=False)
    for ax, name in zip(axes[0], names):
        for arm in study.arms:
            points = [p for p in summary["arms"][arm.name]["curve"] if name in p]
            if not points:
                continue
            x = [p["tokens"] for p in points]
            mean = [p[name]["mean"] for p in points]
            ax.plot(x, mean, marker="o", markersize=3, label=arm.name, color=colour[arm.name])
            band = [(p[name]["low"], p[name]["high"]) for p in points
                    if p[name]["low"] is not None]
            if len(band) == len(points):
                ax.fill_between(x, *zip(*band), alpha=0.2, color=colour[arm.name])
        tokens_axis(ax)
        ax.set_ylabel(label(name))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("mean over seeds, 95% interval shaded")
    save_figure(fig, path)


def _plot_differences(study: Study, summary: dict, names: list[str], path: Path) -> None:
    plt = pyplot()
    arms = list(summary["differences"])
    colour = colours([a.name for a in study.arms])
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 1 + 0.5 * len(arms)),
                             dpi=110, squeeze=False)
    for ax, name in zip(axes[0], names):
        for y, arm in enumerate(arms):
            d = summary["differences"][arm][name]["by_seed"]
            err = None if d["low"] is None else [[d["mean"] - d["low"]], [d["high"] - d["mean"]]]
            ax.errorbar([d["mean"]], [y], xerr=err, fmt="o", capsize=4, color=colour[arm])
            ruled = power.equivalence(d)   # the 90% interval: what the study rules out
            if ruled is not None:
                ax.plot([ruled["low"], ruled["high"]], [y, y], lw=6, alpha=0.35,
                        solid_capstyle="butt", color=colour[arm])
        ax.axvline(0, color="grey", lw=1)
        if name == "valid_loss" and study.margin:   # the margin the verdicts are against
            for edge in (-study.margin, study.margin):
                ax.axvline(edge, color="grey", lw=1, ls="--")
        ax.set_yticks(range(len(arms)), arms)
        ax.set_xlabel(f"Δ {label(name)} vs {study.control}")
        ax.grid(alpha=0.3)
    fig.suptitle(f"iteration {summary['final_iteration']:,}: mean difference (paired by "
                 f"seed), 95% interval (bars)\nand 90% (thick: TOST at 5%, it rules out "
                 f"every margin beyond it)" + (", ±margin dashed" if study.margin else ""))
    save_figure(fig, path)


def write_report(study: Study, study_dir: Path) -> dict:
    """Write STUDY.md, study.json and the PNGs into ``study_dir``; returns the summary. A
    study with factors gets each level's own report in its folder, and at the top every
    level's tables and the scaling section (:mod:`.scaling`; with a tuned factor, over each
    arm's chosen cells, :mod:`.tuning`): ``{"levels": {level: summary}, "scaling": ...,
    "tuned": choices or None}``."""
    from ..runtime.megatron_compat import installed_release
    study_dir = Path(study_dir)
    generated = {"time": datetime.datetime.now(datetime.timezone.utc).strftime(
                     "%Y-%m-%d %H:%M UTC"),
                 "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                 "fixedcode": megatron_ext.__version__,
                 "megatron_core": installed_release()}
    if not study.factors and not study.budgets:
        return _write_cell(study, study_dir, study_dir.name, collect(study, study_dir),
                           generated)
    from .scaling import analysis, figures, section
    runs = {level: collect(cell, study_dir / level) for level, cell in study.cells()}
    summaries = {level: _write_cell(cell, study_dir / level, f"{study_dir.name}/{level}",
                                    runs[level], generated)
                 for level, cell in study.cells()}
    hashes = sorted({h for s in summaries.values() for h in s["held_out_sha256"]})
    lines = header(study, study_dir.name, hashes, generated)
    lines += ["", "| factor | level | flags |", "|---|---|---|"]
    lines += [f"| {f.name} | {lv.name} | `{' '.join(lv.flags)}` |"
              for f in study.factors for lv in f.levels]
    lines += [f"| budget | budget_{b} | WSD cooldown branches to {b:,} tokens |"
              for b in study.budgets]
    lines.append("")
    for level, cell in study.cells():
        lines += [f"## Level `{level}`", "", f"Its report: [{level}/STUDY.md]({level}/STUDY.md).",
                  ""] + final_sections(cell, summaries[level], depth=3)
    result, choices = None, None
    if "valid_loss" in metric_names(study):
        point_runs, point_summaries = runs, summaries
        if study.tune:
            from . import tuning
            point_runs, point_summaries, choices = tuning.choose(study, runs, summaries)
            lines += tuning.markdown(study, choices)
        result = analysis.analyse(study, point_runs, point_summaries)
        if result["points"]:
            figures.plot(study, point_summaries, result, study_dir)
            lines += section.markdown(study, result)
    summary = {"levels": summaries, "scaling": result, "tuned": choices}
    write_text(study_dir / "STUDY.md", "\n".join(lines) + "\n")
    write_text(study_dir / "study.json", json.dumps(
        {"study": study.to_json(), "generated": generated, **summary}, indent=1) + "\n")
    return summary


def _write_cell(study: Study, study_dir: Path, title: str, runs: dict, generated: dict
                ) -> dict:
    """The report of a study without factors (or of one level) in ``study_dir``."""
    summary = summarise(study, runs)
    summary["rules_out"] = equivalence(summary, study) if summary["final_iteration"] else []
    names = metric_names(study)
    if summary["final_iteration"] is not None and names:
        if "valid_loss" in names:
            _plot_curves(study, summary, ["valid_loss"], study_dir / "valid_loss.png")
        if study.eval.tasks:
            _plot_curves(study, summary, list(study.eval.tasks), study_dir / "downstream.png")
        if summary["differences"]:
            _plot_differences(study, summary, names, study_dir / "differences.png")
    text = markdown(study, title, summary, generated)
    summary["input_capacity"] = capacity.points(study, summary)
    if summary["input_capacity"]:
        capacity.plot(study, summary["input_capacity"], study_dir / "input_capacity.png")
        text += "\n" + "\n".join(capacity.markdown(study, summary["input_capacity"],
                                                   summary["final_iteration"],
                                                   family_size(summary)))
    if study.probes and summary["final_iteration"] is not None:
        from . import probing
        summary["probes"] = probing.summarise(study, study_dir, summary["final_iteration"])
        if summary["probes"]:
            probing.plot(summary["probes"], study_dir / "probes.png")
            text += "\n" + probing.markdown(study, summary["probes"],
                                            summary["final_iteration"])
    write_text(study_dir / "STUDY.md", text)
    write_text(study_dir / "study.json", json.dumps(
        {"study": study.to_json(), "generated": generated, **summary}, indent=1) + "\n")
    return summary
