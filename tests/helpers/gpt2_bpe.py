"""A tiny GPT-2 BPE vocabulary/merges pair, for the tests of ``--tokenizer-type
GPT2BPETokenizer``."""

from __future__ import annotations

import json
from pathlib import Path


def gpt2_bpe_files(folder: Path) -> tuple[Path, Path]:
    """``(vocab.json, merges.txt)`` in ``folder``: the 256 byte symbols, a few merges,
    ``<|endoftext|>`` last (264 tokens)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    symbols = list(bytes_to_unicode().values())
    merges = [("t", "h"), ("th", "e"), ("Ġ", "the"), ("i", "n"), ("Ġ", "c"), ("Ġc", "a"),
              ("Ġca", "t")]
    vocab = {s: i for i, s in enumerate(symbols + ["".join(m) for m in merges]
                                        + ["<|endoftext|>"])}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n"
                                                                   for a, b in merges))
    return folder / "vocab.json", folder / "merges.txt"


class ReferenceGPT2BPE:
    """GPT-2's BPE as Megatron-LM's ``--legacy-tokenizer`` GPT2BPETokenizer encodes it (OpenAI's
    algorithm, in plain Python: GPT-2's regex pre-tokenization, bytes mapped to symbols, then the
    merges applied in rank order; ``merges.txt``'s first line is its version), independent of the
    ``tokenizers`` library ours uses."""

    PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

    def __init__(self, vocab_file, merge_file):
        import regex
        from transformers.convert_slow_tokenizer import bytes_to_unicode
        self.vocab = json.loads(Path(vocab_file).read_text(encoding="utf-8"))
        merges = Path(merge_file).read_text(encoding="utf-8").split("\n")[1:-1]
        self.ranks = {tuple(line.split()): rank for rank, line in enumerate(merges)}
        self.symbols = bytes_to_unicode()
        self.pattern = regex.compile(self.PATTERN)
        self.vocab_size, self.eod = len(self.vocab), self.vocab["<|endoftext|>"]

    def _bpe(self, word: tuple) -> tuple:
        while len(word) > 1:
            pairs = set(zip(word, word[1:]))
            first, second = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if (first, second) not in self.ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == (first, second):
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = tuple(merged)
        return word

    def tokenize(self, text: str) -> list[int]:
        return [self.vocab[symbol] for piece in self.pattern.findall(text)
                for symbol in self._bpe(tuple(self.symbols[b] for b in piece.encode("utf-8")))]
