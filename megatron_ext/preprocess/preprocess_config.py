"""The preprocessing job as flags: :class:`PreprocessConfig`, one field per flag of
tools/preprocess_data.py (Megatron-LM's names, declared with ``config/flag_fields.flag``, from
which the tool makes its parser), with the tokenizer and the code's bits that it takes from
the training configs, and the checks that need only these flags (:meth:`validate`); the
checks that need the inputs are the job's (``preprocess.check_inputs``)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..codes.limits import check_options
from ..config.data_config import DataConfig
from ..config.flag_fields import FlagConfig, flag
from ..config.model_config import ModelConfig
from ..runtime.errors import FlagError
from .readers import TEXT_DOCUMENT_MODES
from .shards import parse_shard

ENCODERS = ("auto", "gigatoken", "reference")  # --encoder


@dataclasses.dataclass(frozen=True)
class PreprocessConfig(FlagConfig):
    """What tools/preprocess_data.py's flags ask: the inputs, the tokenizer (training's flags,
    :data:`~megatron_ext.config.data_config.TOKENIZER_FLAGS` and ``--vocab-size``, as a
    ``DataConfig``), the outputs (``--code-bits`` as training reads it) and how to run."""
    input: tuple[str, ...] = flag(
        (), "input files, folders or glob patterns (quoted): *.jsonl/*.json are JSONL, "
            "*.parquet Parquet, anything else plain text (each may end in .gz or .zst); a "
            "folder is a datasets.save_to_disk folder or else every *.parquet under it (a "
            "Hugging Face dataset)", nargs="+", metavar="FILE_OR_GLOB", group="input data")
    json_keys: tuple[str, ...] = flag(
        ("text",), "JSON keys (Parquet/Arrow columns) to extract, one dataset each "
                   "(default: text)", nargs="+", group="input data")
    text_document: str = flag(
        "file", "plain-text inputs: one document per file (default), or per non-blank line",
        choices=TEXT_DOCUMENT_MODES, group="input data")
    shard: Optional[str] = flag(
        None, "I/N: read only shard I (0 to N-1) of the input files, a contiguous run of them, "
              "for a job split over N nodes (a Slurm array); tools/merge_datasets.py joins the N "
              "datasets, in shard order, into the bytes of one run over every input",
        metavar="I/N", group="input data")
    skip_bad_lines: bool = flag(
        False, "count and skip malformed JSON, missing keys, invalid UTF-8 and empty "
               "documents instead of stopping at the first", group="input data")
    append_eod: bool = flag(
        False, "append the tokenizer's EOD token to the end of each document", group="tokenizer")
    output_prefix: Optional[str] = flag(
        None, "path of the outputs without the _{key}_document.bin/.idx suffix",
        group="output data")
    workers: int = flag(1, "tokenizer processes, one thread each (default: 1)", group="runtime")
    encoder: str = flag(
        "auto", "auto (default): gigatoken for every text where it gives the reference "
                "library's ids (decided before encoding: special-token text, characters the "
                "libraries class differently, text the sentencepiece normalizer changes go to "
                "the reference), the reference encoder for the rest and for tokenizers "
                "gigatoken cannot load; gigatoken: the same, but an error if gigatoken cannot "
                "load the tokenizer; reference: the reference encoder only",
        choices=ENCODERS, group="runtime")
    verify_fraction: float = flag(
        0.001, "share of the documents gigatoken encodes that the reference encodes again, "
               "the same documents in every run (chosen by file and line); a difference stops "
               "the run naming file and line (default: 0.001)", metavar="F", group="runtime")
    resume: bool = flag(
        False, "continue the interrupted job with this --output-prefix, keeping its complete "
               "parts", group="runtime")
    part_tokens: int = flag(
        100_000_000, "tokens per part, the work an interruption can lose (default: 100M)",
        group="runtime")
    # the training configs' flags the tool takes (declared there): the tool builds them
    tokenizer: DataConfig = DataConfig()
    code_bits: int = ModelConfig.code_bits

    def validate(self) -> None:
        """The checks that need only the flags (typed ``FlagError``s)."""
        check_options(self.code_bits, scale=1.0)
        if not 0 <= self.verify_fraction <= 1:
            raise FlagError(f"--verify-fraction {self.verify_fraction}: a share of the "
                            "documents, from 0 to 1")
        if self.shard is not None:
            parse_shard(self.shard)
        if len(set(self.json_keys)) < len(self.json_keys):
            raise FlagError(f"--json-keys {' '.join(self.json_keys)}: a key is given twice")


@dataclasses.dataclass(frozen=True)
class DatasetMerge(FlagConfig):
    """What tools/merge_datasets.py's flags ask (Megatron-LM's ``tools/merge_datasets.py``
    names them ``--input`` and ``--output-prefix`` too): whole datasets in, one out."""
    FLAG_GROUP = "merge"
    input: tuple[str, ...] = flag(
        (), "datasets to merge, in this order: prefixes (or their .bin/.idx), quoted glob "
            "patterns and folders (every dataset in it), the last two sorted by name",
        nargs="+", metavar="PREFIX_OR_GLOB")
    output_prefix: Optional[str] = flag(
        None, "path of the merged dataset without .bin/.idx")
