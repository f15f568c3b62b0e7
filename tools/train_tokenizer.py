"""Train a tokenizer from local files: sentencepiece BPE or unigram, or Hugging Face byte-level BPE.

With ``--output-prefix P`` it writes, for ``--model-type bpe``/``unigram``, ``P.model`` and
``P.vocab`` (use ``--tokenizer-type SentencePieceTokenizer --tokenizer-model P.model``), and for
``hf-bpe`` the folder ``P/`` with ``tokenizer.json`` and ``tokenizer_config.json``
(``--tokenizer-type HuggingFaceTokenizer --tokenizer-model P``); plus ``P.train.json``, the record
of what they were trained from. Both kinds are lossless (decoding the ids of a text gives the text
back): sentencepiece with identity normalization, whitespace kept and byte fallback, byte-level BPE
by construction. Their EOS token (``</s>``, ``<|endoftext|>``) serves as EOD.

Inputs are read as tools/preprocess_data.py reads them
(megatron_ext/preprocess/tokenizer_training.py trains, megatron_ext/preprocess/readers.py reads):
JSONL (``--json-keys``), Parquet, ``save_to_disk`` folders or plain text, optionally compressed;
sentencepiece trains on their lines.

Idempotent: when ``P.train.json`` records the same inputs (size, mtime) and options, nothing is
trained. Atomic: training happens in a temporary folder whose results are renamed into place,
the record last, so an interrupted run leaves the previous outputs or no record.

    python -m tools.train_tokenizer --input 'plays/**/*.md' --model-type bpe --vocab-size 4096 \\
        --output-prefix demo/tokenizer
"""

from __future__ import annotations

import argparse
from typing import Optional

from megatron_ext.preprocess.tokenizer_training import (MODEL_TYPES, Options, Trained,
                                                        train_tokenizer)
from megatron_ext.runtime.errors import exits_on_error


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


def main(argv: Optional[list[str]] = None) -> Trained:
    with exits_on_error():
        args = parse_args(argv)
        trained = train_tokenizer(Options(tuple(args.input), tuple(args.json_keys), args.model_type,
                                          args.vocab_size, args.output_prefix))
        if trained.trained:
            print(f"trained {trained.tokenizer_model} ({args.model_type}, vocabulary of "
                  f"{args.vocab_size})")
        else:
            print(f"{trained.tokenizer_model} is up to date with its inputs")
        return trained


if __name__ == "__main__":
    main()
