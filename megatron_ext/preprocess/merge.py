"""Last step of tools/preprocess_data.py: merge part datasets into one, and give it its final name.

The result is byte for byte what megatron.core's ``IndexedDatasetBuilder.add_index`` over the parts
followed by ``finalize`` writes (the tests check this), but in memory bounded by the largest part:
the builder holds every document's length and boundary as Python objects (about 100 bytes per
document) until ``finalize``, whereas this writes the index one part and one section at a time
(megatron_ext/datasets/indexed.py). A single part is already the merged dataset: it is linked,
not copied.
"""

from __future__ import annotations

import os
import shutil

from ..datasets.indexed import read_index, write_index
from ..runtime.files import publish


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links
        shutil.copyfile(source, target)


def _append(source: str, out) -> None:
    """Append the file ``source`` to the open file ``out``, in the kernel where it can."""
    with open(source, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            copied = 0
            while copied < size:
                copied += os.copy_file_range(f.fileno(), out.fileno(), size - copied)
        except (AttributeError, OSError):
            f.seek(copied)
            out.seek(0, os.SEEK_END)
            shutil.copyfileobj(f, out, 1 << 24)


def merge_datasets(part_prefixes: list[str], merged_prefix: str) -> None:
    """Write ``merged_prefix.bin``/``.idx``: the parts' documents, in order. Each part must hold
    a token (megatron.core cannot open a dataset with an empty ``.bin``)."""
    indexes = [read_index(prefix) for prefix in part_prefixes]
    if len(part_prefixes) == 1:
        for ext in ("bin", "idx"):
            _link_or_copy(f"{part_prefixes[0]}.{ext}", f"{merged_prefix}.{ext}")
        return
    write_index(f"{merged_prefix}.idx", indexes[0].dtype,
                [(index.sequence_lengths, index.document_indices) for index in indexes])
    with open(f"{merged_prefix}.bin", "wb") as out:
        for prefix in part_prefixes:
            _append(f"{prefix}.bin", out)


def publish_dataset(built_prefix: str, final_prefix: str) -> None:
    """Rename a complete dataset to its final name; an older ``.idx`` there goes first, so a crash
    in between leaves a lone ``.bin`` (not loadable), never a new ``.bin`` with an old ``.idx``."""
    if os.path.exists(f"{final_prefix}.idx"):
        os.remove(f"{final_prefix}.idx")
    publish(f"{built_prefix}.bin", f"{final_prefix}.bin")
    publish(f"{built_prefix}.idx", f"{final_prefix}.idx")
