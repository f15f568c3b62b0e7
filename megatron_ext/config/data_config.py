"""The tokenizer and the data as flags: :class:`DataConfig`, one field per flag (Megatron-LM's
names), with the checks that need only these flags; the files themselves are read when the
tokenizer and the datasets are built (``datasets/``)."""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

from ..runtime.errors import FlagError
from .flag_fields import FlagConfig, add_flags, flag
from .flag_types import TOKENIZER_TYPES, check_tokenizer_flags

TOKENIZER_GROUP = "tokenizer"
# The flags naming a tokenizer, as every tool that reads one takes them (flag_types.
# add_tokenizer_flags); --vocab-size is each tool's own.
TOKENIZER_FLAGS = ("tokenizer_type", "tokenizer_model", "vocab_file", "merge_file")


def add_tokenizer_flags(group, default: Optional[str] = None, required: bool = False) -> None:
    """The flags naming a tokenizer, as training declares them (:data:`TOKENIZER_FLAGS`;
    ``--vocab-size`` is each tool's own), for the tools that read a tokenizer:
    ``--tokenizer-type``'s ``default``, or ``required``."""
    actions = add_flags(group, DataConfig, only=TOKENIZER_FLAGS,
                        defaults={"tokenizer_type": default},
                        required=("tokenizer_type",) if required else ())
    if default:
        actions[0].help += f"; default: {default}"


def split_weights(split: str) -> list[float]:
    """``--split``'s proportions (one to three, train,valid,test, not all 0), as megatron.core
    reads them (``parse_and_normalize_split``)."""
    try:
        weights = [float(w) for w in re.findall(r"[.0-9]+", split)]
    except ValueError:
        weights = []
    if not 1 <= len(weights) <= 3 or sum(weights) <= 0:
        raise FlagError(f"--split {split}: give one to three non-negative proportions "
                        f"(train,valid,test), not all 0")
    return weights


@dataclasses.dataclass(frozen=True)
class DataConfig(FlagConfig):
    """The tokenizer and the data training reads (a blend and its split, or a blend per
    split, or mock data) and how it is read."""
    FLAG_GROUP = "data"
    tokenizer_type: str = flag("NullTokenizer",
                               "as in Megatron-LM (megatron_ext/datasets/tokenizer.py)",
                               choices=TOKENIZER_TYPES, group=TOKENIZER_GROUP,
                               resume="said", megatron_lm=(None, "required"))
    tokenizer_model: Optional[str] = flag(
        None, "sentencepiece .model, tokenizer.json or Hugging Face folder",
        group=TOKENIZER_GROUP, resume="said")
    vocab_file: Optional[str] = flag(
        None, "GPT2BPETokenizer: the vocabulary (GPT-2's vocab.json)", group=TOKENIZER_GROUP,
        resume="said")
    merge_file: Optional[str] = flag(
        None, "GPT2BPETokenizer: the BPE merges (GPT-2's merges.txt)", group=TOKENIZER_GROUP,
        resume="said")
    # resume free: the padded vocabulary it gives is what a resume compares (compatibility.py)
    vocab_size: Optional[int] = flag(
        None, "NullTokenizer: ids 0 .. V-1, and EOD V (V + 1 ids, as in Megatron-LM)",
        group=TOKENIZER_GROUP, resume="free")
    data_path: Optional[tuple[str, ...]] = flag(
        None, "indexed dataset prefixes, optionally weighted: [W1] P1 [W2] P2 ...", nargs="+",
        resume="said")
    split: str = flag("969,30,1", "train,valid,test proportions",
                      resume="said", megatron_lm=(None, "required with --data-path"))
    train_data_path: Optional[tuple[str, ...]] = flag(
        None, "train split from its own prefixes (instead of --data-path/--split)", nargs="+",
        resume="said")
    valid_data_path: Optional[tuple[str, ...]] = flag(
        None, "valid split from its own prefixes (instead of --data-path/--split)", nargs="+",
        resume="said")
    test_data_path: Optional[tuple[str, ...]] = flag(
        None, "test split from its own prefixes (instead of --data-path/--split)", nargs="+",
        resume="said")
    data_args_path: Optional[str] = flag(
        None, "a file holding --data-path's value (whitespace-separated [W1] P1 ...), for "
              "blends too long for a command line, as in Megatron-LM", resume="said")
    per_split_data_args_path: Optional[str] = flag(
        None, "a JSON file {\"train\": ..., \"valid\": ..., \"test\": ...} of "
              "--train/valid/test-data-path values (lists or whitespace-separated strings), "
              "as in Megatron-LM", resume="said")
    mock_data: bool = flag(False, "synthetic tokens, no files", resume="said")
    eod_mask_loss: bool = flag(
        False, "no loss on end-of-document tokens (the dataset's loss mask)", resume="said")
    reset_position_ids: bool = flag(
        False, "position ids restart after each end-of-document token", resume="said")
    reset_attention_mask: bool = flag(
        False, "documents packed in one sequence do not attend to each other: an explicit "
               "mask, on local layers with --attention-backend auto or unfused/local (refused "
               "with flash and with Transformer Engine layers)", resume="said")
    data_cache_path: Optional[str] = flag(
        None, "where Megatron's dataset index caches go (rank 0 builds them, the others load "
              "them: a directory every node shares)", resume="free")
    require_data_cache: bool = flag(
        False, "load the index caches from --data-cache-path, never build them: missing ones "
               "are an error (build them ahead with tools/build_data_cache.py; "
               "tools/submit.py --build-cache sets this)", resume="free")
    max_data_epochs: Optional[float] = flag(
        None, "refuse to start when the train samples would read a data file's train split "
              "more than this many times (default: only warn above 1)", resume="free")
    num_workers: int = flag(2, "data loader workers", least=0, resume="free")

    def validate(self) -> None:
        """The tokenizer's flags, and the data given one way (the files themselves are read
        when the datasets are built: ``datasets/``)."""
        check_tokenizer_flags(self.tokenizer_type, self.tokenizer_model, self.vocab_size,
                              self.vocab_file, self.merge_file)
        if self.data_args_path and self.data_path:
            raise FlagError("give one of --data-path and --data-args-path")
        split_flags = [f"--{s}-data-path" for s in ("train", "valid", "test")
                       if getattr(self, f"{s}_data_path")]
        if self.per_split_data_args_path and split_flags:
            raise FlagError("give one of --train/valid/test-data-path and "
                            "--per-split-data-args-path")
        # the flag a blend came from, and the first of those a blend per split came from
        blend = ("--data-path" if self.data_path else
                 f"--data-args-path {self.data_args_path}" if self.data_args_path else None)
        per_split = (f"--per-split-data-args-path {self.per_split_data_args_path}"
                     if self.per_split_data_args_path else next(iter(split_flags), None))
        if self.mock_data and (blend or per_split):
            raise FlagError(f"give either {blend or per_split} or --mock-data, not both: "
                            f"--mock-data trains on synthetic tokens, and the data given "
                            f"would be ignored")
        if blend and per_split:
            raise FlagError("give either --data-path (with --split) or --train-data-path/"
                            "--valid-data-path/--test-data-path")
        if not (self.mock_data or blend or self.train_data_path
                or self.per_split_data_args_path):
            raise FlagError("give --data-path (indexed dataset prefixes), "
                            "--train-data-path, or --mock-data")
        if not per_split:
            split_weights(self.split)
        if self.require_data_cache and (self.mock_data or not self.data_cache_path):
            raise FlagError("--require-data-cache needs --data-cache-path (the caches "
                            "tools/build_data_cache.py built) and indexed data, not --mock-data")
