"""The study's probes step (a study's optional ``[probes]`` section): megatron_ext/probes on
the latest checkpoint of every run, and their summary across seeds for STUDY.md.

Each run's probes are cached in ``RUN/probes/iter_NNNNNNN.json`` with the settings they
were computed under, like the evaluation (a cache made under other settings is recomputed).
Runs are probed one at a time, so there is no CKA across arms here (tools/probe.py compares
models). The report shows, per arm and layer, the mean over seeds with a 95% Student-t
interval, for the trained models and their random initialisations, at the final iteration.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

from megatron_ext.checkpointing import completed_iterations, iteration_name
from megatron_ext.files import write_json
from megatron_ext.held_out import held_out_tokens
from megatron_ext.reporting import mean_interval
from .spec import Study, run_dir
from .stats import t_interval

METRICS = (("id_bits", "id bits"), ("id_bits_selectivity", "id bits sel."),
           ("id_topk", "id top-K"), ("prev_bits", "prev bits"),
           ("prev_bits_selectivity", "prev bits sel."), ("prev_topk", "prev top-K"),
           ("lens_loss", "lens loss"), ("readout_loss", "read-out loss"))
PLOTTED = ("id_bits", "id_topk", "prev_bits", "prev_topk", "lens_loss", "readout_loss")


def cache_path(run: Path, iteration: int) -> Path:
    return run / "probes" / f"{iteration_name(iteration)}.json"


def read_probes(run: Path, iteration: int, settings) -> Optional[dict]:
    path = cache_path(run, iteration)
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return record if record["settings"] == dataclasses.asdict(settings) else None


def probe_study(study: Study, study_dir: Path, progress=print) -> dict:
    """Probe each run's latest checkpoint unless cached; ``{"probed": n, "cached": m}``."""
    from megatron_ext.probes.models import describe
    from megatron_ext.probes.run import run_probes
    settings, counts = study.probes, {"probed": 0, "cached": 0}
    for arm, seed in study.runs():
        run = run_dir(study_dir, arm, seed)
        iterations = completed_iterations(run / "checkpoints")
        if not iterations:
            continue
        if read_probes(run, iterations[-1], settings) is not None:
            counts["cached"] += 1
            continue
        progress(f"[probes] {run} iteration {iterations[-1]}")
        info = describe(str(run / "checkpoints"), arm.name, iterations[-1])
        windows = held_out_tokens(settings.data_path, settings.tokens, info.context)
        record = run_probes([info], windows, settings, f"the first {settings.tokens:,} "
                            f"tokens of {settings.data_path}", progress=progress)
        path = cache_path(run, iterations[-1])
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(str(path), record)
        counts["probed"] += 1
    return counts


def summarise(study: Study, study_dir: Path, final: Optional[int]) -> dict:
    """``{arm: {"seeds", "chance", "trained": [layer rows], "random_init": [...]}}``: each
    metric of each layer as a t interval over the seeds probed at ``final``."""
    out = {}
    for arm in study.arms if final is not None else ():
        records = {seed: r for seed in study.seeds
                   for r in [read_probes(run_dir(study_dir, arm, seed), final, study.probes)]
                   if r is not None}
        if not records:
            continue
        entry = {"seeds": sorted(records), "chance": next(iter(records.values()))["chance"]}
        for init in ("trained", "random_init"):
            per_seed = [r["models"][arm.name][init] for r in records.values()]
            entry[init] = [
                {"layer": layer, **({"note": rows[0]["note"]} if "note" in rows[0] else {}),
                 **{m: t_interval([row[m] for row in rows]) for m, _ in METRICS
                    if all(row[m] is not None for row in rows)}}
                for layer, rows in enumerate(zip(*per_seed))]
        out[arm.name] = entry
    return out


def markdown(study: Study, summary: dict, final: int) -> str:
    settings = study.probes
    lines = [f"## Probes of the final checkpoint (iteration {final:,})", "",
             f"megatron_ext/probes (docs/probes.md) on the first {settings.tokens:,} tokens of "
             f"`{settings.data_path}`, {settings.sample:,} sampled positions, K = "
             f"{settings.top_k}: mean over seeds ± 95% Student-t interval. Accuracy of linear "
             f"probes of the current and previous token (16 id bits, top-K classes), "
             f"selectivity = id bits − control task; next-token loss by the logit lens and a "
             f"trained read-out. Layer 0 is the input (†).", "",
             "| arm | layer | " + " | ".join(t for _, t in METRICS) + " |",
             "|---|---|" + "---:|" * len(METRICS)]
    notes = {}
    for arm, entry in summary.items():
        for init, suffix in (("trained", ""), ("random_init", " · random init")):
            for row in entry[init]:
                layer = str(row["layer"])
                if "note" in row:
                    layer += " (input)†"
                    notes.setdefault(row["note"], set()).add(arm)
                lines.append(f"| {arm}{suffix} | {layer} | "
                             + " | ".join(mean_interval(row.get(m), 3) for m, _ in METRICS) + " |")
    lines += ["", "† " + "; ".join(f"{note} ({', '.join(sorted(arms))})"
                                   for note, arms in notes.items()) + ".", "",
              "![probes per layer](probes.png)", ""]
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> None:
    from megatron_ext.probes.report import plot as plot_layers
    curves = []
    for arm, entry in summary.items():
        for init, style in (("trained", "-"), ("random_init", "--")):
            rows = entry[init]
            curves.append({
                "label": arm if init == "trained" else f"{arm} · random init", "group": arm,
                "style": style,
                "values": {m: [r[m]["mean"] if m in r else None for r in rows] for m in PLOTTED},
                "bands": {m: [(r[m]["low"], r[m]["high"]) if m in r else (None, None)
                              for r in rows] for m in PLOTTED}})
    chance = next(iter(summary.values()))["chance"]
    plot_layers(curves, chance, path, "probes per layer: mean over seeds, 95% interval "
                                      "shaded; dashed: random init")
