"""A probe run's outputs: ``probes.json`` (everything), ``probes.md`` (the tables) and
``probes.png`` (each metric against the layer: one colour per model, solid trained, dashed
its random initialisation, dotted the control task, grey the chance level). Every file is
written atomically (:mod:`megatron_ext.files`)."""

from __future__ import annotations

import json
from pathlib import Path

from megatron_ext.files import write_text
from megatron_ext.reporting import MISSING, number, pyplot, save_figure

# (key, column title) of the main table; probes show "accuracy (selectivity)" where a
# control task exists.
COLUMNS = (("id_bits", "id bits (sel.)"), ("id_topk", "id top-K"),
           ("prev_bits", "prev bits (sel.)"), ("prev_topk", "prev top-K"),
           ("lens_loss", "lens loss"), ("lens_acc", "lens acc"),
           ("readout_loss", "read-out loss"), ("readout_acc", "read-out acc"))
TRANSFER = (("id_bits", "id bits"), ("id_topk", "id top-K"), ("prev_bits", "prev bits"),
            ("prev_topk", "prev top-K"))
PANELS = (("id_bits", "current token: id bits accuracy"),
          ("id_topk", "current token: top-K accuracy"),
          ("prev_bits", "previous token: id bits accuracy"),
          ("prev_topk", "previous token: top-K accuracy"),
          ("lens_loss", "next token: logit-lens loss"),
          ("readout_loss", "next token: read-out loss"),
          ("readout_acc", "next token: read-out accuracy"),
          ("cka", "linear CKA between models"))
INITS = (("trained", ""), ("random_init", " · random init"))


def _cell(row: dict, key: str) -> str:
    text = number(row[key])
    selectivity = row.get(f"{key}_selectivity")
    return text if selectivity is None else f"{text} ({selectivity:+.3f})"


def _layer(row: dict) -> str:
    return f"{row['layer']} (input)†" if "note" in row else str(row["layer"])


def markdown(result: dict) -> str:
    d, chance = result["data"], result["chance"]
    k = max(d["top_k"].values())
    lines = [f"Held-out tokens: {result['source']}: {d['windows']} windows of "
             f"{d['seq_length']} tokens; {d['sampled']:,} sampled positions, {d['train']:,} "
             f"train the probes (half of the windows), {d['score']:,} score them. Id bits: "
             f"mean over the {d['bits_varying']['id_bits']} of 16 bits that vary; top-K: K = "
             f"{k}. {result['memory']}.", "",
             f"Chance (always the most frequent training label): id bits "
             f"{number(chance['id_bits'])}, control {number(chance['id_bits_control'])}; id "
             f"top-K {number(chance['id_topk'])}; prev bits {number(chance['prev_bits'])}, "
             f"control {number(chance['prev_bits_control'])}; prev top-K "
             f"{number(chance['prev_topk'])}.", "",
             "| model | layer | " + " | ".join(t for _, t in COLUMNS) + " |",
             "|---|---|" + "---:|" * len(COLUMNS)]
    notes = {}
    for name, entry in result["models"].items():
        for init, suffix in INITS:
            for row in entry[init]:
                if "note" in row:
                    notes[row["note"]] = notes.get(row["note"], []) + [f"{name}{suffix}"]
                lines.append(f"| {name}{suffix} | {_layer(row)} | "
                             + " | ".join(_cell(row, key) for key, _ in COLUMNS) + " |")
    lines += ["", "Selectivity (sel.) = accuracy − control-task accuracy (each token type "
              "relabelled with another type's id bits). † Layer 0 is the input to the first "
              "layer, not a learned representation: "
              + "; ".join(f"{note} ({', '.join(sorted(set(n)))})" for note, n in notes.items())
              + ".", "",
              "Position transfer: probes fitted on positions < S/2, scored on positions ≥ S/2.",
              "", "| model | layer | " + " | ".join(t for _, t in TRANSFER) + " |",
              "|---|---|" + "---:|" * len(TRANSFER)]
    for name, entry in result["models"].items():
        for init, suffix in INITS:
            for row in entry[init]:
                lines.append(f"| {name}{suffix} | {_layer(row)} | " + " | ".join(
                    number(row[f"{t}_position_transfer"]) for t, _ in TRANSFER) + " |")
    if result["cka"]:
        layers = max(len(p["trained"]) for p in result["cka"])
        lines += ["", "Linear CKA on the scoring tokens (random initialisations in brackets).",
                  "", "| layer | " + " | ".join(f"{p['a']} vs {p['b']}" for p in result["cka"])
                  + " |", "|---|" + "---:|" * len(result["cka"])]
        for layer in range(layers):
            lines.append(f"| {layer} | " + " | ".join(
                f"{number(p['trained'][layer])} ({number(p['random_init'][layer])})"
                if layer < len(p["trained"]) else MISSING for p in result["cka"]) + " |")
    return "\n".join(lines) + "\n"


def plot(curves: list[dict], chance: dict, path: Path, title: str) -> None:
    """One panel per metric of :data:`PANELS` that some curve has. A curve: ``label``,
    ``group`` (one colour per group), ``style`` ("-", "--", ":"), ``values`` ({metric:
    [value per layer]}) and optionally ``bands`` ({metric: [(low, high) per layer]})."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator
    panels = [(m, t) for m, t in PANELS if any(m in c["values"] for c in curves)]
    columns = 3
    rows = -(-(len(panels) + 1) // columns)  # one more slot holds the legend
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.4 * rows), dpi=110,
                             squeeze=False)
    colours, legend = {}, {}
    for ax, (metric, text) in zip(axes.flat, panels):
        for curve in curves:
            values = curve["values"].get(metric)
            if values is None:
                continue
            colour = colours.setdefault(curve["group"], f"C{len(colours)}")
            x = range(len(values))
            legend.setdefault(curve["label"], ax.plot(
                x, [float("nan") if v is None else v for v in values], curve["style"],
                color=colour, marker="o", markersize=3)[0])
            band = curve.get("bands", {}).get(metric)
            if band and all(low is not None for low, _ in band):
                ax.fill_between(x, *zip(*band), color=colour, alpha=0.2)
        if chance.get(metric) is not None:
            legend.setdefault("chance", ax.axhline(chance[metric], color="grey", lw=1))
        legend.setdefault("layer 0: the input (binary, gf2: the code itself)",
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


def curves(result: dict) -> list[dict]:
    """The figure's curves of one probe run."""
    out = []
    metrics = [m for m, _ in PANELS if m != "cka"]
    for name, entry in result["models"].items():
        for init, suffix in INITS:
            rows = entry[init]
            out.append({"label": f"{name}{suffix}", "group": name,
                        "style": "-" if init == "trained" else "--",
                        "values": {m: [r[m] for r in rows] for m in metrics}})
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
         "probes per layer: solid trained, dashed random init, dotted control task")
    write_text(out_dir / "probes.md", f"# Probes\n\n{text}\n![probes per layer](probes.png)\n")
    write_text(out_dir / "probes.json", json.dumps(result, indent=1) + "\n")
    return text
