"""A checkpoint's manifest: every file of a save with its size and a fast checksum (CRC-32),
written with the save and verified before it is loaded.

A file damaged on a shared filesystem, or cut short by a full disk, is otherwise found only
when a resume fails deep inside torch. The writer processes of a save checksum the files they
have just written (:func:`checksum_files`, from :mod:`megatron_ext.checkpoint.saving`); rank 0
adds the files no writer covered and writes ``manifest.json`` before the save is renamed to
its final name. :func:`verify` re-reads every file and names the first one that is missing,
of another size, or of another checksum. Imports nothing heavy: ``tools/check_checkpoint.py``
verifies a save without torch's model code.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Iterable, Optional

from ..runtime.errors import CheckpointError
from ..runtime.files import write_json

MANIFEST = "manifest.json"
CHUNK = 8 << 20


class DamagedCheckpoint(CheckpointError):
    """A save whose files do not match its manifest; the message names the first bad file."""


def checksum(path: str) -> dict:
    """``{"size", "crc32"}`` of one file, read in chunks."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return {"size": size, "crc32": f"{crc:08x}"}


def checksum_files(paths: Iterable[str]) -> dict:
    """``{file name: {"size", "crc32"}}`` for files of one directory."""
    return {os.path.basename(p): checksum(p) for p in paths}


def write_manifest(directory: str, known: dict, written_by: str) -> None:
    """Write ``directory/manifest.json`` (atomically, synced): ``known`` (checksums the writers
    computed) plus every other file of the directory, checksummed now, and ``written_by``: the
    megatron-core release of the save (its format differs between releases: readable before
    the save's own files are)."""
    files = dict(known)
    for name in sorted(os.listdir(directory)):
        if name not in files and name != MANIFEST and os.path.isfile(os.path.join(directory, name)):
            files[name] = checksum(os.path.join(directory, name))
    write_json(os.path.join(directory, MANIFEST), {"files": files, "megatron_core": written_by})


def read_manifest(directory: str) -> Optional[dict]:
    """``{file name: {"size", "crc32"}}``, or None for a save written before manifests."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        return json.load(open(path))["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise DamagedCheckpoint(f"{path}: unreadable manifest ({e})") from None


def written_by(directory: str) -> Optional[str]:
    """The megatron-core release a save was written with, as its manifest records it (None:
    no manifest, or one from before the record)."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        return json.load(open(path)).get("megatron_core")
    except (ValueError, AttributeError) as e:
        raise DamagedCheckpoint(f"{path}: unreadable manifest ({e})") from None


def verify(directory: str, names: Optional[Iterable[str]] = None) -> Optional[dict]:
    """Check the files of a save against its manifest (only ``names`` of them, when given);
    raises :class:`DamagedCheckpoint` naming the first missing or differing file. Returns the
    manifest, or None (nothing verified) for a save written before manifests."""
    files = read_manifest(directory)
    if files is None:
        return None
    for name in sorted(files if names is None else names):
        path = os.path.join(directory, name)
        expected = files[name]
        if not os.path.isfile(path):
            raise DamagedCheckpoint(f"{path}: missing (the manifest lists it)")
        size = os.path.getsize(path)
        if size != expected["size"]:
            raise DamagedCheckpoint(f"{path}: {size} bytes, the manifest says "
                                    f"{expected['size']} (truncated or overwritten)")
        found = checksum(path)["crc32"]
        if found != expected["crc32"]:
            raise DamagedCheckpoint(f"{path}: checksum {found}, the manifest says "
                                    f"{expected['crc32']} (the contents changed)")
    return files
