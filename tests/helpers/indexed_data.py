"""Tiny indexed datasets written with Megatron-Core's builder, and the datasets training
builds from them."""

from __future__ import annotations

import numpy as np
import torch
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from conftest import TINY_RUN
from megatron_ext.datasets.gpt_datasets import build_train_valid_test, samples_per_split
from megatron_ext.runtime.megatron_compat import null_tokenizer_counts
from megatron_ext.train.setup import check_machine_and_tokenizer
from pretrain_fixedcode import parse_args


def make_dataset(prefix, lengths, dtype=np.uint16, first_id=0, modulo=500) -> str:
    """An indexed dataset of one sequence per document; token ids count up from ``first_id``
    modulo ``modulo`` (by default below TINY_RUN's --vocab-size 512)."""
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for i, length in enumerate(lengths):
        ids = (first_id + i + torch.arange(length, dtype=torch.int64)) % modulo
        builder.add_document(ids, [length])
    builder.finalize(f"{prefix}.idx")
    return str(prefix)


def null_vocab_size(ids: int) -> int:
    """The --vocab-size whose NullTokenizer holds ``ids`` ids (its EOD the last) on the installed
    release: ``ids - 1`` before megatron-core 0.18.0, ``ids`` from it."""
    return ids - (null_tokenizer_counts(ids)[0] - ids)


def training_data(*flags):
    """build_train_valid_test as pretrain_fixedcode.py calls it, train and valid: --seq-length
    32, --train-iters 2 of --global-batch-size 4 (run it under the cpu_dist fixture)."""
    args = parse_args([a for a in TINY_RUN if a != "--mock-data"]
                      + ["--train-iters", "2", *map(str, flags)])
    tokenizer, _, derived = check_machine_and_tokenizer(args, "cpu")
    return build_train_valid_test(args, tokenizer, samples_per_split(args, derived), 0)[:2]
