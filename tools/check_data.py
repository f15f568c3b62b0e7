"""Check Megatron indexed datasets before training on them: one table per PREFIX.

For each dataset: documents, sequences, tokens, dtype and the smallest and largest token id
(the whole ``.bin`` is read, in chunks), after the checks training also makes at start
(megatron_ext/datasets/indexed.py: header, counts, ``.bin`` size). The token ids are checked
against the vocabulary (``--vocab-size``, or ``--tokenizer-type``/``--tokenizer-model``) and
against ``--code-bits`` (the fixed-code arms need ids < 2^bits). With ``--seq-length`` each file
is divided by ``--split`` as ``--data-path PREFIX`` would be, each split's documents and tokens
are shown, and the splits training draws from must hold a sample (train always, valid unless
``--eval-iters 0``); with ``--train-samples`` (or ``--train-iters`` x ``--global-batch-size``)
the epochs of the train split that implies are shown. The exit status is 1 when any check
fails, every problem being listed. Flags are named as for pretrain_fixedcode.py.

    python tools/check_data.py demo/data/train_text_document --seq-length 128 \\
        --tokenizer-type SentencePieceTokenizer --tokenizer-model demo/tokenizer/spm.model
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from megatron_ext.preprocess.check import CheckOutput, check_file, format_report, vocabulary
from megatron_ext.runtime.errors import exits_on_error
from megatron_ext.runtime.files import write_json
from megatron_ext.config.data_config import DataConfig, add_tokenizer_flags
from megatron_ext.config.flag_fields import ShowDefaults, add_flags
from megatron_ext.config.logging_config import LoggingConfig
from megatron_ext.config.model_config import ModelConfig
from megatron_ext.config.training_config import TrainingConfig
from megatron_ext.datasets.split_checks import split_ranges


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=ShowDefaults)
    parser.add_argument("prefixes", nargs="+", metavar="PREFIX",
                        help="dataset prefixes, without .bin/.idx (as for --data-path)")
    group = parser.add_argument_group("token ids")
    add_flags(group, DataConfig, only=("vocab_size",), helps={
        "vocab_size": "token ids must be below this; with --tokenizer-type NullTokenizer, "
                      "below this + 1 (its EOD), as for training"})
    add_tokenizer_flags(group)  # token ids must be below its vocabulary size, as for training
    add_flags(group, ModelConfig, only=("code_bits",), helps={
        "code_bits": "token ids must be below 2^bits, for the fixed-code arms"})
    group = parser.add_argument_group("splits (with --seq-length)")
    add_flags(group, ModelConfig, only=("seq_length",), helps={
        "seq_length": "divide each file by --split and check that the splits training draws "
                      "from hold a sample of this many tokens + 1"})
    add_flags(group, DataConfig, only=("split",))
    add_flags(group, LoggingConfig, only=("eval_iters",), helps={
        "eval_iters": "as for training: the valid split must hold a sample unless 0"})
    add_flags(group, TrainingConfig, only=("train_samples", "train_iters", "global_batch_size"),
              helps={"train_samples": "show the epochs of the train split that this many "
                                      "samples take",
                     "train_iters": "or this many iterations of --global-batch-size samples",
                     "global_batch_size": "samples per iteration"})
    add_flags(parser, CheckOutput)
    args = parser.parse_args(argv)
    try:
        split_ranges(args.split, 0)
    except ValueError as e:
        parser.error(f"argument --split: {e}")
    if args.train_iters is not None and (args.train_samples is not None
                                         or args.global_batch_size is None):
        parser.error("give --train-samples, or --train-iters with --global-batch-size")
    if (args.train_samples is not None or args.train_iters is not None) \
            and args.seq_length is None:
        parser.error("--train-samples and --train-iters need --seq-length")
    return args


def main(argv: Optional[list[str]] = None) -> dict:
    with exits_on_error():
        args = parse_args(argv)
        data, model = DataConfig.from_flags(args), ModelConfig.from_flags(args)
        training = TrainingConfig.from_flags(args)
        vocab_size, vocab_source = vocabulary(data)
        train_samples = (training.train_samples if training.train_iters is None
                         else training.train_iters * training.global_batch_size)
        reports, problems = [], []
        for prefix in args.prefixes:
            report, found = check_file(prefix, vocab_size, vocab_source,
                                       code_bits=model.code_bits, seq_length=model.seq_length,
                                       split=data.split,
                                       eval_iters=LoggingConfig.from_flags(args).eval_iters,
                                       train_samples=train_samples)
            if report:
                reports.append(report)
                print(format_report(report, data.split, train_samples, model.seq_length),
                      flush=True)
            problems += found
        result = {"files": reports, "problems": problems}
        output = CheckOutput.from_flags(args)
        if output.json:
            write_json(output.json, result)
        if problems:
            print("\n".join(problems), file=sys.stderr)
            raise SystemExit(1)
        print(f"ok: {len(reports)} dataset{'s' if len(reports) > 1 else ''} checked")
        return result


if __name__ == "__main__":
    main()
