"""Tokenize corpora into Megatron indexed datasets: ``{output_prefix}_{key}_document.bin/.idx``.

For the same input, tokenizer and flags, the token stream and document boundaries are those of
Megatron-LM's ``tools/preprocess_data.py`` (flags are named as there), and so are the bytes
written: those of megatron.core's ``IndexedDatasetBuilder`` with the dtype Megatron-LM picks
(``DType.optimal_dtype`` of the vocabulary size), though neither megatron.core nor torch is
imported (start-up well under a second: megatron_ext/datasets/indexed.py). Unlike it, this
streams its inputs in memory that does not grow with their size, stops at bad input naming
file and line (or counts and skips it: ``--skip-bad-lines``), never leaves a partial dataset
under the final names, and resumes an interrupted job (``--resume``) from its last complete
part (the job: megatron_ext/preprocess/preprocess.py; its parts: megatron_ext/preprocess/parts.py).
Inputs (JSONL, text, Parquet, ``datasets.save_to_disk`` folders): see
megatron_ext/preprocess/readers.py. The tokenizer is the one training builds
(megatron_ext/datasets/tokenizer.py), so EOD and vocabulary size agree with training.

    python -m tools.preprocess_data --input 'corpus/*.jsonl.zst' --output-prefix data/corpus \\
        --tokenizer-type SentencePieceTokenizer --tokenizer-model tok.model --append-eod --workers 8
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from megatron_ext.preprocess.preprocess import ENCODERS, Summary, preprocess
from megatron_ext.preprocess.readers import TEXT_DOCUMENT_MODES
from megatron_ext.config.data_config import add_tokenizer_flags
from megatron_ext.config.flag_fields import add_flags
from megatron_ext.config.model_config import ModelConfig
from megatron_ext.config.flag_types import positive_int
from megatron_ext.runtime.errors import exits_on_error


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_argument_group("input data")
    group.add_argument("--input", nargs="+", required=True, metavar="FILE_OR_GLOB",
                       help="input files, folders or glob patterns (quoted): *.jsonl/*.json are "
                            "JSONL, *.parquet Parquet, anything else plain text (each may end in "
                            ".gz or .zst); a folder is a datasets.save_to_disk folder or else "
                            "every *.parquet under it (a Hugging Face dataset)")
    group.add_argument("--json-keys", nargs="+", default=["text"],
                       help="JSON keys (Parquet/Arrow columns) to extract, one dataset each "
                            "(default: text)")
    group.add_argument("--text-document", choices=TEXT_DOCUMENT_MODES, default="file",
                       help="plain-text inputs: one document per file (default), or per "
                            "non-blank line")
    group.add_argument("--skip-bad-lines", action="store_true",
                       help="count and skip malformed JSON, missing keys, invalid UTF-8 and empty "
                            "documents instead of stopping at the first")
    group = parser.add_argument_group("tokenizer")
    add_tokenizer_flags(group, required=True)
    group.add_argument("--vocab-size", type=int,
                       help="NullTokenizer: ids 0 .. V-1 (the text is ids separated by spaces), "
                            "EOD V")
    group.add_argument("--append-eod", action="store_true",
                       help="append the tokenizer's EOD token to the end of each document")
    group = parser.add_argument_group("output data")
    group.add_argument("--output-prefix", required=True,
                       help="path of the outputs without the _{key}_document.bin/.idx suffix")
    add_flags(group, ModelConfig, only=("code_bits",), helps={
        "code_bits": "warn when token ids do not fit a fixed code of this many bits "
                     "(default: %(default)s)"})
    group = parser.add_argument_group("runtime")
    group.add_argument("--workers", type=positive_int, default=1,
                       help="tokenizer processes, one thread each (default: 1)")
    group.add_argument("--encoder", choices=ENCODERS, default="auto",
                       help="auto (default): gigatoken for every text where it gives the "
                            "reference library's ids (decided before encoding: special-token "
                            "text, characters the libraries class differently, text the "
                            "sentencepiece normalizer changes go to the reference), the "
                            "reference encoder for the rest and for tokenizers gigatoken cannot "
                            "load; gigatoken: the same, but an error if gigatoken cannot load "
                            "the tokenizer; reference: the reference encoder only")
    group.add_argument("--verify-fraction", type=float, default=0.001, metavar="F",
                       help="share of the documents gigatoken encodes that the reference encodes "
                            "again, the same documents in every run (chosen by file and line); "
                            "a difference stops the run naming file and line (default: 0.001)")
    group.add_argument("--resume", action="store_true",
                       help="continue the interrupted job with this --output-prefix, keeping its "
                            "complete parts")
    group.add_argument("--part-tokens", type=positive_int, default=100_000_000,
                       help="tokens per part, the work an interruption can lose "
                            "(default: 100M)")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> Summary:
    with exits_on_error():
        summary = preprocess(parse_args(argv))
        print(summary.report())
        if summary.code_warning:
            print(f"WARNING: a fixed code would not fit this tokenizer: {summary.code_warning}",
                  file=sys.stderr)
        return summary


if __name__ == "__main__":
    main()
