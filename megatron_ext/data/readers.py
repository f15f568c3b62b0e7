"""Input side of the data tools: find input files, stream them, parse them into texts.

Inputs are JSONL files (``*.jsonl``, ``*.json``: one JSON object per line) or plain-text files
(anything else), each optionally compressed (``.gz``, ``.zst``). They are streamed, never read
whole, as *units*: one JSONL line, one line of text (``text_document="line"``) or one whole text
file (``text_document="file"``), each with the 1-based number of the line it starts on. Blank
lines between units are skipped: they separate documents, they are none.

:func:`parse_unit` turns a unit into the texts of each JSON key (a plain-text unit is the text of
the single key), raising :class:`BadInput` with the line and the reason when it is not usable.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import io
import json
import os
from typing import Iterator

import zstandard


TEXT_DOCUMENT_MODES = ("file", "line")
BATCH_BYTES = 1 << 19  # raw input bytes per batch handed to a worker


class BadInput(ValueError):
    """A unit that is not a usable document: ``kind`` names the problem, ``detail`` specifics."""

    def __init__(self, line: int, kind: str, detail: str):
        super().__init__(f"line {line}: {kind} ({detail})")
        self.line, self.kind, self.detail = line, kind, detail


def describe_bad_input(path: str, line: int, kind: str, detail: str) -> str:
    return f"{path}:{line}: {kind} ({detail})"


@dataclasses.dataclass
class Batch:
    """Consecutive units of one input file, the unit of work of a worker."""

    input_index: int
    path: str
    units: list  # [(line number, raw bytes)]
    end_line: int  # lines up to here are consumed once this batch is written
    disk_bytes: int  # bytes of the (possibly compressed) file consumed since the previous batch


def expand_inputs(patterns: list[str]) -> list[str]:
    """Input files in order: literal paths as given, glob patterns expanded and sorted."""
    paths = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matches:
                raise SystemExit(f"error: --input {pattern}: matches no file")
            paths.extend(matches)
        elif os.path.isfile(pattern):
            paths.append(pattern)
        else:
            raise SystemExit(f"error: --input {pattern}: no such file")
    seen = set()
    for path in paths:
        if os.path.realpath(path) in seen:
            raise SystemExit(f"error: --input: {path} is given more than once")
        seen.add(os.path.realpath(path))
    return paths


def _strip_compression(path: str) -> str:
    root, ext = os.path.splitext(path)
    return root if ext in (".gz", ".zst") else path


def is_jsonl(path: str) -> bool:
    return os.path.splitext(_strip_compression(path))[1] in (".jsonl", ".json")


class InputFile:
    """A binary stream of an input file's decompressed bytes; :meth:`position` is on disk."""

    def __init__(self, path: str):
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

    def __enter__(self) -> "InputFile":
        return self

    def __exit__(self, *exc) -> None:
        self.stream.close()
        self._raw.close()


def _units(f: InputFile, text_document: str, jsonl: bool, after_line: int) -> Iterator:
    if not jsonl and text_document == "file":
        if after_line < 1:
            yield 1, f.stream.read()
        return
    for line_number, line in enumerate(f.stream, start=1):
        if line_number > after_line and not line.isspace():
            yield line_number, line if jsonl else line.rstrip(b"\r\n")


def iter_batches(paths: list[str], text_document: str, start_input: int = 0,
                 after_line: int = 0) -> Iterator[Batch]:
    """Batches of units of ``paths``, in order, from input ``start_input`` after ``after_line``."""
    for index in range(start_input, len(paths)):
        path = paths[index]
        skip = after_line if index == start_input else 0
        with InputFile(path) as f:
            units, size, reported, end_line = [], 0, 0, skip
            for end_line, raw in _units(f, text_document, is_jsonl(path), skip):
                units.append((end_line, raw))
                size += len(raw)
                if size >= BATCH_BYTES:
                    yield Batch(index, path, units, end_line, f.position() - reported)
                    units, size, reported = [], 0, f.position()
            yield Batch(index, path, units, end_line, f.position() - reported)


def _decode(raw: bytes, line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(line + raw.count(b"\n", 0, e.start), "invalid UTF-8",
                       f"bytes {raw[e.start:e.end]!r}") from None


def _texts_of(value, key: str, line: int) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise BadInput(line, "not text", f"key {key!r} holds {type(value).__name__}, "
                       "not a string or a list of strings")
    for text in texts:
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise BadInput(line, "invalid UTF-8", f"key {key!r}: {e.reason}") from None
    return texts


def parse_unit(raw: bytes, line: int, jsonl: bool, keys: list[str]) -> dict[str, list[str]]:
    """The texts of each key in a unit (a list per key: a JSON value may be a list of sentences)."""
    text = _decode(raw, line)
    if not jsonl:
        return {keys[0]: [text]}
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(line, "malformed JSON", f"{e.msg} at column {e.colno}") from None
    if not isinstance(record, dict):
        raise BadInput(line, "malformed JSON", f"a {type(record).__name__}, not an object")
    texts = {}
    for key in keys:
        if key not in record:
            raise BadInput(line, "missing key", repr(key))
        texts[key] = _texts_of(record[key], key, line)
    return texts
