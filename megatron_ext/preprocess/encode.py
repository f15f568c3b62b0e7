"""Worker side of tools/preprocess_data.py: a batch of input units -> token ids per JSON key.

Each ``--workers`` process runs :func:`encode_batch` on whole batches, single-threaded. A document
is encoded as Megatron-LM's ``tools/preprocess_data.py`` encodes it: each text of a key (the JSON
string, or each string of a JSON list) is tokenized, texts without tokens are dropped, the others
become one sequence each, and with ``--append-eod`` the EOD id ends the last sequence. A document
without any token is reported as bad (Megatron-LM would store it as an empty document).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Optional

import numpy as np

from ..datasets.tokenizer import (GPT2BPETokenizer, HuggingFaceTokenizer, NullTokenizer,
                                  SentencePieceTokenizer)
from .byte_level import ByteLevelWordEncoder
from .readers import Batch, BadInput, parse_unit, unit_bytes
from .word_cache import WordCachedEncoder


@dataclasses.dataclass
class EncodedKey:
    """The documents of a batch for one JSON key."""

    tokens: np.ndarray  # int32, all documents concatenated
    sequence_lengths: np.ndarray  # int64, one per sequence
    sequences_per_document: np.ndarray  # int64, one per document


@dataclasses.dataclass
class EncodedBatch:
    """A worker's answer for a :class:`~megatron_ext.preprocess.readers.Batch`."""

    input_index: int
    end_line: int
    disk_bytes: int
    text_bytes: int
    documents: int
    keys: dict  # {key: EncodedKey}
    bad: list  # [(line, kind, detail)], in line order


_worker_state: tuple = ()
_word_encoder = None  # a WordCachedEncoder or ByteLevelWordEncoder, or None


def init_worker(tokenizer, keys: list[str], eod: Optional[int]) -> None:
    """Pool initializer: a megatron_ext.datasets.tokenizer tokenizer, the JSON keys, and the id to
    append (None: no EOD)."""
    global _worker_state, _word_encoder
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker process
    _worker_state = (tokenizer, keys, eod)
    _word_encoder = None
    if isinstance(tokenizer, SentencePieceTokenizer):
        _word_encoder = WordCachedEncoder.create(tokenizer.sp, tokenizer.model_file)
    elif isinstance(tokenizer, (HuggingFaceTokenizer, GPT2BPETokenizer)):
        _word_encoder = ByteLevelWordEncoder.create(tokenizer.tok)


def _flatten(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    return np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(lengths.sum())), lengths


def _encode_texts(tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``[tokenizer.tokenize(text) for text in texts]`` in one call into the library (for
    sentencepiece BPE and byte-level BPE, a distinct word at a time: megatron_ext/preprocess/
    word_cache.py, byte_level.py), as the ids of all texts concatenated (int32) and the count of
    each text's (int64)."""
    if _word_encoder is not None:
        return _word_encoder.encode(texts)
    if isinstance(tokenizer, SentencePieceTokenizer):
        return _flatten(tokenizer.sp.encode(texts, num_threads=1))
    if isinstance(tokenizer, (HuggingFaceTokenizer, GPT2BPETokenizer)):  # a tokenizers.Tokenizer
        return _flatten([e.ids for e in tokenizer.tok.encode_batch_fast(
            texts, add_special_tokens=False)])
    return _flatten([tokenizer.tokenize(text) for text in texts])


def _check_ids(tokenizer: NullTokenizer, parsed: dict[str, list[str]], line: int) -> None:
    """NullTokenizer's texts must be ids separated by single spaces."""
    for key, texts in parsed.items():
        for text in texts:
            try:
                tokenizer.tokenize(text)
            except ValueError as e:
                raise BadInput(line, "not token ids", f"key {key!r}: {e}") from None


def _documents(tokens: np.ndarray, lengths: np.ndarray, text_document: np.ndarray,
               sequences: np.ndarray, keep: np.ndarray, eod: Optional[int]) -> EncodedKey:
    """The documents ``keep`` of one key: ``text_document`` maps each text (``lengths`` ids in
    ``tokens``) to its document, ``sequences`` counts the texts with ids of each document."""
    kept_text = (lengths > 0) & keep[text_document]
    tokens = tokens[np.repeat(kept_text, lengths)]
    lengths = lengths[kept_text]
    sequences = sequences[keep]
    if eod is not None and len(sequences):
        last = np.cumsum(sequences) - 1
        tokens = np.insert(tokens, np.cumsum(lengths)[last], np.int32(eod))
        lengths[last] += 1
    return EncodedKey(tokens=tokens, sequence_lengths=lengths, sequences_per_document=sequences)


def encode_batch(batch: Batch) -> EncodedBatch:
    tokenizer, keys, eod = _worker_state
    lines, bad = [], []
    texts = {key: [] for key in keys}
    text_counts = {key: [] for key in keys}
    for line, raw in batch.units:
        try:
            parsed = parse_unit(raw, line, batch.kind, keys)
            if isinstance(tokenizer, NullTokenizer):
                _check_ids(tokenizer, parsed, line)
        except BadInput as e:
            bad.append((e.line, e.kind, e.detail))
            continue
        lines.append(line)
        for key in keys:
            texts[key].extend(parsed[key])
            text_counts[key].append(len(parsed[key]))

    # A document is its texts with ids; one without any, for any key, is bad input.
    encoded, empty = {}, np.zeros(len(lines), bool)
    for key in keys:
        tokens, lengths = _encode_texts(tokenizer, texts[key])
        text_document = np.repeat(np.arange(len(lines)), text_counts[key])
        sequences = np.bincount(text_document, lengths > 0, len(lines)).astype(np.int64)
        encoded[key] = tokens, lengths, text_document, sequences
        empty |= sequences == 0
    for i in np.flatnonzero(empty):
        key = next(key for key in keys if encoded[key][3][i] == 0)
        bad.append((lines[i], "empty document", f"no tokens for key {key!r}"))
    keys_encoded = {key: _documents(*encoded[key], ~empty, eod) for key in keys}

    return EncodedBatch(
        input_index=batch.input_index, end_line=batch.end_line, disk_bytes=batch.disk_bytes,
        text_bytes=sum(unit_bytes(raw) for _, raw in batch.units),
        documents=int(len(lines) - empty.sum()), keys=keys_encoded, bad=sorted(bad))
