"""Train a tokenizer from local files: sentencepiece BPE or unigram, or Hugging Face byte-level BPE.

With ``--output-prefix P`` it writes, for ``--model-type bpe``/``unigram``, ``P.model`` and
``P.vocab`` (use ``--tokenizer-type SentencePieceTokenizer --tokenizer-model P.model``), and for
``hf-bpe`` the folder ``P/`` with ``tokenizer.json`` and ``tokenizer_config.json``
(``--tokenizer-type HuggingFaceTokenizer --tokenizer-model P``); plus ``P.train.json``, the record
of what they were trained from. Both kinds are lossless (decoding the ids of a text gives the text
back): sentencepiece with identity normalization, whitespace kept and byte fallback, byte-level BPE
by construction. Their EOS token (``</s>``, ``<|endoftext|>``) serves as EOD.

Inputs are read as tools/preprocess_data.py reads them (megatron_ext/data/readers.py): JSONL
(``--json-keys``), Parquet, ``save_to_disk`` folders or plain text, optionally compressed;
sentencepiece trains on their lines.

Idempotent: when ``P.train.json`` records the same inputs (size, mtime) and options, nothing is
trained. Atomic: training happens in a temporary folder whose results are renamed into place,
the record last, so an interrupted run leaves the previous outputs or no record.

    python -m tools.train_tokenizer --input 'plays/**/*.md' --model-type bpe --vocab-size 4096 \\
        --output-prefix demo/tokenizer
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import tempfile
from typing import Iterator, Optional

import sentencepiece
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from megatron_ext.files import file_fingerprint, fsync_path, publish, read_json, write_json
from megatron_ext.data.readers import expand_inputs, iter_texts

MODEL_TYPES = ("bpe", "unigram", "hf-bpe")
HF_EOS = "<|endoftext|>"


@dataclasses.dataclass
class Trained:
    tokenizer_model: str  # what to pass as --tokenizer-model
    trained: bool  # False when the outputs were already up to date


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", nargs="+", required=True, metavar="FILE_OR_GLOB",
                        help="training files or glob patterns (quoted), as for preprocess_data")
    parser.add_argument("--json-keys", nargs="+", default=["text"],
                        help="JSON keys (table columns) to train on (default: text)")
    parser.add_argument("--model-type", choices=MODEL_TYPES, required=True,
                        help="sentencepiece bpe or unigram, or Hugging Face byte-level BPE")
    parser.add_argument("--vocab-size", type=int, required=True,
                        help="vocabulary size, special and byte tokens included")
    parser.add_argument("--output-prefix", required=True,
                        help="P: writes P.model/P.vocab (sentencepiece) or P/ (hf-bpe), "
                             "and P.train.json")
    return parser.parse_args(argv)


def _texts(paths: list[str], keys: list[str]) -> Iterator[str]:
    for texts in iter_texts(paths, "file", keys):
        for key in keys:
            yield from texts[key]


def _train_sentencepiece(args, paths: list[str], folder: str) -> dict[str, str]:
    input_errors = []

    def lines() -> Iterator[str]:
        try:
            for text in _texts(paths, args.json_keys):
                yield from (line for line in text.split("\n") if line.strip())
        except SystemExit as e:  # sentencepiece reports it as a failure of its own: keep it
            input_errors.append(e)
            raise

    name = os.path.join(folder, "sp")
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=lines(), model_prefix=name, model_type=args.model_type,
            vocab_size=args.vocab_size, normalization_rule_name="identity",
            remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, byte_fallback=True,
            split_digits=True, num_threads=os.cpu_count(), minloglevel=1)
    except RuntimeError as e:
        raise (input_errors[0] if input_errors
               else SystemExit(f"error: sentencepiece training failed: {e}")) from None
    return {f"{name}.model": f"{args.output_prefix}.model",
            f"{name}.vocab": f"{args.output_prefix}.vocab"}


def _train_hf_bpe(args, paths: list[str], folder: str) -> dict[str, str]:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, special_tokens=[HF_EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(_texts(paths, args.json_keys), trainer=trainer)
    if tokenizer.get_vocab_size() < args.vocab_size:
        raise SystemExit(f"error: --vocab-size {args.vocab_size}: the inputs yield only "
                         f"{tokenizer.get_vocab_size()} tokens; train on more text or ask for "
                         "fewer")
    hf_folder = os.path.join(folder, "hf")
    os.makedirs(hf_folder)
    tokenizer.save(os.path.join(hf_folder, "tokenizer.json"))
    fsync_path(os.path.join(hf_folder, "tokenizer.json"))
    write_json(os.path.join(hf_folder, "tokenizer_config.json"),
               {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": HF_EOS})
    return {hf_folder: args.output_prefix}


def main(argv: Optional[list[str]] = None) -> Trained:
    args = parse_args(argv)
    paths = expand_inputs(args.input)
    record_path = f"{args.output_prefix}.train.json"
    record = {"inputs": [[os.path.abspath(p), file_fingerprint(p)] for p in paths],
              "json_keys": args.json_keys, "model_type": args.model_type,
              "vocab_size": args.vocab_size}
    hf = args.model_type == "hf-bpe"
    tokenizer_model = args.output_prefix if hf else f"{args.output_prefix}.model"
    if os.path.exists(tokenizer_model) and os.path.exists(record_path) \
            and read_json(record_path) == record:
        print(f"{tokenizer_model} is up to date with its inputs")
        return Trained(tokenizer_model, trained=False)

    parent = os.path.dirname(os.path.abspath(args.output_prefix))
    os.makedirs(parent, exist_ok=True)
    folder = tempfile.mkdtemp(prefix=f".{os.path.basename(args.output_prefix)}.", dir=parent)
    try:
        outputs = (_train_hf_bpe if hf else _train_sentencepiece)(args, paths, folder)
        if os.path.exists(record_path):
            os.remove(record_path)  # the old outputs are about to be replaced
        for built, final in outputs.items():
            if os.path.isdir(final):
                shutil.rmtree(final)
            publish(built, final)
        write_json(record_path, record)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"trained {tokenizer_model} ({args.model_type}, vocabulary of {args.vocab_size})")
    return Trained(tokenizer_model, trained=True)


if __name__ == "__main__":
    main()
