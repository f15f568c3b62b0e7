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
