"""Tokenizers for training and preprocessing, selected by Megatron-LM's ``--tokenizer-type``.

Each exposes what Megatron-Core's GPT datasets and our tools use: ``vocab_size``, ``eod``,
``tokenize(text) -> list[int]`` and ``detokenize(ids) -> str``.

* ``NullTokenizer``: ids are given (``--vocab-size``); the last id is the end-of-document.
* ``SentencePieceTokenizer``: a sentencepiece ``.model``; EOD is its ``</s>`` piece.
* ``HuggingFaceTokenizer``: a ``tokenizer.json`` or a local Hugging Face folder holding one;
  EOD is the first of ``<|endoftext|>``, ``</s>``, ``<eos>`` it defines.

``unique_identifiers`` is what Megatron's dataset index caches are keyed by.
"""

from __future__ import annotations

import os
from typing import List, Optional


class NullTokenizer:
    def __init__(self, vocab_size: int):
        if not vocab_size or vocab_size < 2:
            raise SystemExit("error: NullTokenizer needs --vocab-size >= 2")
        self.vocab_size = vocab_size
        self.eod = vocab_size - 1
        self.unique_identifiers = {"class": "NullTokenizer", "vocab_size": vocab_size}

    def tokenize(self, text: str) -> List[int]:
        return [int(x) for x in text.split()]

    def detokenize(self, ids) -> str:
        return " ".join(str(int(i)) for i in ids)


class SentencePieceTokenizer:
    def __init__(self, model_file: str):
        import sentencepiece

        self.model_file = model_file
        self.sp = sentencepiece.SentencePieceProcessor(model_file=model_file)
        self.vocab_size = self.sp.get_piece_size()
        self.eod = self.sp.eos_id()
        if self.eod < 0:
            raise SystemExit(f"error: sentencepiece model {model_file} defines no </s> (EOD) piece")
        self.unique_identifiers = {"class": "SentencePieceTokenizer",
                                   "model": os.path.abspath(model_file)}

    def tokenize(self, text: str) -> List[int]:
        return self.sp.encode(text)

    def detokenize(self, ids) -> str:
        return self.sp.decode([int(i) for i in ids])


EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")


class HuggingFaceTokenizer:
    def __init__(self, path: str):
        from tokenizers import Tokenizer

        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise SystemExit(f"error: --tokenizer-model {path}: no tokenizer.json found")
        self.model_file = file
        self.tok = Tokenizer.from_file(file)
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        eod = next((self.tok.token_to_id(t) for t in EOD_CANDIDATES
                    if self.tok.token_to_id(t) is not None), None)
        if eod is None:
            raise SystemExit(f"error: tokenizer {file} defines none of {EOD_CANDIDATES} (EOD)")
        self.eod = eod
        self.unique_identifiers = {"class": "HuggingFaceTokenizer", "model": os.path.abspath(file)}

    def tokenize(self, text: str) -> List[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def detokenize(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)


def build_tokenizer(tokenizer_type: str, tokenizer_model: Optional[str] = None,
                    vocab_size: Optional[int] = None):
    """The tokenizer named by ``--tokenizer-type`` (and ``--tokenizer-model``/``--vocab-size``)."""
    if tokenizer_type == "NullTokenizer":
        return NullTokenizer(vocab_size)
    if not tokenizer_model:
        raise SystemExit(f"error: --tokenizer-type {tokenizer_type} needs --tokenizer-model")
    if not os.path.exists(tokenizer_model):
        raise SystemExit(f"error: --tokenizer-model {tokenizer_model} does not exist")
    if tokenizer_type == "SentencePieceTokenizer":
        return SentencePieceTokenizer(tokenizer_model)
    if tokenizer_type == "HuggingFaceTokenizer":
        return HuggingFaceTokenizer(tokenizer_model)
    raise SystemExit(f"error: unknown --tokenizer-type {tokenizer_type}")
