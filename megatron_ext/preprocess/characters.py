"""Which texts hold only characters that a check admits, each distinct character checked once per
process: the test behind the encoders' routing (megatron_ext/preprocess/byte_level.py: characters
Python's ``regex`` and the tokenizers library class alike; gigatoken_encoder.py: characters
gigatoken classes as the reference library does, and none its normalizer would change).

The cost is linear in the text and independent of how many characters have been checked: ASCII
text (all of it checked at once) passes on ``str.isascii``; other text is searched by one compiled
class of the admitted characters of the Basic Multilingual Plane, which Python's ``re`` matches
through a bitmap (given the text's UTF-8, which the encoder hands gigatoken anyway, only its
characters beyond ASCII are searched: issue #56, the search of whole texts cost more than a third
of gigatoken's encode on multilingual web text); a text holding a character outside it (not
admitted, not checked yet, or beyond the BMP, unless a table admitted it: those are few runs of
code points) is checked as the set of its characters. A regex class of arbitrary characters
would be matched item by item: the check then grows with the characters met, which made the
byte-level encoder quadratic on text with thousands of distinct characters (issue #51).

A check can start from a table (:func:`table`: of :data:`TABLE_CHARACTERS`, every character of
the BMP but the surrogates and the emoji blocks, those admitted), computed once per tokenizer
and library versions by the main process (megatron_ext/preprocess/character_table.py) and handed
to every worker, which then learns only the rare characters beyond it (issue #56: learning
them per worker cost more than gigatoken's encode on multilingual text).
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Optional

BMP = 0x10000
_ASCII = bytes(range(128))
RECOMPILE_AFTER = 64  # newly admitted BMP characters before the class is compiled again
TABLE_CHARACTERS = "".join(chr(c) for c in [*range(0xD800), *range(0xE000, BMP),
                                            *range(0x1F000, 0x1FB00)])


def table(check: Callable[[str], bool]) -> tuple[str, str]:
    """The characters checked (:data:`TABLE_CHARACTERS`) and those ``check`` admits."""
    return TABLE_CHARACTERS, "".join(c for c in TABLE_CHARACTERS if check(c))


def _ranges(characters: list[str]) -> str:
    """A regex class's inside holding the sorted ``characters``, consecutive ones as a range."""
    runs = []
    for character in characters:
        if runs and ord(character) == ord(runs[-1][1]) + 1:
            runs[-1][1] = character
        else:
            runs.append([character, character])
    return "".join(re.escape(a) if a == b else f"{re.escape(a)}-{re.escape(b)}" for a, b in runs)


class CharacterCheck:
    """``admits(text)``: whether ``check(character)`` holds for every character of ``text``."""

    def __init__(self, check: Callable[[str], bool],
                 known: Optional[tuple[str, str]] = None):
        """``known``: the :func:`table` of ``check``, if computed (its characters are not
        checked again)."""
        self.check = check
        checked, admitted = known or ("", "")
        self.admitted: set[str] = set(admitted)
        # beyond the BMP, the table's admitted characters (runs of code points: few items)
        self._beyond = [c for c in admitted if ord(c) >= BMP]
        self.refused: set[str] = set(checked) - self.admitted
        self._pending = 0  # admitted BMP characters not in the compiled class yet
        self.ascii = self._learn(set(map(chr, range(128))) - self.admitted - self.refused) \
            and self.refused.isdisjoint(map(chr, range(128)))
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
        inside = _ranges(sorted([c for c in self.admitted if ord(c) < BMP] + self._beyond))
        return re.compile(f"[^{inside}]" if inside else "(?s:.)")

    def admits(self, text: str, utf8: Optional[bytes] = None) -> bool:
        """``utf8``: the text's UTF-8, if at hand; where every ASCII character is admitted, only
        the others are then searched (its bytes but the ASCII ones: no ASCII byte is part of a
        longer character), a few percent of web text's characters."""
        if self.ascii:
            if text.isascii():
                return True
            if utf8 is not None:
                text = utf8.translate(None, _ASCII).decode("utf-8")
        if self._outside.search(text) is None:
            return True
        characters = set(text)
        new = characters - self.admitted - self.refused
        if new:
            self._learn(sorted(new))
            if self._pending >= max(RECOMPILE_AFTER, len(self.admitted) // 8):
                self._outside = self._compile()
        return characters.isdisjoint(self.refused)
