"""Tokenize corpora into Megatron indexed datasets: ``{output_prefix}_{key}_document.bin/.idx``.

For the same input, tokenizer and flags, the token stream and document boundaries are those of
Megatron-LM's ``tools/preprocess_data.py`` (flags are named as there), and so are the bytes
written: those of megatron.core's ``IndexedDatasetBuilder`` with the dtype Megatron-LM picks
(``DType.optimal_dtype`` of the vocabulary size), though neither megatron.core nor torch is
imported (start-up well under a second: megatron_ext/datasets/indexed.py). Unlike it, this
streams its inputs in memory that does not grow with their size, stops at bad input naming
file and line (or counts and skips it: ``--skip-bad-lines``), never leaves a partial dataset
under the final names, and resumes an interrupted job (``--resume``) from its last complete
part (the job: megatron_ext/preprocess/preprocess.py; its flags, from which the parser is made:
megatron_ext/preprocess/preprocess_config.py; its parts: megatron_ext/preprocess/parts.py).
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

from megatron_ext.preprocess.preprocess import Summary, preprocess
from megatron_ext.preprocess.preprocess_config import PreprocessConfig
from megatron_ext.config.data_config import DataConfig, add_tokenizer_flags
from megatron_ext.config.flag_fields import add_flags
from megatron_ext.config.model_config import ModelConfig
from megatron_ext.runtime.errors import exits_on_error


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_flags(parser.add_argument_group("input data"), PreprocessConfig, "input data",
              required=("input",))
    group = parser.add_argument_group("tokenizer")
    add_tokenizer_flags(group, required=True)
    add_flags(group, DataConfig, only=("vocab_size",), helps={
        "vocab_size": "NullTokenizer: ids 0 .. V-1 (the text is ids separated by spaces), EOD V"})
    add_flags(group, PreprocessConfig, "tokenizer")
    group = parser.add_argument_group("output data")
    add_flags(group, PreprocessConfig, "output data", required=("output_prefix",))
    add_flags(group, ModelConfig, only=("code_bits",), helps={
        "code_bits": "warn when token ids do not fit a fixed code of this many bits "
                     "(default: %(default)s)"})
    add_flags(parser.add_argument_group("runtime"), PreprocessConfig, "runtime")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> Summary:
    with exits_on_error():
        args = parse_args(argv)
        summary = preprocess(PreprocessConfig.from_flags(
            args, tokenizer=DataConfig.from_flags(args)))
        print(summary.report())
        if summary.code_warning:
            print(f"WARNING: a fixed code would not fit this tokenizer: {summary.code_warning}",
                  file=sys.stderr)
        return summary


if __name__ == "__main__":
    main()
