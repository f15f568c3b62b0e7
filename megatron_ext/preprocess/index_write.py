"""Writing Megatron indexed datasets (``.bin/.idx``) with numpy alone: byte for byte what
megatron.core's ``IndexedDatasetBuilder`` writes (``add_document`` for each document, or
``add_index`` for each dataset merged, then ``finalize``; the tests compare them), without
importing megatron.core and torch, which would cost the data tools seconds of start-up.

The ``.bin`` is the tokens of every sequence, in order, in the dataset's dtype; the ``.idx``
layout is in megatron_ext/datasets/indexed.py, which reads it back.
"""

from __future__ import annotations

import struct

import numpy as np

from ..datasets.indexed import DTYPES, MAGIC

VERSION = 1


def optimal_dtype(vocab_size: int) -> type:
    """The token dtype Megatron-LM picks for a vocabulary (megatron.core's
    ``DType.optimal_dtype``): uint16 below 65,500 ids, else int32."""
    return np.uint16 if vocab_size < 65500 else np.int32


def _dtype_code(dtype: type) -> int:
    return next(code for code, known in DTYPES.items() if known == dtype)


def write_index(path: str, dtype: type, runs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Write the ``.idx`` of a dataset made of ``runs`` of documents, in order, each given as its
    sequence lengths and its document indices (from 0 to its sequence count). A run is read three
    times (one per section), so it may be memory-mapped: memory stays that of one run."""
    itemsize = np.dtype(dtype).itemsize
    sequences = sum(len(lengths) for lengths, _ in runs)
    documents = sum(len(indices) - 1 for _, indices in runs)
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<QB", VERSION, _dtype_code(dtype)))
        f.write(struct.pack("<QQ", sequences, documents + 1))
        for lengths, _ in runs:
            f.write(np.asarray(lengths, np.int32).tobytes())
        offset = 0
        for lengths, _ in runs:
            if len(lengths):
                ends = offset + np.cumsum(lengths, dtype=np.int64) * itemsize
                f.write((ends - np.asarray(lengths, np.int64) * itemsize).tobytes())
                offset = int(ends[-1])
        f.write(np.zeros(1, np.int64).tobytes())
        first_sequence = 0
        for lengths, indices in runs:
            f.write((first_sequence + np.asarray(indices[1:], np.int64)).tobytes())
            first_sequence += len(lengths)
