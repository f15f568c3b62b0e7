"""Last step of tools/preprocess_data.py: merge the parts into one dataset, and give it its final
name.

The result is byte for byte what megatron.core's ``IndexedDatasetBuilder.add_index`` over the parts
followed by ``finalize`` writes (the tests check this), but in memory bounded by the largest part:
the builder holds every document's length and boundary as Python objects (about 100 bytes per
document) until ``finalize``, whereas this writes the index one part and one section at a time
(megatron_ext/datasets/indexed.py). The ``.bin`` is the parts' token segments copied to their
places in it, in the kernel where it can (``copy_file_range``), by the worker processes
(:func:`copy_segments`, given as ``map``); tokens that are one whole file already are linked,
not copied.

:func:`merge_dataset_files` does the same for whole datasets (tools/merge_datasets.py): the
shards of a job split over nodes (``--shard I/N``: megatron_ext/preprocess/shards.py), in shard
order, give the bytes of one run over every input.
"""

from __future__ import annotations

import errno
import functools
import glob
import os
import shutil

from ..datasets.indexed import Index, read_index, write_index
from ..runtime.errors import DataError
from ..runtime.files import publish

COPY_BYTES = 64 << 20  # bytes per copy job


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links
        shutil.copyfile(source, target)


def _copy_range(source: int, target: int, offset: int, nbytes: int, at: int) -> None:
    kernel = hasattr(os, "copy_file_range")
    while nbytes:
        if kernel:
            try:
                copied = os.copy_file_range(source, target, nbytes, offset, at)
            except OSError as e:  # another file system, or none that can
                if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                kernel = False
                continue
        else:
            data = os.pread(source, min(nbytes, 1 << 24), offset)
            copied = os.pwrite(target, data, at) if data else 0
        if not copied:
            raise DataError(f"a token file of the work folder ends {nbytes:,} bytes early: "
                            "was it changed?")
        offset, nbytes, at = offset + copied, nbytes - copied, at + copied


def copy_segments(target: str, jobs: list[tuple[str, int, int, int]]) -> int:
    """Copy each ``(source, offset, bytes, target offset)`` of ``jobs`` into the file ``target``
    (a task of the worker pool); the bytes copied."""
    out = os.open(target, os.O_WRONLY)
    try:
        for source, offset, nbytes, at in jobs:
            fd = os.open(source, os.O_RDONLY)
            try:
                _copy_range(fd, out, offset, nbytes, at)
            finally:
                os.close(fd)
    finally:
        os.close(out)
    return sum(job[2] for job in jobs)


def merge_datasets(parts: list[tuple[str, list]], merged_prefix: str, map=map) -> None:
    """Write ``merged_prefix.bin``/``.idx``: the parts' documents, in order. A part is the prefix
    of its ``.idx`` and the segments that hold its tokens, ``(path, offset, bytes)`` in order;
    each must hold a token (megatron.core cannot open a dataset with an empty ``.bin``).
    ``map`` runs the copy jobs (a pool's ``imap_unordered``)."""
    indexes = [read_index(prefix, bin_size=sum(segment[2] for segment in segments))
               for prefix, segments in parts]
    write_index(f"{merged_prefix}.idx", indexes[0].dtype,
                [(index.sequence_lengths, index.document_indices) for index in indexes])
    segments = [segment for _, part_segments in parts for segment in part_segments]
    target = f"{merged_prefix}.bin"
    if len(segments) == 1 and segments[0][1] == 0 \
            and os.path.getsize(segments[0][0]) == segments[0][2]:
        _link_or_copy(segments[0][0], target)
        return
    jobs, at = [[]], 0
    for path, offset, nbytes in segments:
        while nbytes:  # jobs of COPY_BYTES, a segment split where it is longer
            piece = min(nbytes, COPY_BYTES - sum(job[2] for job in jobs[-1]))
            jobs[-1].append((path, offset, piece, at))
            offset, nbytes, at = offset + piece, nbytes - piece, at + piece
            if sum(job[2] for job in jobs[-1]) >= COPY_BYTES:
                jobs.append([])
    with open(target, "wb") as f:
        f.truncate(at)
    for _ in map(functools.partial(copy_segments, target), [job for job in jobs if job]):
        pass


def publish_dataset(built_prefix: str, final_prefix: str) -> None:
    """Rename a complete dataset to its final name; an older ``.idx`` there goes first, so a crash
    in between leaves a lone ``.bin`` (not loadable), never a new ``.bin`` with an old ``.idx``."""
    if os.path.exists(f"{final_prefix}.idx"):
        os.remove(f"{final_prefix}.idx")
    publish(f"{built_prefix}.bin", f"{final_prefix}.bin")
    publish(f"{built_prefix}.idx", f"{final_prefix}.idx")


def _prefix(path: str) -> str:
    root, ext = os.path.splitext(path)
    return root if ext in (".bin", ".idx") else path


def dataset_inputs(given: list[str]) -> list[str]:
    """The dataset prefixes of :func:`merge_dataset_files`' inputs, in order: a prefix (or its
    ``.bin``/``.idx``) as given, a quoted glob of prefixes or ``.idx`` files and a folder (every
    dataset in it: Megatron-LM's ``tools/merge_datasets.py --input``) sorted by name."""
    prefixes = []
    for item in given:
        if os.path.isdir(item):
            found = sorted(_prefix(p) for p in glob.glob(os.path.join(item, "*.idx")))
        elif glob.has_magic(item):
            found = sorted({_prefix(p) for p in glob.glob(item) + glob.glob(f"{item}.idx")
                            if p.endswith(".idx") or os.path.isfile(f"{p}.idx")})
        else:
            found = [_prefix(item)]
        if not found:
            raise DataError(f"--input {item}: no dataset (.idx) there")
        prefixes += found
    return prefixes


def merge_dataset_files(given: list[str], output_prefix: str) -> list[Index]:
    """Merge the datasets ``given`` (:func:`dataset_inputs`), in order, into
    ``output_prefix.bin/.idx``, the bytes megatron.core's builder writes for them; written
    under a temporary name and renamed, so no partial dataset ever has the final name. The
    indexes of the inputs, as read and checked."""
    prefixes = dataset_inputs(given)
    if _prefix(os.path.abspath(output_prefix)) in map(os.path.abspath, prefixes):
        raise DataError(f"--output-prefix {output_prefix} is one of the inputs")
    indexes = [read_index(prefix) for prefix in prefixes]
    dtypes = {index.dtype for index in indexes}
    if len(dtypes) > 1:
        raise DataError("the datasets hold different dtypes (tokenized with different "
                        "tokenizers?): " + ", ".join(f"{index.prefix} {index.dtype.__name__}"
                                                     for index in indexes))
    empty = [index.prefix for index in indexes if not index.tokens()]
    if empty:
        raise DataError(f"{empty[0]}: a dataset without tokens")
    building = f"{output_prefix}.merging"
    merge_datasets([(prefix, [(f"{prefix}.bin", 0, os.path.getsize(f"{prefix}.bin"))])
                    for prefix in prefixes], building)
    publish_dataset(building, output_prefix)
    return indexes
