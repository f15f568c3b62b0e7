"""Input side of the data tools: find input files, stream them, parse them into texts.

Inputs, each a *kind*:

* ``jsonl``: ``*.jsonl``, ``*.json`` (one JSON object per line), optionally ``.gz``/``.zst``;
* ``text``: any other file, optionally ``.gz``/``.zst``;
* ``parquet``: ``*.parquet``, read by row group through pyarrow, only the ``--json-keys`` columns;
* ``arrow``: the ``data-*.arrow`` shards of a folder written by ``datasets.save_to_disk`` (Arrow
  IPC streams, read one record batch at a time).

A folder given as an input is a ``save_to_disk`` folder (it holds ``state.json``; its shards in
the order recorded there) or else a Hugging Face dataset folder: every ``*.parquet`` under it, in
path order. Inputs are streamed, never read whole, as *units*: one JSONL line, one line of text
(``text_document="line"``), one whole text file (``text_document="file"``) or one table row (a
``{column: value}`` dict), each with its 1-based number: the line it starts on, or the row. Blank
lines between units are skipped: they separate documents, they are none.

:func:`parse_unit` turns a unit into the texts of each JSON key (a plain-text unit is the text of
the single key), raising :class:`BadInput` with the line and the reason when it is not usable.
A table row gives exactly the texts its JSONL line would, so the outputs are the same bytes.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import io
import json
import os
import zlib
from typing import Iterator, Optional

import msgspec
import numpy as np
import zstandard

from ..runtime.errors import DataError, DeviceError, FlagError


TEXT_DOCUMENT_MODES = ("file", "line")
BATCH_BYTES = 1 << 19  # raw input bytes per batch handed to a worker
TABLE_KINDS = ("parquet", "arrow")
ROWS_PER_READ = 1024  # rows of a table decoded at a time


class BadInput(DataError):
    """A unit that is not a usable document: ``kind`` names the problem, ``detail`` specifics."""

    def __init__(self, line: int, kind: str, detail: str):
        super().__init__(f"line {line}: {kind} ({detail})")
        self.line, self.kind, self.detail = line, kind, detail


def describe_bad_input(path: str, line: int, kind: str, detail: str) -> str:
    where = f"{path}: row {line}" if input_kind(path) in TABLE_KINDS else f"{path}:{line}"
    return f"{where}: {kind} ({detail})"


@dataclasses.dataclass
class Batch:
    """Consecutive units of one input file, the unit of work of a worker: listed, or (lines of
    JSONL or text) a block of whole lines, which the worker splits."""

    input_index: int
    path: str
    kind: str  # input_kind(path)
    units: list  # [(line or row number, raw bytes or {column: value})]
    end_line: int  # lines (rows) up to here are consumed once this batch is written
    disk_bytes: int  # bytes of the (possibly compressed) file consumed since the previous batch
    block: bytes = b""  # whole lines from first_line on, instead of units
    first_line: int = 0

    def read_units(self) -> tuple[list, int]:
        """``(line number, raw)`` of each unit, blank lines skipped (as documents they are not),
        and the number of the batch's last line."""
        if not self.block:
            return self.units, self.end_line
        pieces = self.block.split(b"\n")
        if self.kind == "jsonl":
            units = [(number, line) for number, line in enumerate(pieces, self.first_line)
                     if line.strip()]
        else:
            units = [(number, line.rstrip(b"\r"))
                     for number, line in enumerate(pieces, self.first_line) if line.strip()]
        return units, self.first_line + len(pieces) - 1 - self.block.endswith(b"\n")


@dataclasses.dataclass
class Span:
    """Whole lines of an uncompressed JSONL or text input, its bytes ``start`` to ``end``, which
    the worker reads itself (``whole``: a text file that is one document): the main process only
    cuts the files at line ends. ``first_line`` is the number of the line at ``start``; 0 until
    the newlines of the span before it are counted (:func:`count_newlines`, in a worker)."""

    input_index: int
    path: str
    kind: str
    start: int
    end: int
    first_line: int
    whole: bool = False
    continued: bool = False  # the file goes on after ``end``, in the next span

    def blocks(self) -> Iterator[bytes]:
        """The span's bytes, read from disk in blocks of whole lines of about BATCH_BYTES (a
        ``whole`` file at once)."""
        with open(self.path, "rb") as f:
            if self.whole:
                yield f.read()
                return
            f.seek(self.start)
            position = self.start
            while position < self.end:
                block = f.read(min(BATCH_BYTES, self.end - position))
                if not block:
                    raise DataError(f"{self.path}: shorter than when this run began "
                                    f"({self.end:,} bytes); was it changed?")
                if not block.endswith(b"\n") and position + len(block) < self.end:
                    block += f.readline()
                position += len(block)
                yield block

    def batch(self, block: bytes, first_line: int) -> Batch:
        """A block of :meth:`blocks` as a :class:`Batch` whose first line is ``first_line``."""
        if self.whole:
            return Batch(self.input_index, self.path, self.kind, [(1, block)], 1, len(block))
        return Batch(self.input_index, self.path, self.kind, [], 0, len(block), block=block,
                     first_line=first_line)


def count_newlines(path: str, start: int, end: int) -> int:
    """The newlines in bytes ``start`` to ``end`` of ``path`` (run by a worker: the first line
    number of the span after)."""
    buffer = bytearray(min(1 << 22, max(end - start, 1)))
    view = np.frombuffer(buffer, np.uint8)
    count = 0
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        while start < end:
            read = f.readinto(memoryview(buffer)[:min(len(buffer), end - start)])
            if not read:
                break
            count += int(np.count_nonzero(view[:read] == 10))
            start += read
    return count


def ranged(path: str) -> bool:
    """Whether the workers read ``path`` by :class:`Span`: an uncompressed JSONL or text input
    (the others by the pieces of megatron_ext/preprocess/pieces.py)."""
    return input_kind(path) in ("jsonl", "text") and _strip_compression(path) == path


def offset_after_lines(path: str, lines: int) -> int:
    """The byte offset in ``path`` after its first ``lines`` lines."""
    with open(path, "rb") as f:
        for _ in range(lines):
            f.readline()
        return f.tell()


def spans(index: int, path: str, text_document: str, after_line: int,
          after_offset: Optional[int], span_bytes: int, first_bytes: int) -> Iterator[Span]:
    """The :class:`Span`\\ s of a ranged input after ``after_line`` lines (at ``after_offset``
    when known): the first of ``first_bytes``, the others of ``span_bytes``, each cut after a
    line end; a span ``continued`` ends before the file does."""
    kind, size = input_kind(path), os.path.getsize(path)
    if kind == "text" and text_document == "file":
        if after_line < 1:
            yield Span(index, path, kind, 0, size, 1, whole=True)
        return
    start = offset_after_lines(path, after_line) if after_offset is None else after_offset
    first_line, limit = after_line + 1, first_bytes
    with open(path, "rb") as f:
        while start < size:
            end = start + limit
            if end < size:
                f.seek(end)
                f.readline()
                end = f.tell()
            yield Span(index, path, kind, start, min(end, size), first_line,
                       continued=end < size)
            start, first_line, limit = end, 0, span_bytes


def _folder_inputs(folder: str) -> list[str]:
    """The files of a ``save_to_disk`` folder, or the Parquet shards under a dataset folder."""
    if os.path.isfile(os.path.join(folder, "dataset_dict.json")):
        splits = sorted(name for name in os.listdir(folder)
                        if os.path.isfile(os.path.join(folder, name, "state.json")))
        raise DataError(f"--input {folder}: a saved DatasetDict; give one of its splits: "
                        + ", ".join(os.path.join(folder, name) for name in splits))
    state = os.path.join(folder, "state.json")
    if os.path.isfile(state):
        with open(state, encoding="utf-8") as f:
            shards = [os.path.join(folder, entry["filename"])
                      for entry in json.load(f).get("_data_files", [])]
        missing = [path for path in shards if not os.path.isfile(path)]
        if missing or not shards:
            raise DataError(f"--input {folder}: {state} lists "
                            f"{'the missing file ' + missing[0] if missing else 'no data files'}")
        return shards
    shards = sorted(glob.glob(os.path.join(folder, "**", "*.parquet"), recursive=True))
    if not shards:
        raise DataError(f"--input {folder}: a folder, but neither a save_to_disk folder "
                        "(state.json) nor one holding *.parquet files")
    return shards


def expand_inputs(patterns: list[str]) -> list[str]:
    """Input files in order: literal paths as given, glob patterns expanded and sorted, folders
    as their data files (:func:`_folder_inputs`)."""
    paths = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matches:
                raise DataError(f"--input {pattern}: matches no file")
            paths.extend(matches)
        elif os.path.isdir(pattern):
            paths.extend(_folder_inputs(pattern))
        elif os.path.isfile(pattern):
            paths.append(pattern)
        else:
            raise DataError(f"--input {pattern}: no such file")
    seen = set()
    for path in paths:
        if os.path.realpath(path) in seen:
            raise FlagError(f"--input: {path} is given more than once")
        seen.add(os.path.realpath(path))
    return paths


def _strip_compression(path: str) -> str:
    root, ext = os.path.splitext(path)
    return root if ext in (".gz", ".zst") else path


def input_kind(path: str) -> str:
    """``jsonl``, ``text``, ``parquet`` or ``arrow`` (see the module docstring)."""
    ext = os.path.splitext(_strip_compression(path))[1]
    if ext in (".parquet", ".arrow") and path.endswith(ext):
        return ext[1:]
    return "jsonl" if ext in (".jsonl", ".json") else "text"


class InputFile:
    """A binary stream of an input file's decompressed bytes; :meth:`position` is on disk."""

    def __init__(self, path: str):
        self.path = path
        self._raw = open(path, "rb")
        ext = os.path.splitext(path)[1]
        if ext == ".gz":
            self.stream = gzip.GzipFile(fileobj=self._raw, mode="rb")
        elif ext == ".zst":
            reader = zstandard.ZstdDecompressor().stream_reader(
                self._raw, read_across_frames=True, closefd=False)
            self.stream = io.BufferedReader(reader)
        else:
            self.stream = self._raw

    def position(self) -> int:
        return self._raw.tell()

    def close(self) -> None:
        self.stream.close()
        self._raw.close()

    def units(self, text_document: str, jsonl: bool, after_line: int) -> Iterator:
        """One whole text file as a unit (``text_document="file"``), else blocks of lines:
        ``(first line number, bytes of whole lines)``, about BATCH_BYTES each. Data that cannot
        be decompressed (a damaged zstd frame, a truncated gzip file) ends the run naming the
        file and the last line read whole."""
        self._line = after_line
        try:
            yield from self._units(text_document, jsonl, after_line)
        except (OSError, EOFError, zlib.error, zstandard.ZstdError) as e:
            raise DataError(f"{self.path}: cannot be decompressed after line {self._line:,} "
                            f"(a damaged or truncated {os.path.splitext(self.path)[1]} file: "
                            f"{e})") from None

    def _units(self, text_document: str, jsonl: bool, after_line: int) -> Iterator:
        if not jsonl and text_document == "file":
            if after_line < 1:
                yield 1, self.stream.read()
            return
        for _ in range(after_line):
            self.stream.readline()
        first = after_line + 1
        while True:
            block = self.stream.read(BATCH_BYTES)
            if not block:
                return
            if not block.endswith(b"\n"):
                block += self.stream.readline()
            yield first, block
            first += block.count(b"\n") + (not block.endswith(b"\n"))
            self._line = first - 1


class TableFile:
    """The rows of a Parquet file or a ``save_to_disk`` Arrow shard, ``--json-keys`` columns only.

    A file pyarrow cannot read ends the run naming the file and the row group (Parquet) or record
    batch (Arrow) at fault; :meth:`position` is the share of the file's bytes its rows read so far
    stand for."""

    def __init__(self, path: str, kind: str, keys: list[str]):
        try:
            import pyarrow
        except ImportError:
            raise DeviceError(f"--input {path}: reading {kind.capitalize()} needs pyarrow "
                              "(pip install -e '.[data]')") from None

        self.path, self.kind, self.keys = path, kind, keys
        self.size = os.path.getsize(path)
        self._errors = (pyarrow.ArrowException, OSError, ValueError)
        # an Arrow stream memory-mapped: record batches skipped (a worker's later ones) are not
        # copied
        self._raw = open(path, "rb") if kind == "parquet" else pyarrow.memory_map(path)
        try:
            if kind == "parquet":
                import pyarrow.parquet

                self._parquet = pyarrow.parquet.ParquetFile(self._raw)
                names, self.rows = self._parquet.schema_arrow.names, self._parquet.metadata.num_rows
            else:
                self._stream = pyarrow.ipc.open_stream(self._raw)
                names, self.rows = self._stream.schema.names, None
        except self._errors as e:
            self._raw.close()
            raise DataError(f"{path}: not a readable {kind.capitalize()} file ({e})") \
                from None
        missing = [key for key in keys if key not in names]
        if missing:
            self._raw.close()
            raise DataError(f"{path}: no column {missing[0]!r} (--json-keys); its columns: "
                            f"{', '.join(names)}")
        self.read = 0

    def position(self) -> int:
        if self.rows is None:  # an Arrow stream is read in order: the file offset is exact
            return self._raw.tell()
        return self.size * self.read // max(self.rows, 1)

    def close(self) -> None:
        self._raw.close()

    def chunks(self) -> list[tuple[int, int]]:
        """``(rows, bytes on disk)`` of each row group (Parquet: its compressed column chunks)
        or record batch (Arrow), in order: what the main process cuts into the workers'
        pieces (megatron_ext/preprocess/pieces.py)."""
        if self.kind == "parquet":
            metadata = self._parquet.metadata
            return [(group.num_rows, sum(group.column(c).total_compressed_size
                                         for c in range(group.num_columns)))
                    for group in map(metadata.row_group, range(metadata.num_row_groups))]
        chunks, offset = [], self._raw.tell()
        for first, batch in self._record_batches(0):
            chunks.append((batch.num_rows, self._raw.tell() - offset))
            offset = self._raw.tell()
        return chunks

    def _record_batches(self, after_row: int, groups: Optional[tuple[int, int]] = None
                        ) -> Iterator:
        """``(first row number - 1, record batch)`` from the batch holding row ``after_row + 1``,
        of the row groups (record batches) ``groups`` = ``(start, stop)`` only, if given."""
        start_group, stop_group = groups or (0, None)
        if self.kind == "arrow":
            first, number = 0, 0
            while stop_group is None or number < stop_group:
                try:
                    batch = self._stream.read_next_batch()
                except StopIteration:
                    return
                except self._errors as e:
                    raise DataError(f"{self.path}: record batch {number} (after row "
                                    f"{first:,}) cannot be read ({e})") from None
                if first + batch.num_rows > after_row and number >= start_group:
                    yield first, batch
                first, number = first + batch.num_rows, number + 1
            return
        metadata = self._parquet.metadata
        first = 0
        stop_group = metadata.num_row_groups if stop_group is None else stop_group
        for group in range(stop_group):
            rows = metadata.row_group(group).num_rows
            if first + rows > after_row and group >= start_group:
                start = first
                try:
                    for batch in self._parquet.iter_batches(
                            ROWS_PER_READ, row_groups=[group], columns=self.keys,
                            use_threads=False):
                        yield start, batch
                        start += batch.num_rows
                except self._errors as e:
                    raise DataError(
                       f"{self.path}: row group {group} of {metadata.num_row_groups} "
                       f"(rows {first + 1:,}-{first + rows:,}) cannot be read ({e})") from None
            first += rows

    def units(self, text_document: str, jsonl: bool, after_line: int,
              groups: Optional[tuple[int, int]] = None) -> Iterator:
        """``(row number, {column: value})`` of each row after ``after_line``, of the row
        groups (record batches) ``groups`` only, if given."""
        for first, batch in self._record_batches(after_line, groups):
            columns = [batch.column(key).to_pylist() for key in self.keys]
            for offset, values in enumerate(zip(*columns)):
                row = first + offset + 1
                self.read = row
                if row > after_line:
                    yield row, dict(zip(self.keys, values))


def unit_bytes(raw) -> int:
    """Input bytes of a unit (for tables: characters of its texts, a close estimate)."""
    if isinstance(raw, bytes):
        return len(raw)
    return sum(len(v) if isinstance(v, str) else len(str(v)) for v in raw.values())


def open_input(path: str, keys: list[str]):
    """An :class:`InputFile` or a :class:`TableFile`."""
    kind = input_kind(path)
    return TableFile(path, kind, keys) if kind in TABLE_KINDS else InputFile(path)


def file_batches(index: int, path: str, text_document: str, keys: list[str],
                 after_line: int = 0, groups: Optional[tuple[int, int]] = None
                 ) -> Iterator[Batch]:
    """Batches of units of input ``index``, ``path``, after ``after_line`` lines (rows), read in
    this process (of a table, the row groups or record batches ``groups`` only, if given)."""
    kind = input_kind(path)
    f = open_input(path, keys)
    blocks = kind == "jsonl" or (kind == "text" and text_document == "line")
    units_of = f.units(text_document, kind == "jsonl", after_line, *(
        [groups] if kind in TABLE_KINDS else []))
    try:
        units, size, reported, end_line = [], 0, 0, after_line
        for line, raw in units_of:
            if blocks:
                end_line = line + raw.count(b"\n") - raw.endswith(b"\n")
                yield Batch(index, path, kind, [], end_line, f.position() - reported,
                            block=raw, first_line=line)
                reported = f.position()
                continue
            end_line = line
            units.append((line, raw))
            size += unit_bytes(raw)
            if size >= BATCH_BYTES:
                yield Batch(index, path, kind, units, end_line, f.position() - reported)
                units, size, reported = [], 0, f.position()
        yield Batch(index, path, kind, units, end_line, f.position() - reported)
    finally:
        f.close()


def iter_batches(paths: list[str], text_document: str, keys: list[str]) -> Iterator[Batch]:
    """Batches of units of ``paths``, in order, read in this process."""
    for index, path in enumerate(paths):
        yield from file_batches(index, path, text_document, keys)


def _decode(raw: bytes, line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(line + raw.count(b"\n", 0, e.start), "invalid UTF-8",
                       f"bytes {raw[e.start:e.end]!r}") from None


def _texts_of(value, key: str, line: int, surrogates: bool = False) -> list[str]:
    """The texts of a key's value; ``surrogates``: the value may hold lone surrogates (``json``
    decodes ``"\\ud800"`` to one, which is no UTF-8 text; msgspec and UTF-8 bytes cannot)."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise BadInput(line, "not text", f"key {key!r} holds {type(value).__name__}, "
                       "not a string or a list of strings")
    for text in texts if surrogates else ():
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise BadInput(line, "invalid UTF-8", f"key {key!r}: {e.reason}") from None
    return texts


_JSON = msgspec.json.Decoder()


def parse_unit(raw, line: int, kind: str, keys: list[str]) -> dict[str, list[str]]:
    """The texts of each key in a unit (a list per key: a value may be a list of sentences).

    JSON is decoded by msgspec, which for what it accepts gives what ``json.loads`` gives (it
    refuses more: NaN, lone surrogates, invalid UTF-8); a line it refuses goes to ``json``,
    whose verdict and message stand."""
    if kind in TABLE_KINDS:
        return {key: _texts_of(raw[key], key, line) for key in keys}
    record, surrogates = None, False
    if kind == "jsonl":
        try:
            record = _JSON.decode(raw)
        except (msgspec.DecodeError, ValueError):
            pass
    if record is None:
        text = _decode(raw, line)
        if kind == "text":
            return {keys[0]: [text]}
        surrogates = True
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            # json says "Invalid control character at" (then the place): the column is the place
            what = e.msg.removesuffix(" at")
            raise BadInput(line, "malformed JSON", f"{what} at column {e.colno}") from None
    if not isinstance(record, dict):
        raise BadInput(line, "malformed JSON", f"a {type(record).__name__}, not an object")
    texts = {}
    for key in keys:
        if key not in record:
            raise BadInput(line, "missing key", repr(key))
        texts[key] = _texts_of(record[key], key, line, surrogates)
    return texts


def iter_texts(paths: list[str], text_document: str, keys: list[str],
               flag: str = "") -> Iterator[dict[str, list[str]]]:
    """The texts of each unit of ``paths`` in order, per key (:func:`parse_unit`), read in
    this process (the tokenizer trainer, the probes' JSONL text); a bad unit ends the run
    with an error naming the file and line (after ``flag``, the option that gave the file)."""
    for batch in iter_batches(paths, text_document, keys):
        for line, raw in batch.read_units()[0]:
            try:
                yield parse_unit(raw, line, batch.kind, keys)
            except BadInput as e:
                where = describe_bad_input(batch.path, e.line, e.kind, e.detail)
                raise DataError(f"{flag + ' ' if flag else ''}{where}") from None
