"""The gigatoken encoder's character table (megatron_ext/preprocess/characters.py), computed once
per tokenizer and versions of the libraries that decide it, in the main process of
tools/preprocess_data.py, which hands it to every worker; cached beside the tokenizer (a file in
its folder, or beside its file) so that the next run reads it. Computing it costs a few CPU
seconds for a byte-level BPE (every BMP character checked after four contexts by both libraries),
so a run on less than :data:`TABLE_FROM_BYTES` of input that finds no cache lets its workers learn
the characters they meet instead, which costs less there.

The cache file's name holds the sha256 of what decides the check (the tokenizer's JSON, or the
sentencepiece model's bytes) with the versions of gigatoken, tokenizers and regex: a changed
tokenizer or library reads no stale table. It is written atomically; a folder that cannot be
written only loses the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from typing import Optional

from ..runtime.files import read_json, write_json
from .gigatoken_encoder import GigatokenEncoder

CACHE_PREFIX = ".gigatoken-characters-"
LIBRARIES = ("gigatoken", "tokenizers", "regex", "sentencepiece")
TABLE_FROM_BYTES = 64 << 20  # input bytes from which a run computes the table it has not cached


def _version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cache_key(tokenizer) -> str:
    """sha256 of the tokenizer's definition and the versions of :data:`LIBRARIES`."""
    digest = hashlib.sha256()
    model_file = getattr(tokenizer, "model_file", None)
    if model_file is not None:  # sentencepiece
        with open(model_file, "rb") as f:
            digest.update(f.read())
    else:
        digest.update(tokenizer.tok.to_str().encode())
    digest.update(json.dumps({name: _version(name) for name in LIBRARIES}).encode())
    return digest.hexdigest()


def cache_path(tokenizer_path: Optional[str], key: str) -> Optional[str]:
    """The cache file for a tokenizer at ``tokenizer_path`` (a folder or a file; None or a hub
    name: no cache)."""
    if not tokenizer_path or not os.path.exists(tokenizer_path):
        return None
    folder = tokenizer_path if os.path.isdir(tokenizer_path) \
        else os.path.dirname(os.path.abspath(tokenizer_path))
    return os.path.join(folder, f"{CACHE_PREFIX}{key[:32]}.json")


def character_table(encoder: GigatokenEncoder, tokenizer, tokenizer_path: Optional[str],
                    compute: bool = True) -> Optional[tuple[str, str]]:
    """``encoder``'s character table: read from its cache beside ``tokenizer_path``, else
    computed where ``compute`` (and cached where the folder can be written); None where no
    character is checked or it is neither cached nor computed."""
    if encoder.characters is None:
        return None
    key = cache_key(tokenizer)
    path = cache_path(tokenizer_path, key)
    if path is not None and os.path.exists(path):
        try:
            cached = read_json(path)
        except (OSError, ValueError):
            cached = None
        if isinstance(cached, dict) and cached.get("key") == key \
                and isinstance(cached.get("checked"), str) \
                and isinstance(cached.get("admitted"), str):
            return cached["checked"], cached["admitted"]
    if not compute:
        return None
    checked, admitted = encoder.character_table()
    if path is not None:
        try:
            write_json(path, {"key": key, "checked": checked, "admitted": admitted})
        except OSError:
            pass  # a read-only folder: the next run computes it again
    return checked, admitted
