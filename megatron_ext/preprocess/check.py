"""The report of tools/check_data.py: one indexed dataset's documents, sequences, tokens and
token-id range, its splits under ``--split``, and every problem found with it.

The checks training also makes at start (header, counts, ``.bin`` size, the splits that must
hold a sample) are the core's (megatron_ext/datasets/indexed.py); here they are gathered with the
whole ``.bin``'s token ids (read in chunks, with a progress bar on terminals) checked against
a vocabulary and a code's bits, into a report and its table.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from tqdm import tqdm

from ..config.data_config import DataConfig
from ..config.flag_fields import FlagConfig, flag
from ..datasets.indexed import IndexCheckError, read_index, token_id_range
from ..datasets.split_checks import SPLITS, split_problems, split_ranges
from ..datasets.tokenizer import tokenizer_from_args


@dataclasses.dataclass(frozen=True)
class CheckOutput(FlagConfig):
    """Where tools/check_data.py writes its results besides the screen."""
    json: Optional[str] = flag(None, "also write the results to PATH as JSON", metavar="PATH")


def vocabulary(tokenizer: DataConfig) -> tuple[Optional[int], str]:
    """The vocabulary size token ids are checked against (that of the tokenizer the flags
    ``tokenizer`` name, else their ``--vocab-size``), and where it comes from."""
    if tokenizer.tokenizer_type:
        return (tokenizer_from_args(tokenizer).vocab_size,
                f"the {tokenizer.tokenizer_type}'s vocabulary")
    return tokenizer.vocab_size, "--vocab-size"


def check_file(prefix: str, vocab_size: Optional[int], vocab_source: str, *, code_bits: int,
               seq_length: Optional[int] = None, split: str = "969,30,1",
               eval_iters: int = 10, train_samples: Optional[int] = None
               ) -> tuple[Optional[dict], list[str]]:
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
    if high is not None and high >= 2 ** code_bits:
        problems.append(f"error: {bin_path}: token id {high:,} does not fit --code-bits "
                        f"{code_bits} (ids < 2^{code_bits} = {2 ** code_bits:,} "
                        f"for the fixed-code arms); raise --code-bits")
    if seq_length is not None:
        ranges = split_ranges(split, index.sequences)
        report["split_unit"] = index.unit
        report["splits"] = {
            name: {"begin": begin, "end": end, "count": end - begin,
                   "tokens": index.tokens(begin, end)}
            for name, (begin, end) in zip(SPLITS, (r or (0, 0) for r in ranges))}
        problems += split_problems(([prefix], None), None, split, seq_length,
                                   [1, eval_iters, 0])
        if train_samples is not None:
            needed = train_samples * seq_length + 1
            train_tokens = report["splits"]["train"]["tokens"]
            report["train_tokens_needed"] = needed
            report["train_epochs"] = needed / train_tokens if train_tokens else None
    return report, problems


def format_report(report: dict, split: str, train_samples: Optional[int] = None,
                  seq_length: Optional[int] = None) -> str:
    """The table of one dataset (``split``, ``train_samples`` and ``seq_length`` as given to
    :func:`check_file`)."""
    ids = ("-", "-") if report["min_token_id"] is None else (
        f"{report['min_token_id']:,}", f"{report['max_token_id']:,}")
    lines = [report["prefix"],
             f"  {'documents':>12} {'sequences':>12} {'tokens':>15} {'dtype':>8} "
             f"{'min id':>9} {'max id':>9}",
             f"  {report['documents']:>12,} {report['sequences']:>12,} {report['tokens']:>15,} "
             f"{report['dtype']:>8} {ids[0]:>9} {ids[1]:>9}"]
    if "splits" in report:
        lines.append(f"  {'--split ' + split:<20} {report['split_unit']:>12} "
                     f"{'range':>21} {'tokens':>15}")
        for name, s in report["splits"].items():
            span = f"[{s['begin']:,}, {s['end']:,})"
            lines.append(f"  {name:<20} {s['count']:>12,} {span:>21} {s['tokens']:>15,}")
    if "train_epochs" in report:
        epochs = report["train_epochs"]
        lines.append(f"  {train_samples:,} train samples x --seq-length {seq_length} "
                     f"+ 1 = {report['train_tokens_needed']:,} tokens: "
                     + ("the train split is empty" if epochs is None
                        else f"{epochs:,.2f} epochs of the train split"))
    return "\n".join(lines)
