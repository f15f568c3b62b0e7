"""The work of tools/preprocess_data.py's worker pool, planned and run in input order by the main
process.

A *task* is a list of sources in input order, about ``task_bytes`` of input, which the worker
reads itself: :class:`Span`\\ s of uncompressed JSONL and text files (the main process only cuts
the files after a line end: a seek and a short read per span) and :class:`~.pieces.Piece`\\ s of
the others (whole compressed files, runs of Parquet row groups or Arrow record batches, planned
from the file's footer or batch sizes: megatron_ext/preprocess/pieces.py). A worker encodes a task (:func:`~.encode.encode_task`), appends
its tokens to its own files and answers with where they are, the index of the documents and the
counts; :func:`run_in_order` hands the answers back in input order, with at most ``window``
tasks in flight.

Line numbers stay exact (errors name ``file:line``, ``--verify-fraction`` samples by file and
line, a resumed run continues after a line) without the main process reading the input: a span
that continues a file needs the number of its first line, the newlines of the span before it
plus that span's first line, which a worker counts (:func:`~.readers.count_newlines`) as soon as
that span is planned, a window ahead of its encoding.
"""

from __future__ import annotations

import collections
from typing import Iterator, Optional

from .encode import TaskResult, encode_task
from .pieces import pieces
from .readers import Span, count_newlines, ranged, spans

TASK_BYTES = 16 << 20  # input bytes of a task at most
MIN_TASK_BYTES = 4 << 10


def task_bytes(input_bytes: int, workers: int, part_tokens: int) -> int:
    """Input bytes per task: TASK_BYTES, or less for a small input (eight tasks per worker) or
    small parts (a part ends after a task: a task of at most ``part_tokens`` bytes holds about a
    quarter of that many tokens or less)."""
    return max(MIN_TASK_BYTES, min(TASK_BYTES, input_bytes // (8 * workers), part_tokens))


def plan_tasks(paths: list[str], text_document: str, keys: list[str], start_input: int,
               after_line: int, after_offset: Optional[int], size: int) -> Iterator[list]:
    """The tasks (lists of sources) of ``paths`` from input ``start_input`` after ``after_line``
    lines (at byte ``after_offset`` when known), each of about ``size`` bytes; a task ends
    after a span that its file continues (the next span waits for its count)."""
    sources, held = [], 0
    for index in range(start_input, len(paths)):
        path = paths[index]
        skip, offset = (after_line, after_offset) if index == start_input else (0, 0)
        if ranged(path):
            for span in spans(index, path, text_document, skip, offset, size,
                              max(size - held, 1)):
                sources.append(span)
                held += span.end - span.start
                if span.continued or held >= size:
                    yield sources
                    sources, held = [], 0
            continue
        for piece in pieces(index, path, text_document, keys, skip, size):
            sources.append(piece)
            held += piece.disk_bytes
            if held >= size:
                yield sources
                sources, held = [], 0
    if sources:
        yield sources


def run_in_order(pool, tasks: Iterator[list], window: int) -> Iterator[TaskResult]:
    """:func:`~.encode.encode_task` over ``tasks`` on ``pool``, the answers in order; at most
    ``window`` tasks encoding, and (of spans) as many planned and counted ahead."""
    planned = collections.deque()  # (sources, the newline count of a continued last span)
    running = collections.deque()
    next_line = {}  # input index: the first line of the span that continues it
    while True:
        while len(planned) < window:
            sources = next(tasks, None)
            if sources is None:
                break
            last = sources[-1]
            planned.append((sources, pool.apply_async(count_newlines, (
                last.path, last.start, last.end)) if isinstance(last, Span) and last.continued
                else None))
        while planned and len(running) < window:
            sources, count = planned.popleft()
            first, last = sources[0], sources[-1]
            if isinstance(first, Span) and not first.first_line:
                first.first_line = next_line.pop(first.input_index)
            running.append(pool.apply_async(encode_task, (sources,)))
            if count is not None:
                next_line[last.input_index] = last.first_line + count.get()
        if not running:
            return
        yield running.popleft().get()
