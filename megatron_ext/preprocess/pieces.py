"""The workers' own reading of the inputs that cannot be cut at any line end (compressed JSONL
and text, Parquet, ``save_to_disk`` Arrow shards): the main process plans them as *pieces*
from what it learns without decoding a row, and a worker reads, decompresses and decodes its
piece itself (megatron_ext/preprocess/readers.py's readers, as the main process used to).

A piece is

* a whole ``.gz``/``.zst`` file: a compressed stream cannot be entered in the middle (a zstd
  frame could, but writers such as DCLM's put a file in one frame), so one file is one worker's
  and many shards give the parallelism;
* a run of consecutive row groups of a Parquet file, about a task's bytes of compressed column
  chunks (the ``--json-keys`` columns are read, the others skipped); the footer says where;
* a run of consecutive record batches of an Arrow stream, about a task's bytes: the main process
  reads the stream once, memory-mapped (batch sizes, no row decoded), and the worker skips the
  batches before its own in the mapping.

Line and row numbers stay exact: a compressed file is numbered from its start, a table's rows
from the row counts of the row groups or batches before the piece. A piece knows the file bytes
it stands for (the progress bar) and, for a table, the last row it covers, which a part ending
after it records for ``--resume`` even where its rows were all skipped.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Iterator, Optional

from .readers import TABLE_KINDS, Batch, TableFile, file_batches, input_kind


@dataclasses.dataclass
class Piece:
    """Rows ``groups`` (row groups or record batches, ``(start, stop)``; None: a whole
    compressed file) of input ``input_index``, after its first ``after_line`` lines (rows: a
    resumed run), standing for ``disk_bytes`` of the file; ``end_line``: the number of its
    table's last row (0: a compressed file's, known once read)."""

    input_index: int
    path: str
    kind: str
    text_document: str
    groups: Optional[tuple[int, int]]
    after_line: int
    disk_bytes: int
    end_line: int = 0

    def batches(self, keys: list[str]) -> Iterator[Batch]:
        """The piece's batches of units (:func:`~.readers.file_batches`), read here; the last
        carries the piece's bytes and end."""
        last = None
        for batch in file_batches(self.input_index, self.path, self.text_document, keys,
                                  self.after_line, self.groups):
            if last is not None:
                yield last
            batch.disk_bytes = 0
            last = batch
        last.disk_bytes = self.disk_bytes
        last.end_line = max(last.end_line, self.end_line)
        yield last


def pieces(index: int, path: str, text_document: str, keys: list[str], after_line: int,
           size: int) -> Iterator[Piece]:
    """The :class:`Piece`\\ s of input ``index`` after its first ``after_line`` lines (rows), a
    table's each of about ``size`` bytes; a Parquet file without a ``--json-keys`` column, or
    one pyarrow cannot read, is refused here, naming it."""
    kind = input_kind(path)
    if kind not in TABLE_KINDS:
        yield Piece(index, path, kind, text_document, None, after_line, os.path.getsize(path))
        return
    table = TableFile(path, kind, keys)
    try:
        chunks = table.chunks()
    finally:
        table.close()
    start, rows, held, reported = 0, 0, 0, 0
    for group, (group_rows, group_bytes) in enumerate(chunks):
        rows, held = rows + group_rows, held + group_bytes
        if rows <= after_line:  # read by complete parts of an interrupted run
            start, held = group + 1, 0
            continue
        last = group == len(chunks) - 1
        if held >= size or last:
            if last:  # the footer and headers too: the pieces add up to the file
                held = os.path.getsize(path) - reported
            yield Piece(index, path, kind, text_document, (start, group + 1), after_line, held,
                        end_line=rows)
            start, reported, held = group + 1, reported + held, 0
