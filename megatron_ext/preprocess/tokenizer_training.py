"""Training a tokenizer from local files: sentencepiece BPE or unigram, or Hugging Face
byte-level BPE (tools/train_tokenizer.py is its command line, which describes the outputs).

Both kinds are lossless: sentencepiece with identity normalization, whitespace kept and byte
fallback, byte-level BPE by construction. Inputs are read as the preprocessing reads them
(:mod:`.readers`). Idempotent (a record ``P.train.json`` of the inputs and options) and
atomic (trained in a temporary folder, renamed into place, the record last).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Iterator

import sentencepiece
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ..runtime.errors import DataError, FixedcodeError
from ..runtime.files import file_fingerprint, fsync_path, publish, read_json, write_json

from .readers import expand_inputs, iter_texts

MODEL_TYPES = ("bpe", "unigram", "hf-bpe")
HF_EOS = "<|endoftext|>"


@dataclasses.dataclass
class Trained:
    tokenizer_model: str  # what to pass as --tokenizer-model
    trained: bool  # False when the outputs were already up to date


@dataclasses.dataclass(frozen=True)
class Options:
    """What to train: the tool's flags."""
    inputs: tuple  # files or glob patterns
    json_keys: tuple
    model_type: str  # one of MODEL_TYPES
    vocab_size: int
    output_prefix: str


def _texts(paths: list[str], keys: list[str]) -> Iterator[str]:
    for texts in iter_texts(paths, "file", list(keys)):
        for key in keys:
            yield from texts[key]


def _train_sentencepiece(options: Options, paths: list[str], folder: str) -> dict[str, str]:
    input_errors = []

    def lines() -> Iterator[str]:
        try:
            for text in _texts(paths, options.json_keys):
                yield from (line for line in text.split("\n") if line.strip())
        except FixedcodeError as e:  # sentencepiece reports it as a failure of its own: keep it
            input_errors.append(e)
            raise

    name = os.path.join(folder, "sp")
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=lines(), model_prefix=name, model_type=options.model_type,
            vocab_size=options.vocab_size, normalization_rule_name="identity",
            remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, byte_fallback=True,
            split_digits=True, num_threads=os.cpu_count(), minloglevel=1)
    except RuntimeError as e:
        raise (input_errors[0] if input_errors
               else DataError(f"sentencepiece training failed: {e}")) from None
    return {f"{name}.model": f"{options.output_prefix}.model",
            f"{name}.vocab": f"{options.output_prefix}.vocab"}


def _train_hf_bpe(options: Options, paths: list[str], folder: str) -> dict[str, str]:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=options.vocab_size, special_tokens=[HF_EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(_texts(paths, options.json_keys), trainer=trainer)
    if tokenizer.get_vocab_size() < options.vocab_size:
        raise DataError(f"--vocab-size {options.vocab_size}: the inputs yield only "
                        f"{tokenizer.get_vocab_size()} tokens; train on more text or ask for "
                        "fewer")
    hf_folder = os.path.join(folder, "hf")
    os.makedirs(hf_folder)
    tokenizer.save(os.path.join(hf_folder, "tokenizer.json"))
    fsync_path(os.path.join(hf_folder, "tokenizer.json"))
    write_json(os.path.join(hf_folder, "tokenizer_config.json"),
               {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": HF_EOS})
    return {hf_folder: options.output_prefix}


def train_tokenizer(options: Options) -> Trained:
    """Train the tokenizer ``options`` describe unless its record says it is up to date."""
    paths = expand_inputs(list(options.inputs))
    record_path = f"{options.output_prefix}.train.json"
    record = {"inputs": [[os.path.abspath(p), file_fingerprint(p)] for p in paths],
              "json_keys": list(options.json_keys), "model_type": options.model_type,
              "vocab_size": options.vocab_size}
    hf = options.model_type == "hf-bpe"
    tokenizer_model = options.output_prefix if hf else f"{options.output_prefix}.model"
    if os.path.exists(tokenizer_model) and os.path.exists(record_path) \
            and read_json(record_path) == record:
        return Trained(tokenizer_model, trained=False)

    parent = os.path.dirname(os.path.abspath(options.output_prefix))
    os.makedirs(parent, exist_ok=True)
    folder = tempfile.mkdtemp(prefix=f".{os.path.basename(options.output_prefix)}.", dir=parent)
    try:
        outputs = (_train_hf_bpe if hf else _train_sentencepiece)(options, paths, folder)
        if os.path.exists(record_path):
            os.remove(record_path)  # the old outputs are about to be replaced
        for built, final in outputs.items():
            if os.path.isdir(final):
                shutil.rmtree(final)
            publish(built, final)
        write_json(record_path, record)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return Trained(tokenizer_model, trained=True)
