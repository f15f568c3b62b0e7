"""Trainable parameters per part (input table, backbone, head, total) of each arm and each
arm's input RMS at initialisation, for a model shape given by the model flags, and the first
rows of a fixed code (tools/param_report.py prints them; bench/bench_state_bytes.py sizes a
run's state with them).

Counted from real instantiated Megatron-Core modules (on the meta device: no memory is
allocated), never from a formula. The learned table starts at N(0, --init-method-std), RMS ≈
that std; a fixed code's RMS is computed over the whole vocabulary.
"""

from __future__ import annotations

import argparse
import copy
from typing import Sequence

import torch

from ..codes.kernels import fixed_code_forward, lookup_tables
from ..codes.limits import require_vocab_fits
from ..codes.schemes import FixedCode
from ..config.arguments import padded_vocab_size
from ..runtime.errors import FlagError
from ..runtime.initialize import destroy_distributed, initialize_distributed
from .provider import build_code, model_provider


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


def arm_args(args: argparse.Namespace, arm: str) -> argparse.Namespace:
    """``args`` for one arm."""
    out = copy.copy(args)
    out.input_interface = arm
    return out


def padded_vocab(args: argparse.Namespace, arms: Sequence[str], tp: int = 1) -> int:
    """The vocabulary as training pads it at TP size ``tp``; refused, as training refuses
    it, when a fixed-code arm of ``arms`` cannot code every id of it."""
    if args.vocab_size is None:
        raise FlagError("--vocab-size is required (or use --preset)")
    padded = padded_vocab_size(args.vocab_size, args.make_vocab_size_divisible_by, tp)
    if any(arm != "learned" for arm in arms):
        require_vocab_fits(padded, args.code_bits, args.vocab_size)
    return padded


def count_arms(args: argparse.Namespace, arms: Sequence[str]) -> dict:
    """``{arm: {part: count}}`` for a model shape given by ``args``."""
    counts, vocab = {}, padded_vocab(args, arms)
    started = not torch.distributed.is_initialized()  # else the caller's, left running
    if started:
        initialize_distributed("cpu")
    try:
        for arm in arms:
            with torch.device("meta"):
                model = model_provider(arm_args(args, arm), vocab, on_cpu=True)
            counts[arm] = count_parameters(model)
    finally:
        if started:
            destroy_distributed()
    return counts


def code_rms(code: FixedCode, vocab_size: int, hidden_size: int) -> float:
    """RMS of the code's input over every id of the vocabulary and every position."""
    table = code.table if code.table is not None else torch.zeros(0, dtype=torch.int64)
    lookup = lookup_tables(code, hidden_size)
    squares = 0.0
    for start in range(0, vocab_size, 4096):
        ids = torch.arange(start, min(start + 4096, vocab_size))
        rows = fixed_code_forward(code, ids, table, lookup, hidden_size, torch.float32, "torch")
        squares += rows.double().square().sum().item()
    return (squares / (vocab_size * hidden_size)) ** 0.5


def input_rms(args: argparse.Namespace, arms: Sequence[str]) -> dict:
    """``{arm: (input RMS at step 0, --code-scale matching the learned RMS or None)}``."""
    std, vocab = args.init_method_std, padded_vocab(args, arms)
    rms = {}
    for arm in arms:
        if arm == "learned":
            rms[arm] = (std, None)
            continue
        value = code_rms(build_code(arm_args(args, arm), vocab), vocab, args.hidden_size)
        rms[arm] = (value, args.code_scale * std / value)  # the RMS scales with --code-scale
    return rms


def format_table(counts: dict, rms: dict, std: float) -> str:
    """The table tools/param_report.py prints: ``counts`` of :func:`count_arms`, ``rms`` of
    :func:`input_rms`, ``std`` the --init-method-std."""
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


def code_rows(args: argparse.Namespace, rows: int) -> str:
    """The first ``rows`` ids of the code the flags define: id, code input x(t), and the row's
    bits (position 0 first, one group per block of n positions)."""
    if args.input_interface == "learned":
        raise FlagError("--show-code needs a fixed-code --input-interface")
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
