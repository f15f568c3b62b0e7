"""Check Megatron indexed datasets before training on them: one table per PREFIX.

For each dataset: documents, sequences, tokens, dtype and the smallest and largest token id
(the whole ``.bin`` is read, in chunks), after the checks training also makes at start
(megatron_ext/index_check.py: header, counts, ``.bin`` size). The token ids are checked
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
import os
import sys
from typing import Optional

from tqdm import tqdm

from megatron_ext.files import write_json
from megatron_ext.index_check import (SPLITS, IndexCheckError, read_index, split_problems,
                                           split_ranges, token_id_range)
from megatron_ext.tokenizer import TOKENIZER_TYPES, build_tokenizer


def _split(text: str) -> str:
    try:
        split_ranges(text, 0)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefixes", nargs="+", metavar="PREFIX",
                        help="dataset prefixes, without .bin/.idx (as for --data-path)")
    group = parser.add_argument_group("token ids")
    group.add_argument("--vocab-size", type=int,
                       help="token ids must be below this; with --tokenizer-type NullTokenizer, "
                            "below this + 1 (its EOD), as for training")
    group.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES,
                       help="token ids must be below this tokenizer's vocabulary size, as "
                            "for training")
    group.add_argument("--tokenizer-model",
                       help="sentencepiece .model, tokenizer.json or Hugging Face folder")
    group.add_argument("--code-bits", type=int, default=16,
                       help="token ids must be below 2^bits, for the fixed-code arms "
                            "(default: 16)")
    group = parser.add_argument_group("splits (with --seq-length)")
    group.add_argument("--seq-length", type=int,
                       help="divide each file by --split and check that the splits training "
                            "draws from hold a sample of this many tokens + 1")
    group.add_argument("--split", type=_split, default="969,30,1",
                       help="train,valid,test proportions (default: 969,30,1)")
    group.add_argument("--eval-iters", type=int, default=10,
                       help="as for training: the valid split must hold a sample unless 0 "
                            "(default: 10)")
    group.add_argument("--train-samples", type=int,
                       help="show the epochs of the train split that this many samples take")
    group.add_argument("--train-iters", type=int,
                       help="or this many iterations of --global-batch-size samples")
    group.add_argument("--global-batch-size", type=int, help="samples per iteration")
    parser.add_argument("--json", metavar="PATH", help="also write the results to PATH as JSON")
    args = parser.parse_args(argv)
    if args.train_iters is not None:
        if args.train_samples is not None or args.global_batch_size is None:
            parser.error("give --train-samples, or --train-iters with --global-batch-size")
        args.train_samples = args.train_iters * args.global_batch_size
    if args.train_samples is not None and args.seq_length is None:
        parser.error("--train-samples and --train-iters need --seq-length")
    if args.seq_length is not None and args.seq_length < 1:
        parser.error(f"--seq-length must be at least 1, got {args.seq_length}")
    return args


def _vocabulary(args: argparse.Namespace) -> tuple[Optional[int], str]:
    """The vocabulary size token ids are checked against, and where it comes from."""
    if args.tokenizer_type:
        tokenizer = build_tokenizer(args.tokenizer_type, args.tokenizer_model, args.vocab_size)
        return tokenizer.vocab_size, f"the {args.tokenizer_type}'s vocabulary"
    return args.vocab_size, "--vocab-size"


def check_file(prefix: str, args: argparse.Namespace, vocab_size: Optional[int],
               vocab_source: str) -> tuple[Optional[dict], list[str]]:
    """``(report, problems)`` of one dataset; no report when its files cannot be read."""
    try:
        index = read_index(prefix)
    except IndexCheckError as e:
        return None, [f"error: {e}"]
    bin_path = f"{prefix}.bin"
    with tqdm(total=os.path.getsize(bin_path), unit="B", unit_scale=True, leave=False,
              desc=f"reading {os.path.basename(bin_path)}", disable=None) as bar:  # terminals
        low, high = token_id_range(index, bar.update)
    report = {"prefix": prefix, "documents": index.documents, "sequences": index.sequences,
              "tokens": index.tokens(), "dtype": index.dtype.__name__,
              "min_token_id": low, "max_token_id": high}
    problems = []
    if low is not None and low < 0:
        problems.append(f"error: {bin_path}: negative token id {low:,}")
    if high is not None and vocab_size is not None and high >= vocab_size:
        problems.append(f"error: {bin_path}: token id {high:,} is outside {vocab_source} "
                        f"of {vocab_size:,} tokens")
    if high is not None and high >= 2 ** args.code_bits:
        problems.append(f"error: {bin_path}: token id {high:,} does not fit --code-bits "
                        f"{args.code_bits} (ids < 2^{args.code_bits} = {2 ** args.code_bits:,} "
                        f"for the fixed-code arms); raise --code-bits")
    if args.seq_length is not None:
        ranges = split_ranges(args.split, index.sequences)
        report["split_unit"] = index.unit
        report["splits"] = {
            name: {"begin": begin, "end": end, "count": end - begin,
                   "tokens": index.tokens(begin, end)}
            for name, (begin, end) in zip(SPLITS, (r or (0, 0) for r in ranges))}
        problems += split_problems(([prefix], None), None, args.split, args.seq_length,
                                   [1, args.eval_iters, 0])
        if args.train_samples is not None:
            needed = args.train_samples * args.seq_length + 1
            train_tokens = report["splits"]["train"]["tokens"]
            report["train_tokens_needed"] = needed
            report["train_epochs"] = needed / train_tokens if train_tokens else None
    return report, problems


def format_report(report: dict, args: argparse.Namespace) -> str:
    """The table of one dataset."""
    ids = ("-", "-") if report["min_token_id"] is None else (
        f"{report['min_token_id']:,}", f"{report['max_token_id']:,}")
    lines = [report["prefix"],
             f"  {'documents':>12} {'sequences':>12} {'tokens':>15} {'dtype':>8} "
             f"{'min id':>9} {'max id':>9}",
             f"  {report['documents']:>12,} {report['sequences']:>12,} {report['tokens']:>15,} "
             f"{report['dtype']:>8} {ids[0]:>9} {ids[1]:>9}"]
    if "splits" in report:
        lines.append(f"  {'--split ' + args.split:<20} {report['split_unit']:>12} "
                     f"{'range':>21} {'tokens':>15}")
        for name, s in report["splits"].items():
            span = f"[{s['begin']:,}, {s['end']:,})"
            lines.append(f"  {name:<20} {s['count']:>12,} {span:>21} {s['tokens']:>15,}")
    if "train_epochs" in report:
        epochs = report["train_epochs"]
        lines.append(f"  {args.train_samples:,} train samples x --seq-length {args.seq_length} "
                     f"+ 1 = {report['train_tokens_needed']:,} tokens: "
                     + ("the train split is empty" if epochs is None
                        else f"{epochs:,.2f} epochs of the train split"))
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> dict:
    args = parse_args(argv)
    vocab_size, vocab_source = _vocabulary(args)
    reports, problems = [], []
    for prefix in args.prefixes:
        report, found = check_file(prefix, args, vocab_size, vocab_source)
        if report:
            reports.append(report)
            print(format_report(report, args), flush=True)
        problems += found
    result = {"files": reports, "problems": problems}
    if args.json:
        write_json(args.json, result)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        raise SystemExit(1)
    print(f"ok: {len(reports)} dataset{'s' if len(reports) > 1 else ''} checked")
    return result


if __name__ == "__main__":
    main()
