"""Worker side of tools/preprocess_data.py: a batch of input units -> token ids per JSON key.

Each ``--workers`` process runs :func:`encode_batch` on whole batches, single-threaded. Texts are
encoded by gigatoken where it gives the reference library's ids (``--encoder``:
megatron_ext/preprocess/gigatoken_encoder.py decides each text before it is encoded), else by the
reference encoders (:func:`reference_encode`); a deterministic sample of the documents gigatoken
took (``--verify-fraction``, chosen by file and line) is encoded again by the reference and any
difference reported by line. A document
is encoded as Megatron-LM's ``tools/preprocess_data.py`` encodes it: each text of a key (the JSON
string, or each string of a JSON list) is tokenized, texts without tokens are dropped, the others
become one sequence each, and with ``--append-eod`` the EOD id ends the last sequence. A document
without any token is reported as bad (Megatron-LM would store it as an empty document).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import zlib
from typing import Optional

import numpy as np

from ..datasets.indexed import optimal_dtype
from ..datasets.tokenizer import (GPT2BPETokenizer, HuggingFaceTokenizer, NullTokenizer,
                                  SentencePieceTokenizer)
from .byte_level import ByteLevelWordEncoder
from .gigatoken_encoder import GigatokenEncoder
from .readers import Batch, BadInput, parse_unit, unit_bytes
from .word_cache import WordCachedEncoder


@dataclasses.dataclass
class EncodedKey:
    """The documents of a batch for one JSON key."""

    tokens: np.ndarray  # all documents concatenated: the output dtype, or int32 if ids exceed it
    sequence_lengths: np.ndarray  # int64, one per sequence
    sequences_per_document: np.ndarray  # int64, one per document
    max_token_id: Optional[int] = None  # the largest id (None: not computed)


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
    reference_documents: int = 0  # documents with a text the reference encoded
    verified: int = 0  # documents gigatoken encoded that the reference encoded again
    differences: list = dataclasses.field(default_factory=list)  # [(line, key)] of those


_worker_state: tuple = ()
_word_encoder = None  # a WordCachedEncoder or ByteLevelWordEncoder, or None
_gigatoken: Optional[GigatokenEncoder] = None


def word_encoder(tokenizer):
    """Today's fast path of the reference encoding: a WordCachedEncoder (sentencepiece BPE) or
    ByteLevelWordEncoder (byte-level BPE), or None where texts are encoded whole."""
    if isinstance(tokenizer, SentencePieceTokenizer):
        return WordCachedEncoder.create(tokenizer.sp, tokenizer.model_file)
    if isinstance(tokenizer, (HuggingFaceTokenizer, GPT2BPETokenizer)):
        return ByteLevelWordEncoder.create(tokenizer.tok)
    return None


def gigatoken_encoder(tokenizer, words=None) -> "GigatokenEncoder | str":
    """The gigatoken encoder of ``tokenizer`` (its reference: :func:`reference_encode` with
    ``words``, its :func:`word_encoder`), or why there is none."""
    if words is None:
        words = word_encoder(tokenizer)
    return GigatokenEncoder.create(tokenizer, words, functools.partial(reference_encode,
                                                                       tokenizer, words))


def init_worker(tokenizer, keys: list[str], eod: Optional[int], gigatoken: bool = False,
                verify_fraction: float = 0.0) -> None:
    """Pool initializer: a megatron_ext.datasets.tokenizer tokenizer, the JSON keys, the id to
    append (None: no EOD), whether gigatoken encodes what it can (the main process checked that
    it can), and the share of its documents the reference encodes again."""
    global _worker_state, _word_encoder, _gigatoken
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker process
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # gigatoken runs with parallel=False anyway
    _worker_state = (tokenizer, keys, eod, verify_fraction)
    _word_encoder = word_encoder(tokenizer)
    _gigatoken = gigatoken_encoder(tokenizer, _word_encoder) if gigatoken else None


def _flatten(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    return np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(lengths.sum())), lengths


def reference_encode(tokenizer, words, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``[tokenizer.tokenize(text) for text in texts]`` in one call into the library (for
    sentencepiece BPE and byte-level BPE, a distinct word at a time by ``words``, the
    :func:`word_encoder`: megatron_ext/preprocess/word_cache.py, byte_level.py), as the ids of
    all texts concatenated (int32) and the count of each text's (int64)."""
    if words is not None:
        return words.encode(texts)
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
               sequences: np.ndarray, keep: np.ndarray, eod: Optional[int],
               dtype: type) -> EncodedKey:
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
    # in the output dtype here, in parallel, rather than in the main process (and half the bytes
    # through the pipe for uint16); ids that do not fit stay int32 for the writer to refuse
    largest = int(tokens.max()) if len(tokens) else -1
    if largest <= np.iinfo(dtype).max:
        tokens = tokens.astype(dtype)
    return EncodedKey(tokens=tokens, sequence_lengths=lengths, sequences_per_document=sequences,
                      max_token_id=largest)


def _encode_texts(tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ids of ``texts`` (concatenated, and the count of each text's), and which texts the
    reference encoded."""
    if _gigatoken is not None:
        return _gigatoken.encode(texts)
    return *reference_encode(tokenizer, _word_encoder, texts), np.ones(len(texts), bool)


def sampled(path: str, line: int, fraction: float) -> bool:
    """Whether the document at ``path``:``line`` is in the ``--verify-fraction`` sample: the
    same documents in every run, whatever the workers and batches."""
    return zlib.crc32(f"{path}:{line}".encode()) < fraction * (1 << 32)


def _verify(tokenizer, batch: Batch, lines: list[int], texts: list[str], text_document,
            tokens: np.ndarray, lengths: np.ndarray, by_reference: np.ndarray,
            fraction: float) -> tuple[np.ndarray, list[int]]:
    """The sampled documents gigatoken encoded, encoded again by the reference: which (a mask
    over the batch's documents), and the lines of those whose ids differ."""
    documents = [d for d, line in enumerate(lines) if sampled(batch.path, line, fraction)]
    chosen = np.isin(text_document, documents) & ~by_reference
    checked = np.zeros(len(lines), bool)
    if not chosen.any():
        return checked, []
    again, again_lengths = reference_encode(tokenizer, _word_encoder,
                                            [texts[i] for i in np.flatnonzero(chosen)])
    ends = np.cumsum(lengths)
    ours = np.concatenate([tokens[end - n:end] for end, n in zip(ends[chosen], lengths[chosen])])
    differ = set()
    if not (np.array_equal(again_lengths, lengths[chosen]) and np.array_equal(again, ours)):
        starts = np.cumsum(again_lengths) - again_lengths
        for i, start, n in zip(np.flatnonzero(chosen), starts, again_lengths):
            if n != lengths[i] or not np.array_equal(again[start:start + n],
                                                     tokens[ends[i] - n:ends[i]]):
                differ.add(lines[text_document[i]])
    checked[text_document[chosen]] = True
    return checked, sorted(differ)


def encode_batch(batch: Batch) -> EncodedBatch:
    tokenizer, keys, eod, verify_fraction = _worker_state
    lines, bad = [], []
    texts = {key: [] for key in keys}
    text_counts = {key: [] for key in keys}
    text_bytes = 0
    for line, raw in batch.iter_units():
        text_bytes += unit_bytes(raw)
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
    reference, verified, differences = np.zeros(len(lines), bool), np.zeros(len(lines), bool), []
    for key in keys:
        tokens, lengths, by_reference = _encode_texts(tokenizer, texts[key])
        text_document = np.repeat(np.arange(len(lines)), text_counts[key])
        sequences = np.bincount(text_document, lengths > 0, len(lines)).astype(np.int64)
        encoded[key] = tokens, lengths, text_document, sequences
        empty |= sequences == 0
        reference[text_document[by_reference]] = True
        if _gigatoken is not None and verify_fraction > 0:
            checked, differ = _verify(tokenizer, batch, lines, texts[key], text_document, tokens,
                                      lengths, by_reference, verify_fraction)
            verified |= checked
            differences += [(line, key) for line in differ]
    for i in np.flatnonzero(empty):
        key = next(key for key in keys if encoded[key][3][i] == 0)
        bad.append((lines[i], "empty document", f"no tokens for key {key!r}"))
    dtype = optimal_dtype(tokenizer.vocab_size)
    keys_encoded = {key: _documents(*encoded[key], ~empty, eod, dtype) for key in keys}

    return EncodedBatch(
        input_index=batch.input_index, end_line=batch.end_line, disk_bytes=batch.disk_bytes,
        text_bytes=text_bytes,
        documents=int(len(lines) - empty.sum()), keys=keys_encoded, bad=sorted(bad),
        reference_documents=int((reference & ~empty).sum()),
        verified=int((verified & ~reference & ~empty).sum()),
        differences=sorted(differences))
