"""Worker side of tools/preprocess_data.py: a task of input -> token ids per JSON key, written by
the worker to its own token files in the work folder.

Each ``--workers`` process runs :func:`encode_task` on whole tasks, single-threaded: spans of
uncompressed files and pieces of the others (megatron_ext/preprocess/pieces.py), which it reads
itself, each cut into batches of about 0.5 MB that :func:`encode_batch` encodes. The tokens of a
task are appended to the worker's file of each key (``worker-PID_KEY.bin``), and the task's answer names where
(:class:`WrittenKey`), with the index of its documents and its counts: the main process, which
orders the answers, moves no token. Texts are
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

import collections
import dataclasses
import functools
import itertools
import os
import zlib
from typing import Iterator, Optional

import numpy as np

from ..datasets.indexed import optimal_dtype
from ..datasets.tokenizer import (GPT2BPETokenizer, HuggingFaceTokenizer, NullTokenizer,
                                  SentencePieceTokenizer)
from .byte_level import ByteLevelWordEncoder
from .gigatoken_encoder import GigatokenEncoder
from .pieces import Piece
from .readers import Batch, BadInput, Span, parse_unit, unit_bytes
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
    """The encoding of a :class:`~megatron_ext.preprocess.readers.Batch`."""

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


@dataclasses.dataclass
class WrittenKey:
    """A task's documents for one JSON key: their tokens, ``nbytes`` bytes at ``offset`` of the
    worker's token file ``file`` (a name in the work folder), and their index."""

    file: str
    offset: int
    nbytes: int
    tokens: int
    max_token_id: int  # -1 without tokens; above the dtype's range: nothing was written
    sequence_lengths: np.ndarray  # int32, one per sequence
    sequences_per_document: np.ndarray  # int64, one per document


@dataclasses.dataclass
class TaskResult:
    """A worker's answer for a task: where its tokens are, its index, its counts, and where in
    the inputs it ends (``end_offset``: the byte offset, when the task ended in a span)."""

    end_input: int
    end_line: int
    end_offset: Optional[int]
    disk_bytes: int
    text_bytes: int
    documents: int
    keys: dict  # {key: WrittenKey}
    bad: list  # [(input index, line, kind, detail)], in input order
    reference_documents: int
    verified: int
    differences: list  # [(input index, line, key)]


_worker_state: tuple = ()
_token_files: dict = {}  # {key: this worker's open token file}
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


def gigatoken_encoder(tokenizer, words=None, table: Optional[tuple[str, str]] = None
                      ) -> "GigatokenEncoder | str":
    """The gigatoken encoder of ``tokenizer`` (its reference: :func:`reference_encode` with
    ``words``, its :func:`word_encoder`; ``table``: its character table, if computed), or why
    there is none."""
    if words is None:
        words = word_encoder(tokenizer)
    return GigatokenEncoder.create(tokenizer, words, functools.partial(reference_encode,
                                                                       tokenizer, words), table)


def init_worker(tokenizer, keys: list[str], eod: Optional[int], gigatoken: bool = False,
                verify_fraction: float = 0.0, folder: Optional[str] = None,
                table: Optional[tuple[str, str]] = None) -> None:
    """Pool initializer: a megatron_ext.datasets.tokenizer tokenizer, the JSON keys, the id to
    append (None: no EOD), whether gigatoken encodes what it can (the main process checked that
    it can), the share of its documents the reference encodes again, the work folder where
    :func:`encode_task` writes the tokens, and gigatoken's character table (the main process
    computed it once: megatron_ext/preprocess/character_table.py; None: learned here)."""
    global _worker_state, _word_encoder, _gigatoken, _token_files
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker process
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # gigatoken runs with parallel=False anyway
    _worker_state = (tokenizer, keys, eod, verify_fraction, folder)
    _token_files = {}
    _word_encoder = word_encoder(tokenizer)
    _gigatoken = gigatoken_encoder(tokenizer, _word_encoder, table) if gigatoken else None


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
    if not keep.all():  # a text without ids holds no tokens: only dropped documents take any out
        tokens = tokens[np.repeat(kept_text, lengths)]
    lengths = lengths[kept_text]
    sequences = sequences[keep]
    with_eod = eod is not None and len(sequences) > 0
    largest = max(int(tokens.max()) if len(tokens) else -1, eod if with_eod else -1)
    # in the output dtype here, in parallel, rather than in the main process (and half the bytes
    # through the pipe for uint16); ids that do not fit stay int32 for the writer to refuse
    out_dtype = dtype if largest <= np.iinfo(dtype).max else np.int32
    if with_eod:  # the EOD after each document's last text, in one pass with the cast
        last = np.cumsum(sequences) - 1
        at = np.cumsum(lengths)[last] + np.arange(len(last))
        lengths[last] += 1
        out = np.empty(len(tokens) + len(last), out_dtype)
        ids = np.ones(len(out), bool)
        ids[at] = False
        out[ids], out[at] = tokens, eod
        tokens = out
    else:
        tokens = tokens.astype(out_dtype, copy=False)
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
    """The documents of ``batch``, encoded; bad units reported by line."""
    tokenizer, keys, eod, verify_fraction, _ = _worker_state
    lines, bad = [], []
    texts = {key: [] for key in keys}
    text_counts = {key: [] for key in keys}
    text_bytes = 0
    units, end_line = batch.read_units()
    for line, raw in units:
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
        input_index=batch.input_index, end_line=end_line, disk_bytes=batch.disk_bytes,
        text_bytes=text_bytes,
        documents=int(len(lines) - empty.sum()), keys=keys_encoded, bad=sorted(bad),
        reference_documents=int((reference & ~empty).sum()),
        verified=int((verified & ~reference & ~empty).sum()),
        differences=sorted(differences))


def token_file_name(key: str) -> str:
    """This worker's token file of ``key`` (in the work folder)."""
    return f"worker-{os.getpid()}_{key}.bin"


def _token_file(key: str):
    if key not in _token_files:
        _token_files[key] = open(os.path.join(_worker_state[4], token_file_name(key)), "ab",
                                 buffering=0)
    return _token_files[key]


def _encoded_batches(source) -> Iterator[EncodedBatch]:
    """A task's source (a Span or a Piece) encoded batch by batch; a span's lines numbered on
    from its first as its blocks are split."""
    if isinstance(source, Piece):
        yield from map(encode_batch, source.batches(_worker_state[1]))
        return
    line = source.first_line
    for block in source.blocks():
        encoded = encode_batch(source.batch(block, line))
        line = encoded.end_line + 1
        yield encoded


def encode_task(sources: list) -> TaskResult:
    """Encode a task's sources (:class:`~megatron_ext.preprocess.readers.Span`\\ s and
    :class:`~megatron_ext.preprocess.pieces.Piece`\\ s, in input order), append the tokens to
    this worker's token files, and answer where they are."""
    tokenizer, keys, *_ = _worker_state
    dtype = optimal_dtype(tokenizer.vocab_size)
    files = {key: _token_file(key) for key in keys}
    offsets = {key: os.lseek(f.fileno(), 0, os.SEEK_END) for key, f in files.items()}
    written = dict.fromkeys(keys, 0)
    largest = dict.fromkeys(keys, -1)
    lengths = {key: [] for key in keys}
    per_document = {key: [] for key in keys}
    bad, differences = [], []
    counts = collections.Counter()
    end_input, end_line = 0, 0
    for source in sources:
        for encoded in _encoded_batches(source):
            end_input, end_line = encoded.input_index, encoded.end_line
            bad += [(encoded.input_index, *entry) for entry in encoded.bad]
            differences += [(encoded.input_index, *entry) for entry in encoded.differences]
            counts.update(disk_bytes=encoded.disk_bytes, text_bytes=encoded.text_bytes,
                          documents=encoded.documents, verified=encoded.verified,
                          reference_documents=encoded.reference_documents)
            for key, documents in encoded.keys.items():
                largest[key] = max(largest[key], documents.max_token_id)
                if largest[key] > np.iinfo(dtype).max:
                    continue  # the main process refuses the task
                data = memoryview(documents.tokens).cast("B")
                while len(data):
                    data = data[files[key].write(data):]
                written[key] += documents.tokens.nbytes
                lengths[key].append(documents.sequence_lengths.astype(np.int32))
                per_document[key].append(documents.sequences_per_document)
    keys_written = {key: WrittenKey(
        file=token_file_name(key), offset=offsets[key], nbytes=written[key],
        tokens=written[key] // np.dtype(dtype).itemsize, max_token_id=largest[key],
        sequence_lengths=np.concatenate([np.zeros(0, np.int32), *lengths[key]]),
        sequences_per_document=np.concatenate([np.zeros(0, np.int64), *per_document[key]]))
        for key in keys}
    last = sources[-1]
    return TaskResult(
        end_input=end_input, end_line=end_line,
        end_offset=last.end if isinstance(last, Span) else None,
        disk_bytes=counts["disk_bytes"], text_bytes=counts["text_bytes"],
        documents=counts["documents"], keys=keys_written, bad=bad,
        reference_documents=counts["reference_documents"], verified=counts["verified"],
        differences=differences)
