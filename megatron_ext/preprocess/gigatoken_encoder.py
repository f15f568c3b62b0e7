"""gigatoken (a Rust tokenizer, MIT licence, pinned in pyproject.toml) wherever it gives the
reference library's ids: Hugging Face byte-level BPE (``HuggingFaceTokenizer``,
``GPT2BPETokenizer``, SmolLM2's ``Digits`` + ``ByteLevel``) and sentencepiece BPE with byte
fallback (``GPTSentencePieceTokenizer``, ``SentencePieceTokenizer``), at about ten times the speed
of today's encoders (megatron_ext/preprocess/byte_level.py, word_cache.py), which stay the
reference and take every other text.

Each text is routed *before* it is encoded, by a cheap test that is exact for the cases where
gigatoken 0.10.0 is known to differ (issue #51); none is encoding twice and comparing:

* special-token text: a text holding the text of an added token (byte-level BPE), or of a
  sentencepiece piece that is not a normal one (``<s>``, ``</s>``, ``<unk>``, user-defined
  symbols, byte pieces ``<0x41>``), which gigatoken may match as a token where the reference
  library does not. A byte-level BPE whose added tokens are matched whole (the word encoder's
  conditions, megatron_ext/preprocess/byte_level.py) cuts such a text as the library does (the
  tokens leftmost-longest, the stretches between pre-tokenized apart): gigatoken encodes the
  stretches and each token's id goes between them (issue #56: 1,740 of the rich corpus's
  141,462 documents hold such text, and the command took 1.1x the CPU with them all on the
  reference path); sentencepiece's goes to the reference;
* byte-level BPE, Unicode tables: a text holding a character that gigatoken's pre-tokenizer (ICU
  tables) and the reference (``tokenizers``' tables, through our words regex) class differently;
  each character is checked once, by the words both cut from it after a letter, a digit, a
  period and a space (megatron_ext/preprocess/characters.py): the main process checks the BMP
  and the emoji once per tokenizer and library versions (a table cached beside the tokenizer,
  megatron_ext/preprocess/character_table.py) and hands the table to the workers;
* sentencepiece, normalization: gigatoken applies the model's character map a grapheme or a
  character at a time, sentencepiece by longest match over the text, so a text that could hold a
  key of more than one character (it holds a character that is the second or a later one of such
  a key: a combining mark, a half-width voiced mark, ...) goes to the reference; with
  ``remove_extra_whitespaces``, gigatoken strips any Unicode whitespace from the ends and
  sentencepiece only spaces, so a text whose ends, spaces aside, are other whitespace (or
  characters the map changes) goes too.

SmolLM2's ``Digits(individual_digits)`` + ``ByteLevel`` pre-tokenizer (which gigatoken cannot
load) is encoded by cutting each digit out, as ``Digits`` does, and encoding the stretches and
digits with gigatoken's GPT-2 pre-tokenizer: the pieces are the words that pre-tokenizer would
cut from each stretch, so the ids are the same.

gigatoken runs on the calling thread (``parallel=False``: the worker processes are the
parallelism, nothing oversubscribes the cores), and its word cache, unbounded in 0.10.0, is
bounded per process: when the worker's resident memory has grown by :data:`MAX_CACHE_BYTES` since
the tokenizer was built, it is built afresh (its ids do not depend on the cache).
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Callable, Optional

import numpy as np
import regex

from ..datasets.tokenizer import GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer
from .byte_level import CONTEXTS, DIGIT_WORDS, GPT2_WORDS, ByteLevelWordEncoder
from .characters import CharacterCheck, table

MAX_CACHE_BYTES = 256 << 20  # per worker process: growth of its resident memory before a rebuild
CHECK_MEMORY_EVERY = 16  # batches
_DIGIT = regex.compile(r"(\p{N})")
_NORMAL_PIECE = 1  # sentencepiece ModelProto.SentencePiece.Type
GIGATOKEN, CUT, REFERENCE = 0, 1, 2  # a text's route: whole, cut at its added tokens, reference


def gigatoken_version() -> Optional[str]:
    """The installed gigatoken's version, None when it is not installed."""
    from importlib import metadata
    try:
        return metadata.version("gigatoken")
    except metadata.PackageNotFoundError:
        return None


def _resident_bytes() -> int:
    """This process's resident memory (0 where /proc is missing: no bound, as in gigatoken)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _loaded(build: Callable):
    """``build()``'s gigatoken tokenizer, or why gigatoken cannot load it."""
    try:
        return build()
    except Exception as e:  # noqa: BLE001 - gigatoken raises ValueError or its Rust errors
        return f"gigatoken cannot load it ({str(e).splitlines()[0]})"


class _SpecialText:
    """Whether a text holds any of some strings (few first characters: a ``in`` each first)."""

    def __init__(self, strings: list[str]):
        strings = sorted({s for s in strings if s}, key=len, reverse=True)
        self.first = sorted({s[0] for s in strings})
        self.pattern = regex.compile("|".join(map(regex.escape, strings))) if strings else None

    def found(self, text: str) -> bool:
        return self.pattern is not None and any(c in text for c in self.first) \
            and self.pattern.search(text) is not None


class Charsmap:
    """A sentencepiece precompiled character map, read from its blob (a darts-clone double
    array after its 4-byte size, then the replacements, each ending in a NUL): ``single``, the
    replacement of each key of one character; ``later``, the characters that are the second or a
    later one of a longer key. The trie is walked breadth first, every node of a level at once
    (a unit's parent is its index XOR its label), characters decoded from UTF-8 on the way."""

    def __init__(self, blob: bytes):
        self.single: dict[str, str] = {}
        self.later: set[str] = set()
        self.crlf = False
        if not blob:
            return
        size = int.from_bytes(blob[:4], "little")
        units = np.frombuffer(blob[4:4 + size], "<u4").astype(np.int64)
        replacements = blob[4 + size:]
        offset = (units >> 10) << ((units & (1 << 9)) >> 6)
        label = units & ((1 << 31) | 0xFF)  # a value unit has bit 31 set: no label
        index = np.flatnonzero((label >= 1) & (label <= 255))
        parent = index ^ label[index]
        order = np.argsort(parent, kind="stable")
        index, parent = index[order], parent[order]
        # per node of a level: its unit, the code point being decoded, the continuation bytes
        # it still needs, the characters completed up to it, and the first character
        nodes = point = need = chars = first = np.zeros(1, np.int64)
        crlf = False
        while len(nodes):
            bases = nodes ^ offset[nodes]
            lo, hi = np.searchsorted(parent, bases), np.searchsorted(parent, bases, "right")
            counts = hi - lo
            owner = np.repeat(np.arange(len(nodes)), counts)
            children = index[np.repeat(lo - (np.cumsum(counts) - counts), counts)
                             + np.arange(counts.sum())]
            byte = label[children]
            lead = need[owner] == 0
            kind = [byte < 0x80, byte >= 0xF0, byte >= 0xE0]
            point = np.where(lead, np.select(kind, [byte, byte & 7, byte & 0xF], byte & 0x1F),
                             (point[owner] << 6) | (byte & 0x3F))
            need = np.where(lead, np.select(kind, [0, 3, 2], 1), need[owner] - 1)
            done = need == 0
            chars = chars[owner] + done
            first = np.where(done & (chars == 1), point, first[owner])
            cr_lf = done & (chars == 2) & (first == 13) & (point == 10)
            crlf |= bool(cr_lf.any())
            self.later.update(map(chr, np.unique(point[done & (chars > 1) & ~cr_lf]).tolist()))
            leaf = done & (chars == 1) & ((units[children] >> 8) & 1 == 1)
            values = units[children[leaf] ^ offset[children[leaf]]] & ((1 << 31) - 1)
            for character, start in zip(point[leaf].tolist(), values.tolist()):
                self.single[chr(character)] = replacements[
                    start:replacements.index(b"\0", start)].decode("utf-8", "replace")
            nodes = children
        self.crlf = crlf  # CR LF is a key: gigatoken maps it as sentencepiece does, as one grapheme


class GigatokenEncoder:
    """``encode(texts)``: the reference library's ids of ``texts``, by gigatoken for those it
    admits (:meth:`admits`) and by ``reference`` (an ``encode(texts) -> (tokens, lengths)``) for
    the rest."""

    def __init__(self, build: Callable, backend, reference: Callable, special: _SpecialText,
                 characters: Optional[CharacterCheck] = None, digits: bool = False,
                 stripped: Optional[dict] = None, words: Optional[ByteLevelWordEncoder] = None):
        self.build, self.backend, self.reference = build, backend, reference
        self.special, self.characters, self.digits = special, characters, digits
        self.stripped = stripped  # the character map, when sentencepiece strips spaces
        self.words = words  # cuts a text at its added tokens as the library does, if it can
        self.batches = 0
        self.memory = _resident_bytes()

    @classmethod
    def create(cls, tokenizer, word_encoder, reference: Callable,
               table: Optional[tuple[str, str]] = None) -> "GigatokenEncoder | str":
        """The encoder for a megatron_ext tokenizer, whose reference encoding (today's, of
        megatron_ext/preprocess/encode.py) is ``reference`` and uses ``word_encoder`` (a
        ByteLevelWordEncoder, a WordCachedEncoder or None), or why gigatoken cannot take it;
        ``table``: its :meth:`character_table`, if computed."""
        if gigatoken_version() is None:
            return "gigatoken is not installed (pip install gigatoken)"
        import gigatoken

        if isinstance(tokenizer, SentencePieceTokenizer):
            return cls._for_sentencepiece(gigatoken, tokenizer, reference, table)
        if isinstance(tokenizer, (HuggingFaceTokenizer, GPT2BPETokenizer)):
            if not isinstance(word_encoder, ByteLevelWordEncoder):
                return ("not a byte-level BPE with GPT-2's pre-tokenizer (alone or after SmolLM2's "
                        "Digits), no normalizer, no dropout")
            return cls._for_byte_level(gigatoken, tokenizer, word_encoder, reference, table)
        return f"{type(tokenizer).__name__} is not a BPE tokenizer gigatoken loads"

    @classmethod
    def _for_byte_level(cls, gigatoken, tokenizer, words: ByteLevelWordEncoder, reference, table):
        spec = json.loads(tokenizer.tok.to_str())
        digits = words.words.pattern == DIGIT_WORDS
        if digits:  # the stretches between digits get GPT-2's pre-tokenizer alone
            spec["pre_tokenizer"] = spec["pre_tokenizer"]["pretokenizers"][1]
        data = json.dumps(spec)

        def build():
            return gigatoken.Tokenizer.from_json(data).backend

        backend = _loaded(build)
        if isinstance(backend, str):
            return backend
        gpt2 = regex.compile(GPT2_WORDS)

        def gigatoken_agrees(character: str) -> bool:
            for context in CONTEXTS:
                text = context + character
                ends = list(itertools.accumulate(map(len, gigatoken.pretokenizer(text.encode()))))
                ours = [len(text[:m.end()].encode()) for m in gpt2.finditer(text)]
                if ends != ours:
                    return False
            return True

        characters = CharacterCheck(lambda c: words.agrees(c) and gigatoken_agrees(c), table)
        special = _SpecialText([token["content"] for token in spec.get("added_tokens") or []])
        return cls(build, backend, reference, special, characters=characters, digits=digits,
                   words=words if words.added is not None else None)

    @classmethod
    def _for_sentencepiece(cls, gigatoken, tokenizer, reference, table):
        try:
            from sentencepiece import sentencepiece_model_pb2
        except ImportError:  # protobuf is missing
            return "reading the sentencepiece model needs protobuf"
        model = sentencepiece_model_pb2.ModelProto()
        with open(tokenizer.model_file, "rb") as f:
            model.ParseFromString(f.read())
        model_file = tokenizer.model_file

        def build():
            return gigatoken.Tokenizer.from_sentencepiece(model_file).backend

        backend = _loaded(build)
        if isinstance(backend, str):
            return backend
        mapping = Charsmap(model.normalizer_spec.precompiled_charsmap)
        # A text holding a character the map changes, other than an ASCII control (which is a
        # grapheme of its own), or one that could continue a longer key, goes to the reference:
        # gigatoken maps a grapheme at a time, and a grapheme whose first character is a key
        # loses the rest (U+1D68 U+073F becomes ρ alone).
        changed = set(mapping.single) - set(map(chr, range(32))) - {"\x7f"}
        check = (lambda c: c not in mapping.later and c not in changed) \
            if mapping.later or changed else None
        special = _SpecialText([p.piece for p in model.pieces if p.type != _NORMAL_PIECE]
                               + ["\r\n"] * mapping.crlf)
        return cls(build, backend, reference, special,
                   characters=check and CharacterCheck(check, table),
                   stripped=mapping.single if model.normalizer_spec.remove_extra_whitespaces
                   else None)

    def character_table(self) -> Optional[tuple[str, str]]:
        """The table (megatron_ext/preprocess/characters.py): the characters checked and those
        gigatoken classes as the reference does; None where no character is checked."""
        return None if self.characters is None else table(self.characters.check)

    def admits(self, text: str, utf8: Optional[bytes] = None) -> bool:
        """Whether gigatoken gives the reference library's ids for ``text`` whole (module
        docstring); ``utf8``: its UTF-8, if at hand (the character check then searches fewer
        characters)."""
        return self._route(text, utf8) == GIGATOKEN

    def _route(self, text: str, utf8: Optional[bytes]) -> int:
        """GIGATOKEN, CUT (at its added tokens, gigatoken then encoding the stretches) or
        REFERENCE (module docstring)."""
        special = self.special.found(text)
        if special and self.words is None:
            return REFERENCE
        if self.stripped is not None and not self._ends_agree(text):
            return REFERENCE
        if self.characters is not None and not self.characters.admits(text, utf8):
            return REFERENCE
        return CUT if special else GIGATOKEN

    def _ends_agree(self, text: str) -> bool:
        """Whether the text's ends, mapped and past the spaces both strip, are not whitespace
        (which gigatoken strips and sentencepiece keeps)."""
        for characters, end in ((text, 0), (reversed(text), -1)):
            for character in characters:
                mapped = self.stripped.get(character, character).strip(" ")
                if mapped:
                    if mapped[end].isspace():
                        return False
                    break
        return True

    def encode_with_gigatoken(self, texts: list[str], utf8: Optional[list] = None
                              ) -> tuple[np.ndarray, np.ndarray]:
        """gigatoken's ids of every text, admitted or not (:meth:`encode` takes the admitted);
        ``utf8``: each text's UTF-8 or None, if at hand, which gigatoken then encodes as it is
        (the same ids) instead of encoding the text to UTF-8 again."""
        if utf8 is not None and not self.digits:
            texts = [text if raw is None else raw for text, raw in zip(texts, utf8)]
        if self.digits:
            pieces, owner = [], []
            for i, text in enumerate(texts):
                split = [piece for piece in _DIGIT.split(text) if piece]
                pieces += split
                owner += [i] * len(split)
        else:
            pieces = texts
        # a text at a time: gigatoken's sentencepiece BPE keeps its word cache only across
        # single calls (4x faster than a batch call per 0.5 MB), and its byte-level BPE is as
        # fast so, without the awkward array a batch call builds (0.5 ms a call)
        ids = [self.backend.encode(piece) for piece in pieces]
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        tokens = np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32)
        if self.digits:
            lengths = np.bincount(np.array(owner, np.int64), lengths, len(texts)).astype(np.int64)
        return tokens, lengths

    def cut_at_added_tokens(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The ids of texts that hold added tokens, cut at them as the library cuts them: the
        stretches between encoded by gigatoken, each token's id between them (module
        docstring)."""
        ids = []
        for text in texts:
            parts = self.words.cut(text)  # stretch, token, stretch, ..., stretch
            tokens, lengths = self.encode_with_gigatoken(parts[::2])
            stretches = np.split(tokens, np.cumsum(lengths)[:-1])
            ids.append(np.concatenate([stretches[j // 2] if j % 2 == 0 else
                                       np.array(self.words.added_ids[part], np.int32)
                                       for j, part in enumerate(parts)]))
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        return (np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32)), lengths

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The ids of all ``texts`` concatenated (int32), the count of each text's (int64), and
        which texts the reference encoded (bool)."""
        # the UTF-8 of each text beyond ASCII, made once for the check and gigatoken (an ASCII
        # text is its own UTF-8: gigatoken reads it without a copy)
        utf8 = [None if text.isascii() else text.encode("utf-8") for text in texts]
        route = np.fromiter((self._route(text, raw) for text, raw in zip(texts, utf8)), np.int8,
                            len(texts))
        self._bound_memory()
        by_reference = route == REFERENCE
        if not route.any():
            return *self.encode_with_gigatoken(texts, utf8), by_reference
        fast, cut, slow = (np.flatnonzero(route == way) for way in (GIGATOKEN, CUT, REFERENCE))
        lengths = np.zeros(len(texts), np.int64)
        pieces = [None] * len(texts)
        encoded = ((fast, self.encode_with_gigatoken([texts[i] for i in fast],
                                                     [utf8[i] for i in fast])),
                   (cut, self.cut_at_added_tokens([texts[i] for i in cut])),
                   (slow, self.reference([texts[i] for i in slow])))
        for where, (tokens, counts) in encoded:
            lengths[where] = counts
            for i, ids in zip(where, np.split(tokens, np.cumsum(counts)[:-1])):
                pieces[i] = ids
        return np.concatenate(pieces).astype(np.int32), lengths, by_reference

    def _bound_memory(self) -> None:
        """Build the tokenizer afresh when this process has grown by MAX_CACHE_BYTES."""
        self.batches += 1
        if self.batches % CHECK_MEMORY_EVERY:
            return
        if _resident_bytes() - self.memory > MAX_CACHE_BYTES:
            self.backend = None
            self.backend = self.build()
            self.memory = _resident_bytes()

