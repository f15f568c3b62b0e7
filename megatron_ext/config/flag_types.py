"""argparse types shared by the command lines in tools/. Imports nothing heavy: the
preprocessing tool starts without torch.
"""

from __future__ import annotations

import argparse

# --tokenizer-type's choices (megatron_ext/datasets/tokenizer.py builds each).
TOKENIZER_TYPES = ("GPTSentencePieceTokenizer", "SentencePieceTokenizer", "HuggingFaceTokenizer",
                   "GPT2BPETokenizer", "NullTokenizer")


def add_tokenizer_flags(group, **tokenizer_type) -> None:
    """The flags naming a tokenizer, as Megatron-LM's (``--vocab-size`` is each tool's own):
    ``tokenizer_type`` are ``--tokenizer-type``'s ``default`` or ``required``."""
    group.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES, **tokenizer_type,
                       help="as in Megatron-LM (megatron_ext/datasets/tokenizer.py)"
                            + (f"; default: {tokenizer_type['default']}"
                               if tokenizer_type.get("default") else ""))
    group.add_argument("--tokenizer-model",
                       help="sentencepiece .model, tokenizer.json or Hugging Face folder")
    group.add_argument("--vocab-file",
                       help="GPT2BPETokenizer: the vocabulary (GPT-2's vocab.json)")
    group.add_argument("--merge-file",
                       help="GPT2BPETokenizer: the BPE merges (GPT-2's merges.txt)")


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
