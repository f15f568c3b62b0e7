"""Compare the arms' training runs from their metrics files: a table of final train and
validation loss (and perplexity) per arm, and a PNG of the validation-loss curves.

    python tools/training_report.py learned=runs/learned binary=runs/binary gf2=runs/gf2 \\
        --plot valid_loss.png --markdown report.md

Each run is its ``--save`` directory (which holds ``metrics.jsonl``) or a metrics file.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from megatron_ext.runtime.errors import FlagError, exits_on_error
from megatron_ext.runtime.files import write_text
from megatron_ext.metrics.training_report import markdown, plot, summarise


def parse_args(argv: Optional[Sequence[str]]) -> tuple[argparse.Namespace, dict]:
    """The flags, and their ``runs`` as ``{arm: run}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="ARM=RUN_DIR",
                        help="an arm's name and its --save directory or metrics.jsonl")
    parser.add_argument("--plot", help="write the validation-loss curves to this PNG")
    parser.add_argument("--markdown", help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    runs = {}
    for spec in args.runs:
        arm, sep, logdir = spec.partition("=")
        if not sep or not arm or not logdir:
            raise FlagError(f"expected ARM=RUN_DIR (a --save directory or a metrics.jsonl), "
                            f"got {spec!r}")
        runs[arm] = logdir
    return args, runs


def main(argv: Optional[Sequence[str]] = None) -> dict:
    with exits_on_error():
        args, runs = parse_args(argv)
        table = summarise(runs)
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
