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

from megatron_ext.data.readers import Batch, BadInput, parse_unit, unit_bytes
from megatron_ext.tokenizer import HuggingFaceTokenizer, NullTokenizer, SentencePieceTokenizer


@dataclasses.dataclass
class EncodedKey:
    """The documents of a batch for one JSON key."""

    tokens: np.ndarray  # int32, all documents concatenated
    sequence_lengths: np.ndarray  # int64, one per sequence
    sequences_per_document: np.ndarray  # int64, one per document


@dataclasses.dataclass
class EncodedBatch:
    """A worker's answer for a :class:`~megatron_ext.data.readers.Batch`."""

    input_index: int
    end_line: int
    disk_bytes: int
    text_bytes: int
    documents: int
    keys: dict  # {key: EncodedKey}
    bad: list  # [(line, kind, detail)], in line order


_worker_state: tuple = ()


def init_worker(tokenizer, keys: list[str], eod: Optional[int]) -> None:
    """Pool initializer: a megatron_ext.tokenizer tokenizer, the JSON keys, and the id to append
    (None: no EOD)."""
    global _worker_state
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker process
    _worker_state = (tokenizer, keys, eod)


def _encode_texts(tokenizer, texts: list[str]) -> list[list[int]]:
    """``[tokenizer.tokenize(text) for text in texts]``, in one call into the library."""
    if isinstance(tokenizer, SentencePieceTokenizer):
        return tokenizer.sp.encode(texts, num_threads=1)
    if isinstance(tokenizer, HuggingFaceTokenizer):
        return [e.ids for e in tokenizer.tok.encode_batch_fast(texts, add_special_tokens=False)]
    return [tokenizer.tokenize(text) for text in texts]


def _check_ids(tokenizer: NullTokenizer, parsed: dict[str, list[str]], line: int) -> None:
    """NullTokenizer's texts must be ids separated by single spaces."""
    for key, texts in parsed.items():
        for text in texts:
            try:
                tokenizer.tokenize(text)
            except ValueError as e:
                raise BadInput(line, "not token ids", f"key {key!r}: {e}") from None


def _encoded_key(documents: list[list[list[int]]]) -> EncodedKey:
    sequences = [sequence for document in documents for sequence in document]
    lengths = np.fromiter(map(len, sequences), np.int64, len(sequences))
    return EncodedKey(
        tokens=np.fromiter(itertools.chain.from_iterable(sequences), np.int32, int(lengths.sum())),
        sequence_lengths=lengths,
        sequences_per_document=np.fromiter(map(len, documents), np.int64, len(documents)))


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

    ids = {key: iter(_encode_texts(tokenizer, texts[key])) for key in keys}
    documents = {key: [] for key in keys}
    for i, line in enumerate(lines):
        document = {key: [s for s in itertools.islice(ids[key], text_counts[key][i]) if s]
                    for key in keys}
        empty = [key for key in keys if not document[key]]
        if empty:
            bad.append((line, "empty document", f"no tokens for key {empty[0]!r}"))
            continue
        for key in keys:
            if eod is not None:
                document[key][-1].append(eod)
            documents[key].append(document[key])

    return EncodedBatch(
        input_index=batch.input_index, end_line=batch.end_line, disk_bytes=batch.disk_bytes,
        text_bytes=sum(unit_bytes(raw) for _, raw in batch.units),
        documents=len(documents[keys[0]]),
        keys={key: _encoded_key(documents[key]) for key in keys}, bad=sorted(bad))
