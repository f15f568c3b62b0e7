"""Which texts hold only characters that a check admits, each distinct character checked once per
process: the test behind the encoders' routing (megatron_ext/preprocess/byte_level.py: characters
Python's ``regex`` and the tokenizers library class alike; gigatoken_encoder.py: characters
gigatoken classes as the reference library does, and none its normalizer would change).

The cost is linear in the text and independent of how many characters have been checked: ASCII
text (all of it checked at once) passes on ``str.isascii``; other text is searched by one compiled
class of the admitted characters of the Basic Multilingual Plane, which Python's ``re`` matches
through a bitmap; a text holding a character outside it (not admitted, not checked yet, or beyond
the BMP) is checked as the set of its characters. A regex class of arbitrary characters would be
matched item by item: the check then grows with the characters met, which made the byte-level
encoder quadratic on text with thousands of distinct characters (issue #51).
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

BMP = 0x10000
RECOMPILE_AFTER = 64  # newly admitted BMP characters before the class is compiled again


class CharacterCheck:
    """``admits(text)``: whether ``check(character)`` holds for every character of ``text``."""

    def __init__(self, check: Callable[[str], bool]):
        self.check = check
        self.admitted: set[str] = set()
        self.refused: set[str] = set()
        self._pending = 0  # admitted BMP characters not in the compiled class yet
        self.ascii = self._learn(map(chr, range(128)))
        self._outside = self._compile()

    def _learn(self, characters: Iterable[str]) -> bool:
        """Check characters not met before; whether all were admitted."""
        ok = True
        for character in characters:
            if self.check(character):
                self.admitted.add(character)
                self._pending += ord(character) < BMP
            else:
                self.refused.add(character)
                ok = False
        return ok

    def _compile(self) -> re.Pattern:
        self._pending = 0
        inside = "".join(re.escape(c) for c in sorted(self.admitted) if ord(c) < BMP)
        return re.compile(f"[^{inside}]" if inside else "(?s:.)")

    def admits(self, text: str) -> bool:
        if self.ascii and text.isascii():
            return True
        if self._outside.search(text) is None:
            return True
        characters = set(text)
        new = characters - self.admitted - self.refused
        if new:
            self._learn(sorted(new))
            if self._pending >= max(RECOMPILE_AFTER, len(self.admitted) // 8):
                self._outside = self._compile()
        return characters.isdisjoint(self.refused)
