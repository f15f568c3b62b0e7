"""argparse types shared by the command lines in tools/. Imports nothing heavy: the
preprocessing tool starts without torch.
"""

from __future__ import annotations

import argparse

# --tokenizer-type's choices (megatron_ext/datasets/tokenizer.py builds each).
TOKENIZER_TYPES = ("GPTSentencePieceTokenizer", "SentencePieceTokenizer", "HuggingFaceTokenizer",
                   "NullTokenizer")
# Training also reads GPT-2 BPE files (--vocab-file, --merge-file), for data that
# Megatron-LM's tools/preprocess_data.py tokenized with them.
TRAINING_TOKENIZER_TYPES = TOKENIZER_TYPES + ("GPT2BPETokenizer",)


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
