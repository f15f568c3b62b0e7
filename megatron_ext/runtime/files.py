"""Files written crash-safe, and fingerprints for resuming: the one atomic writer of the
package (data tools, checkpoints' marker, metrics, study and probe reports, figures).

A file is published by writing it under a temporary name, flushing it to disk and renaming it
over its final name, so a reader sees the old file, no file, or the complete new one, never a
partial one. The temporary name carries the process id: ranks that share a folder may
publish the same file at once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Union

PathLike = Union[str, Path]


def fsync_path(path: PathLike) -> None:
    """Flush a file's (or a directory's entries') data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp_path: PathLike, final_path: PathLike) -> None:
    """Rename the finished file ``tmp_path`` to ``final_path``, durably."""
    fsync_path(tmp_path)
    os.replace(tmp_path, final_path)
    fsync_path(os.path.dirname(os.path.abspath(final_path)))


def temporary_name(path: PathLike) -> str:
    """Where a file is written before :func:`publish` renames it to ``path``."""
    return f"{path}.{os.getpid()}.tmp"


def write_text(path: PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically and durably."""
    tmp_path = temporary_name(path)
    with open(tmp_path, "w", encoding="utf-8") as f:
        f.write(text)
    publish(tmp_path, path)


def write_json(path: PathLike, obj, sort_keys: bool = True) -> None:
    """Write ``obj`` as JSON (indent 1, a final newline) to ``path`` atomically."""
    write_text(path, json.dumps(obj, indent=1, sort_keys=sort_keys) + "\n")


def read_json(path: PathLike):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def file_fingerprint(path: str) -> list:
    """Size and modification time of a file, or of every file in a directory: what must not change
    between an interrupted run and its resumption."""
    if os.path.isdir(path):
        return [[name, *file_fingerprint(os.path.join(path, name))]
                for name in sorted(os.listdir(path))
                if os.path.isfile(os.path.join(path, name))]
    stat = os.stat(path)
    return [stat.st_size, stat.st_mtime_ns]
