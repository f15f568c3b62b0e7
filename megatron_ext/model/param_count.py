"""Trainable parameters per part (input, backbone, head, total) of each arm and each
arm's input RMS at initialisation, for a model shape given by the model flags, and the first
rows of a fixed code (tools/param_report.py prints them; bench/bench_state_bytes.py sizes a
run's state with them).

Counted from real instantiated Megatron-Core modules (on the meta device: no memory is
allocated), never from a formula. The input's trainable parameters (``input``: the learned or
factorised table, a fixed code's projection; the frozen table and the codes have none) are
their own column. The learned and frozen tables start at N(0, --embedding-init-method-std,
default --init-method-std), RMS ≈ that std, and so does the factorised table's product; a
fixed code's RMS is computed over the whole vocabulary.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..codes.kernels import fixed_code_forward, lookup_tables
from ..codes.schemes import ARMS, SCHEMES, FixedCode, build_code
from ..config.arms import parse_arm
from ..config.model_config import padded_vocab_size
from ..config.run_config import RunConfig
from ..runtime.errors import FlagError
from ..runtime.initialize import destroy_distributed, initialize_distributed
from .provider import model_provider


# The arms that need no flag of their own (factorized needs --input-table-rank).
ARMS_WITHOUT_FLAGS = tuple(arm for arm in ARMS if arm != "factorized")


def count_parameters(model: torch.nn.Module) -> dict:
    """Trainable parameters of a GPTModel by part."""
    parts = {"input": 0, "backbone": 0, "head": 0}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        part = ("input" if name.startswith("embedding.")
                else "head" if name.startswith("output_layer.") else "backbone")
        parts[part] += p.numel()
    parts["total"] = sum(parts.values())
    return parts


def padded_vocab(config: RunConfig, arms: Sequence[str], tp: int = 1) -> int:
    """The vocabulary as training pads it at TP size ``tp``; refused, as training refuses
    it, when a fixed-code arm of ``arms`` cannot code every id of it or a factorized arm's
    rank exceeds it."""
    vocab_size = config.data.vocab_size
    if vocab_size is None:
        raise FlagError("--vocab-size is required (or use --preset)")
    padded = padded_vocab_size(vocab_size, config.model.make_vocab_size_divisible_by, tp)
    for arm in arms:
        parse_arm(arm).config(config).model.check_vocab(padded, vocab_size)
    return padded


def count_arms(config: RunConfig, arms: Sequence[str]) -> dict:
    """``{arm name: {part: count}}`` for a model shape given by ``config``, the flags' config
    before their dependent defaults (each arm's config over it:
    :meth:`~megatron_ext.config.arms.Arm.config`)."""
    counts, vocab = {}, padded_vocab(config, arms)
    started = not torch.distributed.is_initialized()  # else the caller's, left running
    if started:
        initialize_distributed("cpu")
    try:
        for arm in map(parse_arm, arms):
            with torch.device("meta"):
                model = model_provider(arm.config(config), vocab, on_cpu=True)
            counts[arm.name] = count_parameters(model)
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


def input_rms(config: RunConfig, arms: Sequence[str]) -> dict:
    """``{arm name: (input RMS at step 0, --code-scale matching the learned RMS or None)}``."""
    vocab = padded_vocab(config, arms)
    rms = {}
    for arm in map(parse_arm, arms):
        one = arm.config(config).model
        std = one.embedding_init_method_std or one.init_method_std
        if one.input_interface not in SCHEMES:
            rms[arm.name] = (std, None)
            continue
        # with --code-projection the first step's input is the tiled code's
        value = code_rms(build_code(one, vocab), vocab, one.hidden_size)
        rms[arm.name] = (value, one.code_scale * std / value)  # RMS scales with the scale
    return rms


def format_table(counts: dict, rms: dict, std: float) -> str:
    """The table tools/param_report.py prints: ``counts`` of :func:`count_arms`, ``rms`` of
    :func:`input_rms`, ``std`` the --init-method-std."""
    parts = ("input", "backbone", "head", "total")
    width = max(10, *(len(arm) + 1 for arm in counts))
    lines = [f"{'arm':<{width}}" + "".join(f"{p:>16}" for p in parts) + f"{'input RMS':>12}"
             + f"{'matching --code-scale':>23}"]
    for arm, c in counts.items():
        value, matching = rms[arm]
        lines.append(f"{arm:<{width}}" + "".join(f"{c[p]:>16,}" for p in parts)
                     + (f"{'~' + format(value, '.4g'):>12}{'-':>23}" if matching is None
                        else f"{value:>12.4g}{matching:>23.4g}"))
    if "learned" in counts:
        for arm in counts:
            if arm != "learned":
                diff = counts["learned"]["total"] - counts[arm]["total"]
                lines.append(f"learned - {arm}: {diff:,} parameters")
    lines.append(f"input: the input's trainable parameters (the frozen table and the codes: "
                 f"none; --code-projection: n x h)\ninput RMS at step 0: the tables start at "
                 f"N(0, {std:g}) (the factorised one's product too);\na fixed code's is over "
                 f"all ids and positions, at --code-scale as given (pm1: RMS = scale)")
    return "\n".join(lines)


def code_rows(config: RunConfig, rows: int) -> str:
    """The first ``rows`` ids of the code the flags define: id, code input x(t), and the row's
    bits (position 0 first, one group per block of n positions)."""
    model = config.model
    if model.input_interface not in SCHEMES:
        raise FlagError(f"--show-code needs a fixed-code --input-interface, not "
                        f"{model.input_interface}")
    vocab = padded_vocab(config, [model.input_interface],
                         config.parallel.tensor_model_parallel_size)
    code = build_code(model, vocab)
    low, high = code.bit_values()
    n, ids = code.num_bits, torch.arange(min(rows, vocab))
    bits = code.row_bits(ids, model.hidden_size)
    lines = [f"# {code.describe()}; vocabulary {vocab} (padded), hidden "
             f"{model.hidden_size}, --code-seed {model.code_seed}",
             f"# id x(t) | row bits, position 0 first, blocks of {n}; bit 1 -> {high:g}, "
             f"0 -> {low:g}"]
    for t, x, row in zip(ids.tolist(), code.code_input(ids).tolist(), bits.tolist()):
        text = "".join(map(str, row))
        lines.append(f"{t} {x} | " + " ".join(text[i:i + n] for i in range(0, len(text), n)))
    return "\n".join(lines)
