"""Reading and checking Megatron indexed datasets (``.bin/.idx``) before they are used: by
training (megatron_ext/datasets/gpt_datasets.py, before Megatron-Core builds its GPT datasets) and by
tools/check_data.py (megatron_ext/preprocess/check.py). Only numpy and the standard library are imported, so this loads fast.

Megatron-Core trusts its files: a truncated ``.bin`` is read past its end only when a sample
lands there, and a split that holds no tokens makes GPTDataset count epochs for ever. Here an
``.idx`` is read with numpy/struct and checked against its ``.bin``, and ``--split`` is turned
into the sequence ranges megatron.core uses (see ``split_ranges``), so that such data is refused
at once, naming the file, the split and the flag to change.

The ``.idx`` layout (megatron.core's ``_IndexWriter``): magic ``MMIDIDX\\0\\0``, version ``<Q``
(1), dtype code ``<B``, sequence count S ``<Q``, count D ``<Q`` of document indices (documents
+ 1), then S int32 sequence lengths, S int64 byte offsets of the sequences in the ``.bin``, and
D int64 document indices (the first sequence of each document, then S).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import struct
import sys
from typing import Callable, Optional

import numpy as np

from ..runtime.errors import DataError, joined

MAGIC = b"MMIDIDX\x00\x00"
HEADER_BYTES = len(MAGIC) + 8 + 1 + 8 + 8
# megatron.core.datasets.indexed_dataset.DType: the code of each token dtype.
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}
SPLITS = ("train", "valid", "test")


class IndexCheckError(ValueError):
    """A dataset that Megatron-Core would misread; the message names the file."""


@dataclasses.dataclass
class Index:
    """A checked ``.idx``: sequence lengths and document indices (memory-mapped)."""

    prefix: str
    dtype: type
    sequence_lengths: np.ndarray
    document_indices: np.ndarray

    @property
    def sequences(self) -> int:
        return len(self.sequence_lengths)

    @property
    def documents(self) -> int:
        return len(self.document_indices) - 1

    @property
    def unit(self) -> str:
        """What ``--split`` divides: sequences, which are the documents unless sentences were
        split (Megatron-LM's ``--split-sentences``)."""
        return "documents" if self.sequences == self.documents else "sequences"

    def tokens(self, begin: int = 0, end: Optional[int] = None) -> int:
        """Tokens in sequences ``[begin, end)``."""
        return int(np.sum(self.sequence_lengths[begin:end], dtype=np.int64))


def read_index(prefix: str) -> Index:
    """The index of dataset ``prefix``, checked against itself and against the ``.bin`` size."""
    idx_path, bin_path = f"{prefix}.idx", f"{prefix}.bin"
    for path in (idx_path, bin_path):
        if not os.path.isfile(path):
            raise IndexCheckError(f"{path} does not exist")
    idx_size = os.path.getsize(idx_path)
    with open(idx_path, "rb") as f:
        header = f.read(HEADER_BYTES)
    if len(header) < HEADER_BYTES or header[:len(MAGIC)] != MAGIC:
        raise IndexCheckError(f"{idx_path} is not a Megatron index (no {MAGIC!r} header)")
    version, code, sequences, documents = struct.unpack_from("<QBQQ", header, len(MAGIC))
    if version != 1:
        raise IndexCheckError(f"{idx_path}: index version {version} is not supported (only 1)")
    if code not in DTYPES:
        raise IndexCheckError(f"{idx_path}: unknown dtype code {code} (known: "
                              f"{', '.join(f'{c} {t.__name__}' for c, t in DTYPES.items())})")
    expected = HEADER_BYTES + 12 * sequences + 8 * documents
    if idx_size != expected:
        raise IndexCheckError(f"{idx_path} holds {idx_size:,} bytes, but its counts "
                              f"({sequences:,} sequences, {documents:,} document indices) "
                              f"make {expected:,}")
    buffer = np.memmap(idx_path, np.uint8, mode="r")
    lengths = np.frombuffer(buffer, np.int32, sequences, HEADER_BYTES)
    pointers = np.frombuffer(buffer, np.int64, sequences, HEADER_BYTES + 4 * sequences)
    document_indices = np.frombuffer(buffer, np.int64, documents, HEADER_BYTES + 12 * sequences)
    if not (documents and document_indices[0] == 0 and document_indices[-1] == sequences
            and np.all(np.diff(document_indices) >= 0)):
        raise IndexCheckError(f"{idx_path}: its document indices do not run from 0 to its "
                              f"{sequences:,} sequences in order")
    itemsize = np.dtype(DTYPES[code]).itemsize
    ends = np.cumsum(lengths, dtype=np.int64) * itemsize
    if np.any(lengths < 0) or np.any(pointers[1:] != ends[:-1]) or (sequences and pointers[0]):
        raise IndexCheckError(f"{idx_path}: its sequence offsets disagree with its sequence "
                              f"lengths")
    expected = int(ends[-1]) if sequences else 0
    bin_size = os.path.getsize(bin_path)
    if bin_size != expected:
        what = "truncated" if bin_size < expected else "longer than its index says"
        raise IndexCheckError(f"{bin_path} is {what}: {bin_size:,} bytes, but {idx_path} "
                              f"describes {expected:,}")
    return Index(prefix, DTYPES[code], lengths, document_indices)


def token_id_range(index: Index, progress: Callable[[int], None] = lambda nbytes: None,
                   chunk_tokens: int = 1 << 24) -> tuple[Optional[int], Optional[int]]:
    """``(smallest, largest)`` token id in the ``.bin`` (``(None, None)`` when empty), read in
    chunks; ``progress`` is told the bytes of each chunk."""
    total = index.tokens()
    if not total:
        return None, None
    data = np.memmap(f"{index.prefix}.bin", index.dtype, mode="r", shape=(total,))
    lows, highs = [], []
    for start in range(0, total, chunk_tokens):
        chunk = data[start:start + chunk_tokens]
        lows.append(chunk.min())
        highs.append(chunk.max())
        progress(chunk.nbytes)
    return int(min(lows)), int(max(highs))


def split_ranges(split: str, sequences: int) -> list[Optional[tuple[int, int]]]:
    """The ``[begin, end)`` sequence range of the train, valid and test split of a dataset of
    ``sequences`` sequences under ``--split``, or None for a split of weight 0: what
    megatron.core computes (``parse_and_normalize_split``, ``convert_split_vector_to_split_matrix``
    and the rounding in ``BlendedMegatronDatasetBuilder._build_megatron_dataset_splits``)."""
    try:
        weights = [float(w) for w in re.findall(r"[.0-9]+", split)]
    except ValueError:
        weights = []
    if not 1 <= len(weights) <= len(SPLITS) or sum(weights) <= 0:
        raise ValueError(f"--split {split}: give one to three non-negative proportions "
                         f"(train,valid,test), not all 0")
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


def split_problems(blend, blend_per_split, split: Optional[str], seq_length: int,
                   num_samples: list[int]) -> list[str]:
    """Every reason the datasets of a training run cannot be built, as ``error: ...`` lines.

    ``blend``: the ``(prefixes, weights)`` of ``--data-path``, divided by ``split``; or
    ``blend_per_split``: one blend (or None) per split. Each file must pass ``read_index``; each
    split asked for samples (``num_samples``, train/valid/test) must hold, in every file that
    contributes to it, at least one sample of ``seq_length`` + 1 tokens."""
    if blend_per_split:
        files = [(f"--{name}-data-path", prefix, [i])
                 for i, name in enumerate(SPLITS) if blend_per_split[i]
                 for prefix in blend_per_split[i][0]]
    else:
        try:
            split_ranges(split, 0)
        except ValueError as e:
            return [f"error: {e}"]
        files = [("--data-path", prefix, range(len(SPLITS))) for prefix in blend[0]]
    problems, needed = [], seq_length + 1
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
