"""Texts built to break tokenizers, for the differential tests of the preprocessing encoders
(megatron_ext/preprocess/gigatoken_route.py against the reference libraries).

Every Unicode general category (a sample of each, by Python's ``regex`` tables, Unicode 17),
characters assigned after this Python's ``unicodedata`` tables (Unicode 14 or 15: the newest
ones, where libraries' tables differ), combining marks, right-to-left text, CJK, emoji
sequences, whitespace runs (NBSP, U+2028, tabs, CR LF), digit runs of several scripts,
NFKC-sensitive text (half-width kana, ligatures, full-width letters), special-token text
inside documents, long documents without spaces (``long_chars`` characters, 100 KB in the
issue, shorter here to keep the unit tier fast: the same code path), and empty-looking
documents. Deterministic for a seed.
"""

from __future__ import annotations

import functools
import random
import unicodedata

import regex

CATEGORIES = ("Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd",
              "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc",
              "Cf", "Co")  # Cs (surrogates) and Cn (unassigned) cannot be UTF-8 text
SPECIAL_TEXT = ["<s>", "</s>", "<unk>", "<pad>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
                "<repo_name>", "<0x41>", "<mask>", "<EOD>", "<|endoftext|", "<|im"]
PLAIN = ("The quick brown fox jumps over the lazy dog. Don't stop; it's 12 o'clock, we've "
         "3.14 reasons. ")
SCRIPTS = ["مرحبا بالعالم، هذا نص عربي ١٢٣٤", "שלום עולם, זה טקסט בעברית",
           "漢字かな交じり文。東京タワーは333メートル。", "中文文本没有空格分词测试一二三",
           "한국어 텍스트 테스트입니다", "Ελληνικά κείμενα", "Русский текст, ёлка",
           "हिन्दी पाठ का परीक्षण", "ไทยไม่มีช่องว่าง", "Ａｂｃ ｆｕｌｌ ｗｉｄｔｈ １２３",
           "ｶﾞｷﾞｸﾞ ﾊﾟﾋﾟ ｱｲｳｴｵ", "ﬁﬂ ligature ① ½ ² ™ Ⅻ", "e\u0301 a\u0308 n\u0303 \u1e9b\u0323",
           "👩\u200d👩\u200d👧\u200d👦 🇫🇷🇯🇵 👍🏽 ❤️ 🏳️\u200d🌈 🎭"]
WHITESPACE = ["\u00a0", "\u2028", "\u2029", "\t", "\r\n", "\n\n\n", "   ", "\u3000", "\u2003",
              "\u0085", "\x0b", "\x0c", "\u200b", "\ufeff", " \t \u00a0 "]
DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "１２３", "12345678901234567890",
          "3.14159", "1,000,000", "Ⅻ", "⑳"]
EMPTY_LOOKING = [" ", "\n", "\t", "\u200b", "\ufeff", "\u00a0", "\u2028", "  \n  "]


def recently_assigned() -> list[str]:
    """The characters Python's ``regex`` knows as assigned (Unicode 17) and this Python's
    ``unicodedata`` does not."""
    return _characters()[1]


@functools.lru_cache(maxsize=1)
def _characters() -> tuple[dict[str, list[str]], list[str]]:
    """Every character by this Python's general category, and the recently assigned ones:
    those ``regex`` knows as assigned (Unicode 17) and this Python's ``unicodedata`` (Unicode
    14 or 15) does not, which libraries with older tables class differently."""
    everything = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    by_category: dict[str, list[str]] = {}
    for character in everything:
        by_category.setdefault(unicodedata.category(character), []).append(character)
    unassigned = "".join(by_category["Cn"])
    return by_category, regex.findall(r"\P{Cn}", unassigned)


def breaker_texts(seed: int = 0, count: int = 400, long_chars: int = 4000) -> list[str]:
    """``count`` random mixtures of the pieces above, then the pieces alone, the long
    documents without spaces and the empty-looking ones."""
    rng = random.Random(seed)
    by_category, recent = _characters()
    categories = {category: rng.sample(by_category[category], min(24, len(by_category[category])))
                  for category in CATEGORIES}
    pieces = (SCRIPTS + WHITESPACE + DIGITS + SPECIAL_TEXT + [PLAIN]
              + ["".join(chars) for chars in categories.values()]
              + ["".join(rng.sample(recent, 12)) for _ in range(8)])
    singles = [c for chars in categories.values() for c in chars] + rng.sample(recent, 200)
    words = ["word", "don't", "x", "a", "Z", "'s", "'ll", " ", "  ", "-", ".", "12", "é"]
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 12)):
            kind = rng.random()
            if kind < 0.3:
                parts.append(rng.choice(pieces))
            elif kind < 0.6:
                parts.append(rng.choice(singles))
            else:
                parts.append(rng.choice(words))
        texts.append("".join(parts))
    # Long words: one script's letters, digits, or a mix, never a space.
    alphabets = ["abcdefghijklmnopqrstuvwxyz", "漢字中文测试東京", "0123456789",
                 "".join(categories["Lo"][:8]) + "a1.-_"]
    long_texts = ["".join(rng.choice(alphabet) for _ in range(long_chars))
                  for alphabet in alphabets]
    long_texts.append(PLAIN[:40] + "x" * long_chars + PLAIN[:40])
    # Recent characters beside contractions, letters, digits and punctuation: where a library
    # that classes one as a letter cuts other words than one that does not (X's: X + 's, or X'
    # + s).
    neighbours = ["{x}'s", "{x}'ll", "a{x}b", "1{x}2", ".{x}.", " {x} ", "{x}{x}'d"]
    beside = [rng.choice(neighbours).replace("{x}", x) for x in rng.sample(recent, 60)]
    return texts + pieces + beside + long_texts + EMPTY_LOOKING
