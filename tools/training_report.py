"""Compare the arms' training runs from their metrics files: a table of final train and
validation loss (and perplexity) per arm, and a PNG of the validation-loss curves.

    python tools/training_report.py learned=runs/learned binary=runs/binary gf2=runs/gf2 \\
        --plot valid_loss.png --markdown report.md

Each run is its ``--save`` directory (which holds ``metrics.jsonl``) or a metrics file.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Optional, Sequence

from megatron_ext.files import write_text
from megatron_ext.metric_sinks import summarise_run
from megatron_ext.reporting import number, pyplot, save_figure


def summarise(runs: dict[str, str]) -> dict[str, dict]:
    """Final values per arm: iteration, train loss, validation loss and perplexity."""
    table = {}
    for arm, path in runs.items():
        run = summarise_run(path)
        if run is None:
            raise SystemExit(f"error: {path} holds no training losses: is it a training run?")
        valid = run["valid_curve"]
        table[arm] = {
            "iteration": run["iteration"],
            "train_loss": run["train_loss"],
            "valid_loss": valid[-1][1] if valid else None,
            "valid_ppl": math.exp(valid[-1][1]) if valid else None,
            "valid_curve": valid,
        }
    return table


def markdown(table: dict[str, dict]) -> str:
    lines = ["| arm | iteration | train loss (last log interval) | validation loss | validation ppl |",
             "|---|---:|---:|---:|---:|"]
    for arm, r in table.items():
        lines.append(f"| {arm} | {r['iteration']} | {number(r['train_loss'], '.4f')} | "
                     f"{number(r['valid_loss'], '.4f')} | {number(r['valid_ppl'], '.2f')} |")
    return "\n".join(lines)


def plot(table: dict[str, dict], path: str) -> None:
    fig, ax = pyplot().subplots(figsize=(6, 4), dpi=120)
    for arm, r in table.items():
        if r["valid_curve"]:
            steps, values = zip(*r["valid_curve"])
            ax.plot(steps, values, marker="o", markersize=3, label=arm)
    ax.set_xlabel("iteration")
    ax.set_ylabel("validation loss")
    ax.set_title("Validation loss per input interface")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)


def parse_runs(specs: Sequence[str]) -> dict[str, str]:
    runs = {}
    for spec in specs:
        arm, sep, logdir = spec.partition("=")
        if not sep or not arm or not logdir:
            raise SystemExit(f"error: expected ARM=RUN_DIR (a --save directory or a "
                             f"metrics.jsonl), got {spec!r}")
        runs[arm] = logdir
    return runs


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="ARM=RUN_DIR",
                        help="an arm's name and its --save directory or metrics.jsonl")
    parser.add_argument("--plot", help="write the validation-loss curves to this PNG")
    parser.add_argument("--markdown", help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    table = summarise(parse_runs(args.runs))
    text = markdown(table)
    print(text)
    if args.markdown:
        write_text(args.markdown, text + "\n")
    if args.plot:
        plot(table, args.plot)
        print(f"validation-loss plot: {args.plot}")
    return table


if __name__ == "__main__":
    main(sys.argv[1:])
