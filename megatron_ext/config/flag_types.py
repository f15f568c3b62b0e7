"""argparse types shared by the command lines in tools/, and the tokenizer flags' own rules
(the flags themselves are declared in ``data_config.py``). Imports nothing heavy: the
preprocessing tool starts without torch.
"""

from __future__ import annotations

import argparse
from typing import Optional

from ..runtime.errors import FlagError

# --tokenizer-type's choices (megatron_ext/datasets/tokenizer.py builds each).
TOKENIZER_TYPES = ("GPTSentencePieceTokenizer", "SentencePieceTokenizer", "HuggingFaceTokenizer",
                   "GPT2BPETokenizer", "NullTokenizer")


def check_tokenizer_flags(tokenizer_type: str, tokenizer_model: Optional[str],
                          vocab_size: Optional[int], vocab_file: Optional[str],
                          merge_file: Optional[str]) -> None:
    """Refuse tokenizer flags that name no tokenizer, naming them (the files are read when
    the tokenizer is built: datasets/tokenizer.py)."""
    if tokenizer_type == "GPT2BPETokenizer":
        if not (vocab_file and merge_file):
            raise FlagError("--tokenizer-type GPT2BPETokenizer needs --vocab-file and "
                            "--merge-file")
        return
    if vocab_file or merge_file:  # else ignored: Megatron-LM's GPT-3 example gives no type
        raise FlagError(f"--vocab-file and --merge-file are GPT2BPETokenizer's, not "
                        f"--tokenizer-type {tokenizer_type}'s: give --tokenizer-type "
                        f"GPT2BPETokenizer")
    if tokenizer_type == "NullTokenizer":
        if not vocab_size or vocab_size < 1:
            raise FlagError("--tokenizer-type NullTokenizer needs --vocab-size >= 1 "
                            "(ids 0 to V - 1)")
        return
    if tokenizer_type not in TOKENIZER_TYPES:
        raise FlagError(f"unknown --tokenizer-type {tokenizer_type} (choose from "
                        f"{', '.join(TOKENIZER_TYPES)})")
    if not tokenizer_model:
        raise FlagError(f"--tokenizer-type {tokenizer_type} needs --tokenizer-model")


def positive_int(text: str) -> int:
    """An integer of at least 1 (argparse names the flag in its error)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    """An integer of at least 0 (argparse names the flag in its error)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value
