"""The Megatron indexed dataset format (``.bin/.idx``), read and written with numpy alone, as
Megatron-Core keeps its reader and writer in one module (``indexed_dataset``): :func:`read_index`
reads an ``.idx`` and checks it against its ``.bin`` (training, tools/check_data.py, merging),
:func:`unigram_counts` counts its token ids (the probes' control pairing);
:func:`write_index` writes byte for byte what megatron.core's ``IndexedDatasetBuilder`` writes
(``add_document`` for each document, or ``add_index`` for each dataset merged, then
``finalize``; the tests compare them). Neither imports megatron.core or torch, which would cost
the data tools seconds of start-up. The checks of the splits training takes are
:mod:`.split_checks`.

The ``.bin`` is the tokens of every sequence, in order, in the dataset's dtype. The ``.idx``
layout (megatron.core's ``_IndexWriter``): magic ``MMIDIDX\\0\\0``, version ``<Q`` (1), dtype
code ``<B``, sequence count S ``<Q``, count D ``<Q`` of document indices (documents + 1), then S
int32 sequence lengths, S int64 byte offsets of the sequences in the ``.bin``, and D int64
document indices (the first sequence of each document, then S).
"""

from __future__ import annotations

import dataclasses
import os
import struct
from typing import Callable, Iterator, Optional

import numpy as np

from ..runtime.errors import DataError

MAGIC = b"MMIDIDX\x00\x00"


HEADER_BYTES = len(MAGIC) + 8 + 1 + 8 + 8


# megatron.core.datasets.indexed_dataset.DType: the code of each token dtype.
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}


VERSION = 1


class IndexCheckError(DataError):
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


def read_index(prefix: str, bin_size: Optional[int] = None) -> Index:
    """The index of dataset ``prefix``, checked against itself and against the ``.bin`` size
    (``bin_size``: the bytes of tokens that are not a ``.bin`` file yet, such as a
    preprocessing part's)."""
    idx_path, bin_path = f"{prefix}.idx", f"{prefix}.bin"
    for path in (idx_path, bin_path) if bin_size is None else (idx_path,):
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
    if bin_size is None:
        bin_size = os.path.getsize(bin_path)
    if bin_size != expected:
        what = "truncated" if bin_size < expected else "longer than its index says"
        raise IndexCheckError(f"{bin_path} is {what}: {bin_size:,} bytes, but {idx_path} "
                              f"describes {expected:,}")
    return Index(prefix, DTYPES[code], lengths, document_indices)


def _token_chunks(index: Index, chunk_tokens: int) -> Iterator[np.ndarray]:
    """The ``.bin``'s tokens, memory-mapped, in chunks of ``chunk_tokens`` (none when empty)."""
    total = index.tokens()
    if not total:
        return
    data = np.memmap(f"{index.prefix}.bin", index.dtype, mode="r", shape=(total,))
    for start in range(0, total, chunk_tokens):
        yield data[start:start + chunk_tokens]


def token_id_range(index: Index, progress: Callable[[int], None] = lambda nbytes: None,
                   chunk_tokens: int = 1 << 24) -> tuple[Optional[int], Optional[int]]:
    """``(smallest, largest)`` token id in the ``.bin`` (``(None, None)`` when empty), read in
    chunks; ``progress`` is told the bytes of each chunk."""
    lows, highs = [], []
    for chunk in _token_chunks(index, chunk_tokens):
        lows.append(chunk.min())
        highs.append(chunk.max())
        progress(chunk.nbytes)
    if not lows:
        return None, None
    return int(min(lows)), int(max(highs))


def edge_token_id_max(index: Index, tokens: int = 1 << 16) -> Optional[int]:
    """The largest token id among the first and the last ``tokens`` tokens of the ``.bin``
    (None when empty): what training checks at start, cheaply, where reading every id (as
    :func:`token_id_range` does) would take minutes on a large corpus."""
    total = index.tokens()
    if not total:
        return None
    data = np.memmap(f"{index.prefix}.bin", index.dtype, mode="r", shape=(total,))
    return int(max(data[:tokens].max(), data[-tokens:].max()))


def unigram_counts(index: Index, chunk_tokens: int = 1 << 24) -> np.ndarray:
    """How often each token id occurs in the ``.bin`` (int64, length the largest id + 1),
    memory-mapped and counted in chunks by ``np.bincount``."""
    counts = np.zeros(0, dtype=np.int64)
    for tokens in _token_chunks(index, chunk_tokens):
        chunk = np.bincount(tokens)
        if len(chunk) > len(counts):
            counts = np.pad(counts, (0, len(chunk) - len(counts)))
        counts[:len(chunk)] += chunk
    return counts


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
