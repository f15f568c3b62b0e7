"""Last step of tools/preprocess_data.py: merge part datasets into one, and give it its final name.

The result is byte for byte what megatron.core's ``IndexedDatasetBuilder.add_index`` over the parts
followed by ``finalize`` writes (the tests check this), but in memory bounded by the largest part:
the builder holds every document's length and boundary as Python objects (about 100 bytes per
document) until ``finalize``, whereas this writes the index one part and one section at a time.

The ``.idx`` layout (megatron.core's ``_IndexWriter``): a header (magic, version, dtype code), the
sequence count and document count as ``<Q``, then the int32 sequence lengths, the int64 byte
offsets of the sequences, and the int64 document boundaries.
"""

from __future__ import annotations

import os
import shutil
import struct

import numpy as np
from megatron.core.datasets.indexed_dataset import IndexedDataset

from megatron_ext.data.files import publish

HEADER_BYTES = 9 + 8 + 1  # magic, version and dtype code, as the builder wrote them in every part


def _index_sections(prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """A part's sequence lengths and document boundaries, read by megatron.core's reader."""
    dataset = IndexedDataset(prefix)
    return np.array(dataset.sequence_lengths), np.array(dataset.document_indices)


def merge_datasets(part_prefixes: list[str], merged_prefix: str) -> None:
    """Write ``merged_prefix.bin``/``.idx``: the parts' documents, in order. Each part must hold
    a token (megatron.core cannot open a dataset with an empty ``.bin``)."""
    with open(f"{part_prefixes[0]}.idx", "rb") as f:
        header = f.read(HEADER_BYTES)
    dtype = IndexedDataset(part_prefixes[0]).index.dtype
    itemsize = np.dtype(dtype).itemsize

    counts = []
    for prefix in part_prefixes:
        lengths, documents = _index_sections(prefix)
        counts.append((len(lengths), len(documents) - 1))
    sequence_count = sum(c[0] for c in counts)
    document_count = sum(c[1] for c in counts)

    with open(f"{merged_prefix}.idx", "wb") as idx:
        idx.write(header)
        idx.write(struct.pack("<Q", sequence_count))
        idx.write(struct.pack("<Q", document_count + 1))
        for prefix in part_prefixes:
            idx.write(_index_sections(prefix)[0].astype(np.int32).tobytes())
        offset = 0
        for prefix in part_prefixes:
            lengths = _index_sections(prefix)[0].astype(np.int64)
            ends = offset + np.cumsum(lengths) * itemsize
            idx.write((ends - lengths * itemsize).tobytes())
            offset = int(ends[-1])
        idx.write(np.zeros(1, np.int64).tobytes())
        first_sequence = 0
        for prefix, (sequences, _) in zip(part_prefixes, counts):
            documents = _index_sections(prefix)[1].astype(np.int64)
            idx.write((first_sequence + documents[1:]).tobytes())
            first_sequence += sequences

    with open(f"{merged_prefix}.bin", "wb") as out:
        for prefix in part_prefixes:
            with open(f"{prefix}.bin", "rb") as part:
                shutil.copyfileobj(part, out, 1 << 24)


def publish_dataset(built_prefix: str, final_prefix: str) -> None:
    """Rename a complete dataset to its final name; an older ``.idx`` there goes first, so a crash
    in between leaves a lone ``.bin`` (not loadable), never a new ``.bin`` with an old ``.idx``."""
    if os.path.exists(f"{final_prefix}.idx"):
        os.remove(f"{final_prefix}.idx")
    publish(f"{built_prefix}.bin", f"{final_prefix}.bin")
    publish(f"{built_prefix}.idx", f"{final_prefix}.idx")
