"""Checking the splits training takes of Megatron indexed datasets (read by :mod:`.indexed`)
before they are used: by training (:mod:`.gpt_datasets`, before Megatron-Core builds its GPT
datasets) and by tools/check_data.py (megatron_ext/preprocess/check.py). Only numpy, the
standard library and the flags' declarations are imported, so this loads fast.

Megatron-Core trusts its files: a truncated ``.bin`` is read past its end only when a sample
lands there, and a split that holds no tokens makes GPTDataset count epochs for ever. Here an
``.idx`` is read with numpy/struct and checked against its ``.bin``, and ``--split`` is turned
into the sequence ranges megatron.core uses (see ``split_ranges``), so that such data is refused
at once, naming the file, the split and the flag to change.
"""

from __future__ import annotations

import itertools
import sys
from typing import Optional

import numpy as np

from ..config.data_config import split_weights
from ..runtime.errors import DataError, joined
from .indexed import IndexCheckError, read_index

SPLITS = ("train", "valid", "test")


def split_ranges(split: str, sequences: int) -> list[Optional[tuple[int, int]]]:
    """The ``[begin, end)`` sequence range of the train, valid and test split of a dataset of
    ``sequences`` sequences under ``--split``, or None for a split of weight 0: what
    megatron.core computes (``parse_and_normalize_split``, ``convert_split_vector_to_split_matrix``
    and the rounding in ``BlendedMegatronDatasetBuilder._build_megatron_dataset_splits``)."""
    weights = split_weights(split)  # a FlagError naming --split
    weights = np.array(weights + [0.0] * (len(SPLITS) - len(weights)), dtype=np.float64)
    bounds = list(itertools.accumulate([0, *(weights / np.sum(weights)).tolist()]))
    return [(int(round(lo * float(sequences))), int(round(hi * float(sequences))))
            if hi > lo else None for lo, hi in zip(bounds[:-1], bounds[1:])]


_REMEDY = {  # what to change when a split is too small, for --data-path and for its own flag
    "train": ("give the train split more weight in --split, or use --train-data-path",
              "give --train-data-path more data"),
    "valid": ("give the valid split more weight in --split, use --valid-data-path, or pass "
              "--eval-iters 0", "give --valid-data-path more data, or pass --eval-iters 0"),
    "test": ("give the test split more weight in --split, or use --test-data-path",
             "give --test-data-path more data"),
}


_MISSING = {  # what to give when a split that is read has no blend of its own
    "train": "give --train-data-path",
    "valid": "give --valid-data-path, or pass --eval-iters 0 (without it no validation runs)",
    "test": "give --test-data-path",
}


def split_problems(blend, blend_per_split, split: Optional[str], seq_length: int,
                   num_samples: list[int]) -> list[str]:
    """Every reason the datasets of a training run cannot be built, as ``error: ...`` lines.

    ``blend``: the ``(prefixes, weights)`` of ``--data-path``, divided by ``split``; or
    ``blend_per_split``: one blend (or None) per split. Each file must pass ``read_index``; each
    split asked for samples (``num_samples``, train/valid/test) must hold, in every file that
    contributes to it, at least one sample of ``seq_length`` + 1 tokens; with blends per split,
    each split asked for samples must have one."""
    problems = []
    if blend_per_split:
        files = [(f"--{name}-data-path", prefix, [i])
                 for i, name in enumerate(SPLITS) if blend_per_split[i]
                 for prefix in blend_per_split[i][0]]
        # Megatron-Core leaves a split without its own blend unbuilt: the run would not read it
        problems = [f"error: the {name} split is read ({num_samples[i]:,} samples) but no "
                    f"--{name}-data-path is given; {_MISSING[name]}"
                    for i, name in enumerate(SPLITS) if num_samples[i] and not blend_per_split[i]]
    else:
        try:
            split_ranges(split, 0)
        except ValueError as e:
            return [f"error: {e}"]
        files = [("--data-path", prefix, range(len(SPLITS))) for prefix in blend[0]]
    needed = seq_length + 1
    for flag, prefix, splits in files:
        try:
            index = read_index(prefix)
        except IndexCheckError as e:
            problems.append(f"error: {flag}: {e}")
            continue
        ranges = None if blend_per_split else split_ranges(split, index.sequences)
        for i in (i for i in splits if num_samples[i]):
            name = SPLITS[i]
            if ranges:
                where = f"{flag} {prefix}: --split {split} gives the {name} split"
                begin, end = ranges[i] or (0, 0)
            else:
                where, (begin, end) = f"{flag} {prefix} holds", (0, index.sequences)
            tokens = index.tokens(begin, end)
            if tokens < needed:
                problems.append(
                    f"error: {where} {end - begin:,} of its {index.sequences:,} {index.unit} "
                    f"({tokens:,} tokens), fewer than the --seq-length {seq_length} + 1 = "
                    f"{needed:,} tokens of one sample; {_REMEDY[name][ranges is None]}")
    return problems


def train_epochs(blend, blend_per_split, split: Optional[str], seq_length: int,
                 train_samples: int) -> list[tuple[str, float]]:
    """``(prefix, epochs)`` per file of the train blend: how many times ``train_samples`` samples
    read its train split, each file drawing its normalized blend weight of them (megatron.core's
    margin of 0.5% aside) and each sample taking ``seq_length`` new tokens."""
    prefixes, weights = blend_per_split[0] if blend_per_split else blend
    weights = weights or [1.0] * len(prefixes)
    epochs = []
    for prefix, weight in zip(prefixes, weights):
        index = read_index(prefix)
        begin, end = ((0, index.sequences) if blend_per_split
                      else split_ranges(split, index.sequences)[0] or (0, 0))
        tokens = index.tokens(begin, end)
        needed = weight / sum(weights) * train_samples * seq_length
        epochs.append((prefix, needed / tokens if tokens else float("inf")))
    return epochs


def check_train_epochs(blend, blend_per_split, split: Optional[str], seq_length: int,
                       train_samples: int, max_epochs: Optional[float]) -> None:
    """Refuse (:class:`DataError`) when a file's train split would be read more than ``max_epochs``
    times; without a limit, warn on stderr when it would be read more than once."""
    over = [(prefix, epochs) for prefix, epochs in
            train_epochs(blend, blend_per_split, split, seq_length, train_samples)
            if epochs > (max_epochs or 1.0)]
    if not over:
        return
    lines = [f"{prefix}: its train split would be read {epochs:,.2f} times by the "
             f"{train_samples:,} train samples of {seq_length} tokens" for prefix, epochs in over]
    if max_epochs is not None:
        raise DataError(joined([f"{line}, more than --max-data-epochs {max_epochs:g}; "
                                "give more data or fewer samples, or raise it" for line in lines]))
    print("\n".join(f"WARNING: {line}: the data repeats (pass --max-data-epochs to refuse)"
                    for line in lines), file=sys.stderr)


def check_training_data(blend, blend_per_split, split: Optional[str], seq_length: int,
                        num_samples: list[int]) -> None:
    """``split_problems``, raised as one :class:`DataError` when there are any."""
    problems = split_problems(blend, blend_per_split, split, seq_length, num_samples)
    if problems:
        raise DataError(joined([p.removeprefix("error: ") for p in problems]))
