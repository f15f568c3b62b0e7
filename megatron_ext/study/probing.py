"""The study's probes step (a study's optional ``[probes]`` section): megatron_ext/probes on
the checkpoint of every run at the study's common final iteration (the one the rest of the
report reads, so no seed drops out), and their summary across seeds for STUDY.md.

Each run's probes are cached in ``RUN/probes/iter_NNNNNNN.json`` with the settings they
were computed under, like the evaluation (a cache made under other settings, or by another
selectivity estimator, is recomputed).
Runs are probed one at a time, so there is no CKA across arms here (tools/probe.py compares
models). Each run is probed under its own probe seeds (``run_key`` = its training seed:
runs of different seeds draw their own sample, splits and control pairings, the arms of
one seed share theirs), and its numbers are the means over them; the report shows, per arm
and layer, the mean over training seeds of those means with a 95% Student-t interval and
the number of seeds, so the between-seed spread carries the probe's own randomness as well
as training's. Beside them: each probe's chance, control task, selectivity, unseen-type
score and position transfer, for the trained models and their random initialisations, and
the frequency-only baseline (the same over the seeds; a layer whose selectivity minus the
baseline's, paired by seed, has an interval reaching 0 is marked ‡).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

from ..checkpoint.layout import completed_iterations, iteration_name
from ..datasets.held_out import cut_documents, indexed_documents
from ..metrics.reporting import mean_interval, signed_range
from ..probes.report import (BASELINE, INITS, LABELS, SELECTIVITY_NOTE, beats_baseline,
                             chance_line, trivial_note)
from ..probes.report import plot as plot_layers
from ..probes.settings import ESTIMATOR, SELECTIVITY
from ..runtime.files import write_json

from . import power
from .spec import Study, run_dir
from .stats import holm, paired_difference, t_interval

# The table's columns (labelled by :data:`megatron_ext.probes.report.LABELS`): the probe
# tool's, with position transfer beside the bits and without the per-seed ridge and the
# read-outs' accuracies.
METRICS = ("id_bits", "id_bits_control", "id_bits_selectivity", "id_bits_unseen",
           "id_bits_position_transfer", "id_topk", "prev_bits", "prev_bits_control",
           "prev_bits_selectivity", "prev_bits_unseen", "prev_bits_position_transfer",
           "prev_topk", "lens_loss", "readout_loss")
# Compared between every two arms, paired by seed, per layer (trained models).
PAIRED = ("id_bits_selectivity", "prev_bits_selectivity", "readout_loss")
PLOTTED = ("id_bits", "id_topk", "prev_bits", "prev_topk", "lens_loss", "readout_loss")


def cache_path(run: Path, iteration: int) -> Path:
    return run / "probes" / f"{iteration_name(iteration)}.json"


def read_probes(run: Path, iteration: int, settings) -> Optional[dict]:
    path = cache_path(run, iteration)
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    same = (record["settings"] == dataclasses.asdict(settings)
            and record.get("estimator") == ESTIMATOR)
    return record if same else None


def probe_study(study: Study, study_dir: Path, final: Optional[int], progress=print) -> dict:
    """Probe each run's checkpoint at ``final`` (the study's common final iteration) unless
    cached; ``{"probed": n, "cached": m}``."""
    from ..probes.frequency import training_unigrams
    from ..probes.models import describe
    from ..probes.run import run_probes
    settings, counts = study.probes, {"probed": 0, "cached": 0}
    for arm, seed in study.runs() if final is not None else ():
        run = run_dir(study_dir, arm, seed)
        if final not in completed_iterations(run / "checkpoints"):
            continue
        if read_probes(run, final, settings) is not None:
            counts["cached"] += 1
            continue
        progress(f"[probes] {run} iteration {final}")
        info = describe(str(run / "checkpoints"), arm.name, final)
        windows, documents = cut_documents(
            indexed_documents(settings.data_path), settings.tokens, info.context,
            f"probes data_path {settings.data_path}", "probes tokens")
        record = run_probes([info], windows, documents, settings, f"the first "
                            f"{settings.tokens:,} tokens of {settings.data_path}",
                            training_unigrams([info], settings.unigram_counts),
                            progress=progress, run_key=seed)
        path = cache_path(run, final)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(str(path), record)
        counts["probed"] += 1
    return counts


def summarise(study: Study, study_dir: Path, final: Optional[int]) -> dict:
    """``{arm: {"seeds", "chance", "trained": [layer rows], "random_init": [...]}}``: each
    metric of each layer as a t interval over the seeds probed at ``final``
    (:func:`arm_summary`)."""
    out = {}
    for arm in study.arms if final is not None else ():
        records = {seed: r for seed in study.seeds
                   for r in [read_probes(run_dir(study_dir, arm, seed), final, study.probes)]
                   if r is not None}
        if records:
            out[arm.name] = arm_summary(arm.name, records)
    return out


def arm_summary(arm: str, records: dict) -> dict:
    """One arm's entry of :func:`summarise` from its runs' probe records (``{seed: the
    probes' result}``): each metric of each layer a t interval over the seeds, and each
    trained layer's selectivity against the frequency-only baseline, paired by seed
    (``versus_frequency``, :func:`megatron_ext.probes.report.beats_baseline`)."""
    first = next(iter(records.values()))
    entry = {"seeds": sorted(records), "chance": first["chance"],
             "tokens_sha256": sorted({r["tokens_sha256"] for r in records.values()})}
    for init in ("trained", "random_init"):
        per_seed = [r["models"][arm][init] for r in records.values()]
        entry[init] = [
            {"layer": layer, **({"note": rows[0]["note"]} if "note" in rows[0] else {}),
             # marked when every seed's row is
             "trivial": {t: why for t, why in rows[0].get("trivial", {}).items()
                         if all(t in row.get("trivial", {}) for row in rows)},
             **{m: t_interval([row[m] for row in rows]) for m in METRICS
                if all(row.get(m) is not None for row in rows)}}
            for layer, rows in enumerate(zip(*per_seed))]
    entry["frequency_baseline"] = {
        m: t_interval([r["frequency_baseline"][m] for r in records.values()])
        for m in METRICS if all(r["frequency_baseline"].get(m) is not None
                                   for r in records.values())}
    for layer, row in enumerate(entry["trained"]):
        row["versus_frequency"] = {}
        for m in SELECTIVITY:
            gaps = [r["models"][arm]["trained"][layer][m] - r["frequency_baseline"][m]
                    for r in records.values()
                    if r["models"][arm]["trained"][layer].get(m) is not None
                    and r["frequency_baseline"].get(m) is not None]
            if gaps:
                row["versus_frequency"][m] = beats_baseline(gaps)
    entry["by_seed"] = {seed: [{m: row.get(m) for m in PAIRED}
                               for row in r["models"][arm]["trained"]]
                        for seed, r in records.items()}
    return entry


def differences(summary: dict) -> list[dict]:
    """Every two arms ``a``, ``b`` (in study order), per layer both have: ``b - a`` of each
    :data:`PAIRED` metric, paired by seed (:func:`paired_difference`)."""
    arms, out = list(summary), []
    for i, a in enumerate(arms):
        for b in arms[i + 1:]:
            x, y = summary[a]["by_seed"], summary[b]["by_seed"]
            layers = min(len(next(iter(x.values()))), len(next(iter(y.values()))))
            rows = []
            for layer in range(layers):
                row = {"layer": layer}
                for m in PAIRED:
                    values = [({s: v[layer][m] for s, v in side.items()
                                if v[layer][m] is not None}) for side in (y, x)]
                    row[m] = paired_difference(*values)
                rows.append(row)
            out.append({"a": a, "b": b, "layers": rows})
    return out


def markdown(study: Study, summary: dict, final: int) -> str:
    settings = study.probes
    chance = next(iter(summary.values()))["chance"]
    lines = [f"## Probes at the common final iteration ({final:,})", "",
             f"megatron_ext/probes (docs/probes.md) on the first {settings.tokens:,} tokens of "
             f"`{settings.data_path}`, {settings.sample:,} sampled positions, K = "
             f"{settings.top_k}: mean over training seeds ± 95% Student-t interval, the seeds "
             f"in each cell in brackets; each seed's value is the mean over its own "
             f"{settings.probe_seeds} probe seed(s) (split, control pairing and sample drawn "
             f"per training seed), so the interval carries the probe's randomness as well as "
             f"training's. Control tasks paired by training-corpus unigram frequency. Linear "
             f"probes of the current and previous token (id bits, top-K classes) fitted on "
             f"half of the documents, scored on the other half; "
             f"next-token loss by the logit lens and a trained read-out. Layer 0 is the "
             f"input (†).", ""]
    if settings.allow_train_text:
        lines += ["**Held-out check overridden (`allow_train_text`)**: the probes' tokens may "
                  "be training text.", ""]
    lines += [chance_line(chance) + " Position transfer (fitted on positions < S/2, scored "
              f"on the rest) chance: id bits {_fmt_chance(chance, 'id_bits')}, prev bits "
              f"{_fmt_chance(chance, 'prev_bits')}.", "",
              "| arm | layer | " + " | ".join(LABELS[m] for m in METRICS) + " |",
              "|---|---|" + "---:|" * len(METRICS)]
    baseline = next(iter(summary.values()))["frequency_baseline"]
    lines.append(f"| {BASELINE} | — | " + " | ".join(_cell(baseline, m) for m in METRICS)
                 + " |")
    notes, reasons = {}, set()
    for arm, entry in summary.items():
        for init, suffix in INITS:
            for row in entry[init]:
                layer = str(row["layer"])
                if "note" in row:
                    layer += " (input)†"
                    notes.setdefault(row["note"], set()).add(arm)
                reasons |= set(row.get("trivial", {}).values())
                lines.append(f"| {arm}{suffix} | {layer} | " + " | ".join(
                    _cell(row, m) for m in METRICS) + " |")
    lines += ["", SELECTIVITY_NOTE, "", "† " + "; ".join(f"{note} ({', '.join(sorted(arms))})"
                                                    for note, arms in notes.items()) + ".",
              "", trivial_note(reasons), "", "![probes per layer](probes.png)", ""]
    pairs = differences(summary)
    if pairs:
        members = [row[m] for pair in pairs for row in pair["layers"] for m in PAIRED]
        adjusted = iter(holm([None if d is None else d["p"] for d in members]))
        tested = sum(d is not None and d["p"] is not None for d in members)
        lines += ["### Probes: differences between arms, paired by seed", "",
                  f"b − a per layer (trained models): mean and 95% t interval of the per-seed "
                  f"differences, unadjusted, and beside each its Holm-adjusted p-value over "
                  f"the family of its {tested} with a p-value, of all {len(members)} "
                  f"({len(pairs)} pairs of arms × layers × {len(PAIRED)} metrics): a "
                  f"difference is significant after adjustment "
                  f"when its Holm p < 0.05. Beside each, at 95%"
                  + (f" and, after the `/`, at Holm's 0.05/{tested}" if tested > 1 else "")
                  + f". {power.NOTE}", "",
                  "| b − a | layer | " + " | ".join(f"Δ {LABELS[m]}" for m in PAIRED) + " | "
                  + " | ".join(f"80% expected power: Δ {LABELS[m]}" for m in PAIRED) + " |",
                  "|---|---|" + "---:|" * (2 * len(PAIRED))]
        for pair in pairs:
            for row in pair["layers"]:
                cells = []
                for m in PAIRED:
                    p_holm = next(adjusted)
                    cells.append(signed_range(row[m], 3) + ("" if p_holm is None else
                                                            f" (Holm p {p_holm:.2g})"))
                cells += [power.cell(row[m], 3, family=tested) for m in PAIRED]
                lines.append(f"| {pair['b']} − {pair['a']} | {row['layer']} | "
                             + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _fmt_chance(chance: dict, task: str) -> str:
    value = chance.get(f"{task}_position_transfer")
    return "—" if value is None else f"{value:.3f}"


def _cell(row: dict, metric: str) -> str:
    interval = row.get(metric)
    if interval is None:
        return "—"
    mark = "*" if metric in row.get("trivial", {}) else ""
    if not row.get("versus_frequency", {}).get(metric, {}).get("beats", True):
        mark = "‡" + mark
    return f"{mean_interval(interval, 3)}{mark} ({interval['n']})"


def plot(summary: dict, path: Path) -> None:
    curves = []
    for arm, entry in summary.items():
        for init, style in (("trained", "-"), ("random_init", "--")):
            rows = entry[init]
            curves.append({
                "label": f"{arm}{dict(INITS)[init]}", "group": arm,
                "style": style,
                "trivial": {m: [m in r.get("trivial", {}) for r in rows] for m in PLOTTED},
                "values": {m: [r[m]["mean"] if m in r else None for r in rows] for m in PLOTTED},
                "bands": {m: [(r[m]["low"], r[m]["high"]) if m in r else (None, None)
                              for r in rows] for m in PLOTTED}})
    chance = next(iter(summary.values()))["chance"]
    plot_layers(curves, chance, path, "probes per layer: mean over seeds, 95% interval "
                                      "shaded; dashed: random init")
