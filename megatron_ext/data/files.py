"""Files for the data tools: crash-safe publication, and fingerprints for resuming.

A file is published by writing it under a temporary name, flushing it to disk and renaming it
over its final name, so a reader sees the old file, no file, or the complete new one, never a
partial one.
"""

from __future__ import annotations

import json
import os


def fsync_path(path: str) -> None:
    """Flush a file's (or a directory's entries') data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp_path: str, final_path: str) -> None:
    """Rename the finished file ``tmp_path`` to ``final_path``, durably."""
    fsync_path(tmp_path)
    os.replace(tmp_path, final_path)
    fsync_path(os.path.dirname(os.path.abspath(final_path)))


def write_json(path: str, obj) -> None:
    """Write ``obj`` as JSON to ``path`` atomically."""
    tmp_path = f"{path}.tmp"
    with open(tmp_path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
    publish(tmp_path, path)


def read_json(path: str):
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
