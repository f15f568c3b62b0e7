"""Trainable parameters per part (input table, backbone, head, total) for each arm.

Counted from real instantiated Megatron-Core modules (on the meta device: no memory is
allocated), never from a formula. Usage::

    python tools/param_report.py --preset smollm2-1.7b
    python tools/param_report.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 \\
        --seq-length 128 --vocab-size 1000 --arms binary learned
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from typing import Optional, Sequence

import torch

from megatron_ext.arguments import padded_vocab_size, parse_model_args
from megatron_ext.initialize import destroy_distributed, initialize_distributed
from megatron_ext.model import model_provider

ARMS = ("learned", "binary", "gf2")


def count_parameters(model: torch.nn.Module) -> dict:
    """Trainable parameters of a GPTModel by part."""
    parts = {"input_table": 0, "backbone": 0, "head": 0}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        part = ("input_table" if name.startswith("embedding.")
                else "head" if name.startswith("output_layer.") else "backbone")
        parts[part] += p.numel()
    parts["total"] = sum(parts.values())
    return parts


def report(args: argparse.Namespace, arms: Sequence[str]) -> dict:
    """``{arm: {part: count}}`` for a model shape given by ``args``."""
    if args.vocab_size is None:
        raise SystemExit("error: --vocab-size is required (or use --preset)")
    counts = {}
    initialize_distributed("cpu")
    try:
        for arm in arms:
            arm_args = copy.copy(args)
            arm_args.input_interface = arm
            arm_args.padded_vocab_size = padded_vocab_size(
                args.vocab_size, args.make_vocab_size_divisible_by, 1)
            with torch.device("meta"):
                model = model_provider(arm_args, on_cpu=True)
            counts[arm] = count_parameters(model)
    finally:
        destroy_distributed()
    return counts


def format_table(counts: dict) -> str:
    parts = ("input_table", "backbone", "head", "total")
    lines = [f"{'arm':<8}" + "".join(f"{p:>16}" for p in parts)]
    for arm, c in counts.items():
        lines.append(f"{arm:<8}" + "".join(f"{c[p]:>16,}" for p in parts))
    if "learned" in counts:
        for arm in counts:
            if arm != "learned":
                diff = counts["learned"]["total"] - counts[arm]["total"]
                lines.append(f"learned - {arm}: {diff:,} parameters")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    def extra(parser):
        parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parse_model_args(argv, "Trainable parameters per arm", extra)
    counts = report(args, args.arms)
    print(json.dumps(counts, indent=2) if args.json else format_table(counts))
    return counts


if __name__ == "__main__":
    main(sys.argv[1:])
