"""A probe run's outputs: ``probes.json`` (everything), ``probes.md`` (the tables) and
``probes.png`` (each metric against the layer: one colour per model (:func:`colours`, the
same in a study's figures), solid trained, dashed its random initialisation (each with its
95% interval over the probe seeds shaded), dotted the control task, grey the chance level,
crosses on trivially satisfied points). Each cell is the mean over the probe seeds ± the
half width of its 95% t interval over them (the probe's own randomness given the model);
the frequency-only baseline is the main table's first row, and a selectivity that does not
beat it is marked ‡. Every file is written atomically (:mod:`megatron_ext.runtime.files`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from ..metrics.intervals import t_interval
from ..metrics.reporting import MISSING, colours, number, pyplot, save_figure
from ..runtime.files import write_text

# Each metric's label in a table, for every report that prints it (this one and a study's,
# megatron_ext/study/probing.py).
LABELS = {"ridge": "ridge λ", "id_bits": "id bits", "id_bits_control": "id control",
          "id_bits_selectivity": "id sel.", "id_bits_unseen": "id unseen",
          "id_bits_position_transfer": "id transfer", "id_topk": "id top-K",
          "prev_bits": "prev bits", "prev_bits_control": "prev control",
          "prev_bits_selectivity": "prev sel.", "prev_bits_unseen": "prev unseen",
          "prev_bits_position_transfer": "prev transfer", "prev_topk": "prev top-K",
          "lens_loss": "lens loss", "lens_acc": "lens acc", "readout_loss": "read-out loss",
          "readout_acc": "read-out acc"}
# The main table's columns. Bit probes show accuracy; chance, the control task's accuracy
# and the unseen-type accuracy have their own columns, position transfer a table of its own.
COLUMNS = ("ridge", "id_bits", "id_bits_control", "id_bits_selectivity", "id_bits_unseen",
           "id_topk", "prev_bits", "prev_bits_control", "prev_bits_selectivity",
           "prev_bits_unseen", "prev_topk", "lens_loss", "lens_acc", "readout_loss",
           "readout_acc")
LENS = ("lens_loss", "lens_acc", "readout_loss", "readout_acc")  # none for the baseline
TRANSFER = ("id_bits", "id_topk", "prev_bits", "prev_topk")  # the position transfer's tasks
PANELS = (("id_bits", "current token: id bits accuracy"),
          ("id_topk", "current token: top-K accuracy"),
          ("prev_bits", "previous token: id bits accuracy"),
          ("prev_topk", "previous token: top-K accuracy"),
          ("lens_loss", "next token: logit-lens loss"),
          ("readout_loss", "next token: read-out loss"),
          ("readout_acc", "next token: read-out accuracy"),
          ("cka", "debiased linear CKA between models"))
INITS = (("trained", ""), ("random_init", " · random init"))
TRIVIAL = {"code carried up": "the code holds the id bits linearly and the residual stream "
                              "carries them up",
           "= random init": "within two standard errors of the random initialisation"}
SELECTIVITY_NOTE = (
    "Selectivity (sel.) = the bits read on token types the probe never trained on (the types "
    "cut into two halves alike in training-corpus frequency; each half's tokens scored by a "
    "probe fitted on the other half's), as informedness (true-positive minus false-positive "
    "rate per bit, each type counted once: 0 for a guess independent of the bit, 1 for "
    "perfect), of the task minus that of its control task (each token type relabelled with the "
    "id bits of the type next to it in training-corpus frequency): 0 in expectation on any "
    "text when the probe only memorises types, about 0 when it only reads their frequency. "
    "Unseen: the bits scored on token types no training row has. "
    "Frequency only: the same probes on features holding only the current and previous "
    "tokens' training frequencies (log count and 16 frequency classes); ‡: a selectivity that "
    "does not beat that baseline's (the 95% interval of their difference, paired by seed — "
    "probe seeds in a probe run, training seeds in a study — reaches 0; with one seed, the "
    "difference is not above 0).")
BASELINE = "frequency only"


def beats_baseline(differences: Sequence[float]) -> dict:
    """A selectivity minus the frequency-only baseline's, paired by seed (probe seeds in a
    probe run, training seeds in a study): their t interval and ``beats``, whether it is
    above 0 (with one seed, the difference above 0). A cell that does not beat it is
    marked ‡."""
    interval = t_interval(list(differences))
    low = interval["mean"] if interval["low"] is None else interval["low"]
    return {**interval, "beats": bool(low > 0)}


def _cell(row: dict, key: str) -> str:
    if key == "ridge":
        low, high = min(row[key]), max(row[key])
        return f"{low:g}" if low == high else f"{low:g}–{high:g}"
    value = row.get(key)
    spread = row.get("over_probe_seeds", {}).get(key, {}).get("half_width")
    text = number(value, "+.3f" if key.endswith("_selectivity") else ".3f")
    if value is not None and spread is not None:
        text += f" ± {spread:.3f}"
    if not row.get("versus_frequency", {}).get(key, {}).get("beats", True):
        text += "‡"
    return text + ("*" if key in row.get("trivial", {}) else "")


def span(values) -> str:
    """One count per probe seed: the count, or its range."""
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"


def _layer(row: dict) -> str:
    return f"{row['layer']} (input)†" if "note" in row else str(row["layer"])


def chance_line(chance: dict) -> str:
    return ("Chance (always the most frequent training label, scored on the same tokens): "
            f"id bits {number(chance['id_bits'])}, control {number(chance['id_bits_control'])}, "
            f"unseen {number(chance['id_bits_unseen'])}; id top-K {number(chance['id_topk'])}; "
            f"prev bits {number(chance['prev_bits'])}, control "
            f"{number(chance['prev_bits_control'])}, unseen {number(chance['prev_bits_unseen'])}; "
            f"prev top-K {number(chance['prev_topk'])}.")


def trivial_note(reasons: set) -> str:
    return ("* trivially satisfied: " + "; ".join(f"{r} ({TRIVIAL[r]})" for r in
                                                  sorted(reasons)) + ".") if reasons else ""


def markdown(result: dict) -> str:
    d, chance = result["data"], result["chance"]
    k = max(d["top_k"].values())
    allowed = result["settings"].get("allow_train_text")
    lines = [f"Held-out tokens: {result['source']} (sha256 {result['tokens_sha256'][:16]}…): "
             f"{d['windows']} windows of {d['seq_length']} tokens from {d['documents']} "
             f"documents; {d['sampled']:,} sampled positions, each with a window that lies "
             f"inside one document up to it. Under each of {len(result['probe_seeds'])} probe "
             f"seeds the documents are split anew: {span(d['train'])} positions in "
             f"{span(d['train_documents'])} documents train the probes, {span(d['score'])} in "
             f"the other documents score them ({span(d['unseen']['id_bits'])} of them of a type "
             f"no training row has). Each cell: the mean over the probe seeds ± the half width "
             f"of its 95% t interval over them (the probe's own randomness given the model). "
             f"Control tasks paired by the unigram frequencies of {result['unigrams']}. Id "
             f"bits: mean over the {span(d['bits_varying']['id_bits'])} of {d['num_bits']} bits "
             f"that vary; top-K: K = {k}; ridge λ chosen per layer by cross-validation over "
             f"the training documents unless fixed. {result['memory']['text']}.", ""]
    if allowed:
        lines += ["**Held-out check overridden (`allow_train_text`)**: these tokens may be "
                  "training text of the models.", ""]
    lines += [chance_line(chance), "",
              "| model | layer | " + " | ".join(LABELS[key] for key in COLUMNS) + " |",
              "|---|---|" + "---:|" * len(COLUMNS)]
    lines.append(f"| {BASELINE} | — | " + " | ".join(
        _cell(result["frequency_baseline"], key) if key not in LENS else MISSING
        for key in COLUMNS) + " |")
    notes, reasons = {}, set()
    for name, entry in result["models"].items():
        for init, suffix in INITS:
            for row in entry[init]:
                if "note" in row:
                    notes.setdefault(row["note"], []).append(f"{name}{suffix}")
                reasons |= set(row.get("trivial", {}).values())
                lines.append(f"| {name}{suffix} | {_layer(row)} | "
                             + " | ".join(_cell(row, key) for key in COLUMNS) + " |")
    lines += ["", SELECTIVITY_NOTE + " † Layer 0 is the input to the first layer, not a learned "
              "representation: " + "; ".join(f"{note} ({', '.join(n)})"
                                             for note, n in notes.items()) + ".",
              "", trivial_note(reasons), "",
              "Position transfer: probes fitted on positions < S/2, scored on positions ≥ S/2 "
              "(chance: " + ", ".join(f"{LABELS[k]} {number(chance[f'{k}_position_transfer'])}"
                                      for k in TRANSFER) + ").",
              "", "| model | layer | " + " | ".join(LABELS[k] for k in TRANSFER) + " |",
              "|---|---|" + "---:|" * len(TRANSFER)]
    for name, entry in result["models"].items():
        for init, suffix in INITS:
            for row in entry[init]:
                lines.append(f"| {name}{suffix} | {_layer(row)} | " + " | ".join(
                    _cell(row, f"{t}_position_transfer") for t in TRANSFER) + " |")
    if result["cka"]:
        layers = max(len(p["trained"]) for p in result["cka"])
        lines += ["", "Debiased linear CKA on the scoring tokens: trained (random "
                  "initialisations); in brackets the noise floor, the largest |CKA| against "
                  "row-permuted partners (trained / random init). Values within the floor are "
                  "no evidence of similarity.", "",
                  "| layer | " + " | ".join(f"{p['a']} vs {p['b']}" for p in result["cka"])
                  + " |", "|---|" + "---:|" * len(result["cka"])]
        for layer in range(layers):
            lines.append(f"| {layer} | " + " | ".join(
                f"{number(p['trained'][layer])} ({number(p['random_init'][layer])}) "
                f"[{number(p['trained_floor'][layer])} / {number(p['random_init_floor'][layer])}]"
                if layer < len(p["trained"]) else MISSING for p in result["cka"]) + " |")
    return "\n".join(lines) + "\n"


def plot(curves: list[dict], chance: dict, path: Path, title: str) -> None:
    """One panel per metric of :data:`PANELS` that some curve has. A curve: ``label``,
    ``group`` (one colour per group, :func:`colours`), ``style`` ("-", "--", ":"),
    ``values`` ({metric: [value per layer]}) and optionally ``bands`` ({metric: [(low,
    high) per layer]}) and ``trivial`` ({metric: [bool per layer]}: crossed)."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator
    panels = [(m, t) for m, t in PANELS if any(m in c["values"] for c in curves)]
    columns = 3
    rows = -(-(len(panels) + 1) // columns)  # one more slot holds the legend
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.4 * rows), dpi=110,
                             squeeze=False)
    colour = colours(list(dict.fromkeys(c["group"] for c in curves)))
    legend = {}
    for ax, (metric, text) in zip(axes.flat, panels):
        for curve in curves:
            values = curve["values"].get(metric)
            if values is None:
                continue
            x = range(len(values))
            y = [float("nan") if v is None else v for v in values]
            legend.setdefault(curve["label"], ax.plot(
                x, y, curve["style"], color=colour[curve["group"]], marker="o",
                markersize=3)[0])
            marks = curve.get("trivial", {}).get(metric, ())
            if any(marks):
                legend.setdefault("* trivially satisfied", ax.plot(
                    [i for i, m in zip(x, marks) if m], [v for v, m in zip(y, marks) if m],
                    "x", color=colour[curve["group"]], markersize=8, linestyle="none")[0])
            band = curve.get("bands", {}).get(metric)
            if band and all(low is not None for low, _ in band):
                ax.fill_between(x, *zip(*band), color=colour[curve["group"]], alpha=0.2)
        if chance.get(metric) is not None:
            legend.setdefault("chance", ax.axhline(chance[metric], color="grey", lw=1))
        legend.setdefault("layer 0: the input (fixed codes: the code itself)",
                          ax.axvspan(-0.25, 0.25, color="grey", alpha=0.15, lw=0))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(text, fontsize=9)
        ax.set_xlabel("layer (0 = input)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[len(panels)].legend(legend.values(), legend.keys(), loc="center", fontsize=8)
    fig.suptitle(title)
    save_figure(fig, path)


def _band(row: dict, metric: str) -> tuple:
    spread = row.get("over_probe_seeds", {}).get(metric, {})
    return spread.get("low"), spread.get("high")


def curves(result: dict) -> list[dict]:
    """The figure's curves of one probe run."""
    out = []
    metrics = [m for m, _ in PANELS if m != "cka"]
    for name, entry in result["models"].items():
        for init, suffix in INITS:
            rows = entry[init]
            out.append({"label": f"{name}{suffix}", "group": name,
                        "style": "-" if init == "trained" else "--",
                        "values": {m: [r[m] for r in rows] for m in metrics},
                        "bands": {m: [_band(r, m) for r in rows] for m in metrics},
                        "trivial": {m: [m in r.get("trivial", {}) for r in rows]
                                    for m in metrics}})
        out.append({"label": f"{name} · control task", "group": name, "style": ":",
                    "values": {m: [r[f"{m}_control"] for r in entry["trained"]]
                               for m in ("id_bits", "prev_bits")}})
    for pair in result["cka"]:
        for init, suffix in INITS:
            out.append({"label": f"{pair['a']} vs {pair['b']}{suffix}",
                        "group": f"{pair['a']} vs {pair['b']}",
                        "style": "-" if init == "trained" else "--",
                        "values": {"cka": pair[init]}})
    return out


def write(result: dict, out_dir: Path) -> str:
    """Write probes.json, probes.md and probes.png into ``out_dir``; returns the markdown."""
    out_dir.mkdir(parents=True, exist_ok=True)
    text = markdown(result)
    plot(curves(result), result["chance"], out_dir / "probes.png",
         "probes per layer: solid trained, dashed random init, dotted control task, "
         "x trivially satisfied")
    write_text(out_dir / "probes.md", f"# Probes\n\n{text}\n![probes per layer](probes.png)\n")
    write_text(out_dir / "probes.json", json.dumps(result, indent=1) + "\n")
    return text
