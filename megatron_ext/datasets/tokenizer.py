"""Tokenizers for training, preprocessing and conversion, selected by Megatron-LM's
``--tokenizer-type``, with the semantics of megatron.core's tokenizers (what Megatron-LM
core_v0.16 builds for training and ``tools/preprocess_data.py`` unless ``--legacy-tokenizer``):
same ids, EOD id and vocabulary size, so data preprocessed by either tool trains identically.

Each exposes what Megatron-Core's GPT datasets and our tools use: ``vocab_size``, ``eod``,
``tokenize(text) -> list[int]`` and ``detokenize(ids) -> str``.

* ``NullTokenizer``: ``--vocab-size V``: the text is the ids, separated by single spaces; the
  vocabulary and EOD are the installed megatron-core's: before 0.18.0 EOD is the extra id V
  (V + 1 ids), from 0.18.0 it is V - 1 (V ids; :mod:`megatron_ext.runtime.megatron_compat`).
* ``GPTSentencePieceTokenizer``, ``SentencePieceTokenizer`` (the same in megatron.core): a
  sentencepiece ``.model``; ids are sentencepiece's, EOD is its ``</s>`` piece, the vocabulary
  its pieces. No piece is added (Megatron-LM's ``--legacy-tokenizer`` SentencePieceTokenizer adds
  ``<CLS>``, ``<SEP>``, ``<EOD>``, ...: see docs/data.md).
* ``HuggingFaceTokenizer``: a local Hugging Face folder (or a lone ``tokenizer.json``); ids are
  those of ``tokenizer.json`` without added special tokens (the special tokens the folder's
  configs name are matched whole, and get new ids when not in it, as transformers does), EOD is
  the ``eos_token`` of ``tokenizer_config.json`` (else ``special_tokens_map.json``; else its
  ``sep_token``), the vocabulary includes added tokens. When they name none (Megatron-LM would
  have no EOD), EOD is the first of ``<|endoftext|>``, ``</s>``, ``<eos>``, ``<|end_of_text|>``
  it defines.

* ``GPT2BPETokenizer``: GPT-2's ``vocab.json`` and ``merges.txt`` (``--vocab-file``,
  ``--merge-file``), byte-level BPE as Megatron-LM's (its ``--legacy-tokenizer`` one, the one
  core_v0.16 builds from local files: megatron.core's needs the Hub); EOD is ``<|endoftext|>``,
  not matched in texts.

Loading imports only sentencepiece or tokenizers, not transformers (start-up of the data tools).
``unique_identifiers`` is what Megatron's dataset index caches are keyed by.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import List, Optional

from ..config.flag_types import check_tokenizer_flags
from ..runtime.errors import DataError
from ..runtime.megatron_compat import null_tokenizer_counts

SENTENCEPIECE_TYPES = ("GPTSentencePieceTokenizer", "SentencePieceTokenizer")


class NullTokenizer:
    def __init__(self, vocab_size: int):
        self.vocab_size, self.eod = null_tokenizer_counts(vocab_size)
        self.unique_identifiers = {"class": "NullTokenizer", "vocab_size": vocab_size}
        self.files = []  # what it is read from (tokenizer_digest)

    def tokenize(self, text: str) -> List[int]:
        return [int(x) for x in text.split(" ")]

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
            raise DataError(f"sentencepiece model {model_file} defines no </s> (EOD) piece")
        self.unique_identifiers = {"class": "SentencePieceTokenizer",
                                   "model": os.path.abspath(model_file)}
        self.files = [model_file]

    def tokenize(self, text: str) -> List[int]:
        return self.sp.encode(text)

    def detokenize(self, ids) -> str:
        return self.sp.decode([int(i) for i in ids])


EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")


SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")


def _special_tokens(folder: str) -> dict[str, str]:
    """The special tokens a tokenizer folder names (``{"eos_token": "</s>", ...}``), as
    transformers reads them: ``tokenizer_config.json`` first, then ``special_tokens_map.json``."""
    named = {}
    for config in ("special_tokens_map.json", "tokenizer_config.json"):
        path = os.path.join(folder, config)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                values = json.load(f)
            for name in SPECIAL_TOKEN_NAMES:
                value = values.get(name)
                value = value.get("content") if isinstance(value, dict) else value  # AddedToken
                if value:
                    named[name] = value
    return named


class HuggingFaceTokenizer:
    def __init__(self, path: str):
        from tokenizers import Tokenizer

        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise DataError(f"--tokenizer-model {path}: no tokenizer.json found")
        self.model_file = file
        self.tok = Tokenizer.from_file(file)
        special = _special_tokens(os.path.dirname(file))
        self.named = special  # {"eos_token": "</s>", ...}: what the folder names
        # As transformers does: the named special tokens are matched whole in texts, and those
        # not in the vocabulary get new ids.
        self.special_tokens = list(dict.fromkeys(special.values()))
        self.tok.add_special_tokens(self.special_tokens)
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        named = special.get("eos_token", special.get("sep_token"))
        if named is not None:
            eod = self.tok.token_to_id(named)
        else:
            eod = next((self.tok.token_to_id(t) for t in EOD_CANDIDATES
                        if self.tok.token_to_id(t) is not None), None)
            if eod is None:
                raise DataError(f"tokenizer {file} names no eos_token and defines none "
                                f"of {EOD_CANDIDATES} (EOD)")
        self.eod = eod
        self.unique_identifiers = {"class": "HuggingFaceTokenizer", "model": os.path.abspath(file)}
        self.files = [file] + [os.path.join(os.path.dirname(file), config)
                               for config in ("special_tokens_map.json", "tokenizer_config.json")
                               if os.path.isfile(os.path.join(os.path.dirname(file), config))]

    def tokenize(self, text: str) -> List[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def detokenize(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)


class GPT2BPETokenizer:
    """GPT-2's byte-level BPE from ``--vocab-file`` (vocab.json) and ``--merge-file``
    (merges.txt), as Megatron-LM's GPT2BPETokenizer: GPT-2's pre-tokenization, no special
    token matched in texts, EOD ``<|endoftext|>``, the vocabulary ``vocab.json``'s."""

    def __init__(self, vocab_file: str, merge_file: str):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        for flag, path in (("--vocab-file", vocab_file), ("--merge-file", merge_file)):
            if not os.path.isfile(path):
                raise DataError(f"{flag} {path} does not exist")
        try:
            self.tok = Tokenizer(models.BPE.from_file(vocab_file, merge_file))
        except Exception as e:  # noqa: BLE001 - tokenizers raises its own Exception
            raise DataError(f"--vocab-file {vocab_file} / --merge-file {merge_file}: not a "
                            f"GPT-2 BPE pair ({e})") from None
        self.tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        self.tok.decoder = decoders.ByteLevel()
        self.vocab_size = self.tok.get_vocab_size()
        self.eod = self.tok.token_to_id("<|endoftext|>")
        if self.eod is None:
            raise DataError(f"--vocab-file {vocab_file} has no <|endoftext|> (EOD)")
        self.unique_identifiers = {"class": "GPT2BPETokenizer",
                                   "vocab": os.path.abspath(vocab_file),
                                   "merges": os.path.abspath(merge_file)}
        self.files = [vocab_file, merge_file]

    def tokenize(self, text: str) -> List[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def detokenize(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)


def build_tokenizer(tokenizer_type: str, tokenizer_model: Optional[str] = None,
                    vocab_size: Optional[int] = None, vocab_file: Optional[str] = None,
                    merge_file: Optional[str] = None):
    """The tokenizer named by ``--tokenizer-type`` (and ``--tokenizer-model``/``--vocab-size``,
    or ``--vocab-file``/``--merge-file``), its flags refused first as a run's are
    (:func:`~megatron_ext.config.flag_types.check_tokenizer_flags`)."""
    check_tokenizer_flags(tokenizer_type, tokenizer_model, vocab_size, vocab_file, merge_file)
    if tokenizer_type == "GPT2BPETokenizer":
        return GPT2BPETokenizer(vocab_file, merge_file)
    if tokenizer_type == "NullTokenizer":
        return NullTokenizer(vocab_size)
    if not os.path.exists(tokenizer_model):
        raise DataError(f"--tokenizer-model {tokenizer_model} does not exist")
    if tokenizer_type in SENTENCEPIECE_TYPES:
        return SentencePieceTokenizer(tokenizer_model)
    return HuggingFaceTokenizer(tokenizer_model)


def tokenizer_from_args(flags, tokenizer_model: Optional[str] = None):
    """The tokenizer that tokenizer flags name (a run's ``DataConfig``, a tool's parsed flags
    or a checkpoint's saved args; ``tokenizer_model`` instead of its ``--tokenizer-model`` if
    given): each of ``--tokenizer-model``, ``--vocab-size``, ``--vocab-file``,
    ``--merge-file`` it has."""
    return build_tokenizer(flags.tokenizer_type, tokenizer_model or flags.tokenizer_model,
                           getattr(flags, "vocab_size", None), getattr(flags, "vocab_file", None),
                           getattr(flags, "merge_file", None))


def tokenizer_digest(tokenizer) -> Optional[str]:
    """The sha256 of the files a tokenizer was read from (``files``, in order; None for
    ``NullTokenizer``): recorded with a run's checkpoints, so that what reads them later (the
    export, the probes) knows the training tokenizer by its content, not by a path whose file
    may have been replaced."""
    if not tokenizer.files:
        return None
    digest = hashlib.sha256()
    for path in tokenizer.files:
        with open(path, "rb") as f:
            digest.update(os.path.basename(path).encode() + b"\0" + f.read())
    return digest.hexdigest()


def check_training_tokenizer(tokenizer, recorded: Optional[str], what: str) -> None:
    """Refuse ``tokenizer`` for a checkpoint (``what``) whose run recorded another tokenizer
    digest (None: a checkpoint from before the digest, not checked)."""
    digest = tokenizer_digest(tokenizer)
    if recorded and digest != recorded:
        raise DataError(f"{what}: the tokenizer read from {', '.join(tokenizer.files)} is not "
                        f"the one its run trained with (sha256 {digest[:12] if digest else None}"
                        f"..., the run's {recorded[:12]}...): a file replaced since, or another "
                        f"tokenizer; pass the training tokenizer (--tokenizer-model)")

