"""Trainable parameters per part (input table, backbone, head, total) for each arm, the input's
RMS at initialisation, and the rows of a fixed code.

Counted by megatron_ext/param_count.py from real instantiated Megatron-Core modules (on the
meta device: no memory is allocated), never from a formula. The table also gives each arm's input RMS at step 0: the
learned table starts at N(0, --init-method-std), RMS ≈ that std; a fixed code's RMS is
computed over the whole vocabulary, with the --code-scale that would match the learned one.
Usage::

    python tools/param_report.py --preset smollm2-1.7b
    python tools/param_report.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 \\
        --seq-length 128 --vocab-size 1000 --arms binary learned
    python tools/param_report.py --preset smollm2-1.7b --input-interface random \\
        --code-tiling recode --show-code 4      # the first 4 rows of that code
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

import torch

from megatron_ext.arguments import parse_model_args
from megatron_ext.codes import ARMS
from megatron_ext.model import build_code
from megatron_ext.param_count import count_arms, input_rms, padded_vocab

def format_table(counts: dict, rms: dict, std: float) -> str:
    parts = ("input_table", "backbone", "head", "total")
    lines = [f"{'arm':<9}" + "".join(f"{p:>16}" for p in parts) + f"{'input RMS':>12}"
             + f"{'matching --code-scale':>23}"]
    for arm, c in counts.items():
        value, matching = rms[arm]
        lines.append(f"{arm:<9}" + "".join(f"{c[p]:>16,}" for p in parts)
                     + (f"{'~' + format(value, '.4g'):>12}{'-':>23}" if matching is None
                        else f"{value:>12.4g}{matching:>23.4g}"))
    if "learned" in counts:
        for arm in counts:
            if arm != "learned":
                diff = counts["learned"]["total"] - counts[arm]["total"]
                lines.append(f"learned - {arm}: {diff:,} parameters")
    lines.append(f"input RMS at step 0: the learned table starts at N(0, --init-method-std "
                 f"{std:g});\na fixed code's is over all ids and positions, at --code-scale as "
                 f"given (pm1: RMS = scale)")
    return "\n".join(lines)


def show_code(args: argparse.Namespace, rows: int) -> str:
    """The first ``rows`` ids of the code the flags define: id, code input x(t), and the row's
    bits (position 0 first, one group per block of n positions)."""
    if args.input_interface == "learned":
        raise SystemExit("error: --show-code needs a fixed-code --input-interface")
    vocab = padded_vocab(args, [args.input_interface], args.tensor_model_parallel_size)
    code = build_code(args, vocab)
    low, high = code.bit_values()
    n, ids = code.num_bits, torch.arange(min(rows, vocab))
    bits = code.row_bits(ids, args.hidden_size)
    lines = [f"# {code.describe()}; vocabulary {vocab} (padded), hidden "
             f"{args.hidden_size}, --code-seed {args.code_seed}",
             f"# id x(t) | row bits, position 0 first, blocks of {n}; bit 1 -> {high:g}, "
             f"0 -> {low:g}"]
    for t, x, row in zip(ids.tolist(), code.code_input(ids).tolist(), bits.tolist()):
        text = "".join(map(str, row))
        lines.append(f"{t} {x} | " + " ".join(text[i:i + n] for i in range(0, len(text), n)))
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    def extra(parser):
        parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
        parser.add_argument("--json", action="store_true",
                            help="print the parameter counts as JSON instead of a table")
        parser.add_argument("--show-code", type=int, metavar="ROWS",
                            help="print the first ROWS rows of the code of --input-interface "
                                 "(here default binary) with the --code-* flags, and exit")
        parser.set_defaults(input_interface="binary")
    args = parse_model_args(argv, "Trainable parameters per arm", extra)
    if args.show_code is not None:
        print(show_code(args, args.show_code))
        return {}
    counts = count_arms(args, args.arms)
    print(json.dumps(counts, indent=2) if args.json
          else format_table(counts, input_rms(args, args.arms), args.init_method_std))
    return counts


if __name__ == "__main__":
    main(sys.argv[1:])
