"""Held-out token windows: the fixed token set that a study's evaluation and the probes read
(the same tokens for every run and checkpoint).

A held-out set is the first ``count`` tokens of a token stream (an indexed dataset's
documents in order, end-of-document tokens included), cut into consecutive windows of
``seq_length + 1`` tokens that overlap by one (the label of a window's last position).
:func:`cut_documents` cuts each token's document number the same way (the probes split by
document), and :func:`tokens_sha256` fingerprints the windows (in study.json and
probes.json: the same hash is the same tokens). :func:`shared_documents` checks a held-out
set against a training dataset by content: the held-out documents whose tokens are a
training document's (a copy or a rebuild of the training prefix, under any path).
"""

from __future__ import annotations

import hashlib
from typing import Iterable

import numpy as np

from ..runtime.errors import DataError


def held_out_tokens(prefix: str, count: int, seq_length: int) -> np.ndarray:
    """``[n, seq_length + 1]`` token windows: the first ``count`` tokens of the indexed
    dataset ``prefix``, cut into ``n = count // seq_length`` windows."""
    return cut_windows(indexed_documents(prefix), count, seq_length, f"eval data {prefix}",
                       "the eval tokens")


def indexed_documents(prefix: str):
    """The documents of the indexed dataset ``prefix``, in order, as int64 arrays (read
    lazily)."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    dataset = IndexedDataset(prefix)
    return (np.asarray(dataset[i], dtype=np.int64) for i in range(len(dataset)))


def cut_windows(documents, count: int, seq_length: int, source: str, knob: str) -> np.ndarray:
    """:func:`held_out_tokens`' windows of an iterable of token arrays (read only as far as
    needed); too few tokens name ``source`` and the ``knob`` to lower."""
    n = count // seq_length
    need, parts, have = n * seq_length + 1, [], 0
    for document in documents:
        if have >= need:
            break
        parts.append(document)
        have += len(document)
    if n == 0 or have < need:
        raise DataError(f"{source} holds {have:,} tokens; the held-out set "
                        f"needs {need:,} ({knob} {count:,} of sequence length "
                        f"{seq_length}): lower {knob}")
    stream = np.concatenate(parts)[:need]
    index = np.arange(n)[:, None] * seq_length + np.arange(seq_length + 1)[None, :]
    return stream[index]


def cut_documents(documents, count: int, seq_length: int, source: str, knob: str
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(windows, document ids)``: :func:`cut_windows` of the token arrays ``documents``,
    and the same cut of each token's document number."""
    need, parts, have = (count // seq_length) * seq_length + 1, [], 0
    for document in documents:
        if have >= need:
            break
        parts.append(np.asarray(document))
        have += len(document)
    windows = cut_windows(parts, count, seq_length, source, knob)
    ids = cut_windows([np.full(len(d), i) for i, d in enumerate(parts)], count, seq_length,
                      source, knob)
    return windows, ids


def tokens_sha256(windows: np.ndarray) -> str:
    """The held-out tokens' fingerprint: sha256 of the windows as little-endian int64."""
    return hashlib.sha256(np.ascontiguousarray(windows, dtype="<i8").tobytes()).hexdigest()


# How far into a training dataset :func:`shared_documents` reads (tokens): the held-out set
# is compared with the training documents up to there, and the result says so.
SCAN_TOKENS = 1 << 30


def document_sha256(document) -> str:
    """One document's fingerprint: sha256 of its token ids as little-endian int64."""
    return hashlib.sha256(np.ascontiguousarray(document, dtype="<i8").tobytes()).hexdigest()


def shared_documents(held_out: Iterable, count: int, training: Iterable,
                     scan_tokens: int = SCAN_TOKENS) -> dict:
    """``{"held_out", "shared", "scanned_tokens", "complete"}``: how many of the held-out
    documents covering the first ``count`` tokens (``held_out``: token arrays in order)
    are, token for token, a document among the first ``scan_tokens`` tokens of
    ``training`` (token arrays), how many tokens of it were read, and whether that was all
    of it."""
    wanted, have = set(), 0
    for document in held_out:
        if have > count:
            break
        wanted.add(document_sha256(document))
        have += len(document)
    shared, scanned, complete = set(), 0, True
    for document in training:
        if scanned >= scan_tokens:
            complete = False
            break
        digest = document_sha256(document)
        if digest in wanted:
            shared.add(digest)
        scanned += len(document)
    return {"held_out": len(wanted), "shared": len(shared), "scanned_tokens": scanned,
            "complete": complete}
