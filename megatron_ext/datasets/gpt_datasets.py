"""Training data: Megatron-Core GPT datasets over indexed ``.bin/.idx`` files, and loaders that
resume exactly at a number of consumed samples.

``--data-path`` takes Megatron's blend syntax (``P`` or ``W1 P1 W2 P2 ...``), split into
train/valid/test by ``--split``; or each split gets its own blend (``--train-data-path``,
``--valid-data-path``, ``--test-data-path``); ``--mock-data`` gives synthetic tokens. Index
caches go to ``--data-cache-path`` (megatron_ext/datasets/cache.py; ``--require-data-cache``:
they must be there, built ahead of time by tools/build_data_cache.py through
:func:`build_caches`). Every rank of a data-parallel replica reads the same micro-batches.
"""

from __future__ import annotations

import json
import os
from typing import Iterator, Optional

import torch

from megatron.core import parallel_state
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset
from megatron.core.datasets.utils import get_blend_from_list

from ..config.data_config import DataConfig
from ..config.derived import Derived
from ..config.run_config import RunConfig
from ..runtime.errors import DataError, FlagError
from . import cache
from .indexed import edge_token_id_max, read_index
from .split_checks import check_train_epochs, check_training_data, split_problems, split_ranges


def _blend(flag: str, paths):
    """Megatron's blend ``(prefixes, weights)`` of a data-path flag, with its files checked."""
    if not paths:
        return None
    try:
        blend = get_blend_from_list(paths)
    except (AssertionError, ValueError) as e:
        raise FlagError(f"{flag} {' '.join(paths)}: give prefixes, or weight/prefix "
                        f"pairs ({e})") from e
    for prefix in blend[0]:
        for ext in (".bin", ".idx"):
            if not os.path.isfile(prefix + ext):
                raise DataError(f"{flag}: {prefix + ext} does not exist "
                                f"(give dataset prefixes, without .bin/.idx)")
    return blend


def _check_token_ids(blends, vocab_size: int, tokenizer_type: str) -> None:
    """Refuse a dataset whose first or last tokens hold an id outside the tokenizer's
    vocabulary: data tokenized by another tokenizer (Megatron-LM's ``--legacy-tokenizer``
    sentencepiece puts its ``<EOD>`` past the model's pieces), which would train on ids the
    tokenizer never makes, below the padded vocabulary in silence (tools/check_data.py reads
    every id)."""
    for blend in blends:
        for prefix in (blend[0] if blend else ()):
            high = edge_token_id_max(read_index(prefix))
            if high is not None and high >= vocab_size:
                raise DataError(
                    f"{prefix}.bin holds token id {high:,} (in its first or last tokens), "
                    f"outside the --tokenizer-type {tokenizer_type} vocabulary of "
                    f"{vocab_size:,}: it was tokenized by another tokenizer; preprocess it "
                    f"with this one (docs/data.md), or check it with tools/check_data.py")


def _data_args_file(flag: str, path: str) -> str:
    if not os.path.isfile(path):
        raise DataError(f"{flag} {path} does not exist")
    with open(path, encoding="utf-8") as f:
        return f.read()


def data_paths(data: DataConfig) -> tuple[tuple, list[tuple]]:
    """``((flag, paths), [(flag, paths) per split])``: the values of ``--data-path`` and
    ``--train/valid/test-data-path``, or those read from ``--data-args-path`` and
    ``--per-split-data-args-path`` (Megatron-LM's formats), each with the flag it came from
    (given one way: ``config.data_config.DataConfig.validate``)."""
    blend = ("--data-path", data.data_path)
    if data.data_args_path:
        blend = (f"--data-args-path {data.data_args_path}",
                 _data_args_file("--data-args-path", data.data_args_path).split())
    splits = ("train", "valid", "test")
    per_split = [(f"--{s}-data-path", getattr(data, f"{s}_data_path")) for s in splits]
    if data.per_split_data_args_path:
        flag = "--per-split-data-args-path"
        try:
            values = json.loads(_data_args_file(flag, data.per_split_data_args_path))
            per_split = [(f"{flag} {data.per_split_data_args_path} [{s!r}]",
                          values[s].split() if isinstance(values[s], str) else values[s])
                         for s in splits]
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise DataError(f"{flag} {data.per_split_data_args_path}: expected a JSON object "
                            f"with train, valid and test keys, each a list of [weight] "
                            f"prefix or a whitespace-separated string ({e!r})") from None
    return blend, per_split


def samples_per_split(config: RunConfig, derived: Derived) -> list[int]:
    """The sequences a run draws from the train, valid and test split: every validation reads
    the same first ``--eval-iters`` global batches, and so does the test evaluation at the end
    of training (Megatron-LM's), when the flags give a test split that holds them
    (:func:`test_split`)."""
    evaluated = config.logging.eval_iters * derived.global_batch_size
    return [derived.train_samples, evaluated, evaluated if test_split(config)[0] else 0]


def test_split(config: RunConfig) -> tuple[bool, Optional[str]]:
    """``(read, why not)``: whether the run evaluates a test split, and why a test share of
    ``--split`` is not (a file whose test split holds no sample, as a small dataset under the
    default 969,30,1 does), else None. ``--mock-data`` and ``--test-data-path`` (or its blend
    file's) are read, an explicit path refused when it is too small; ``--split`` over
    ``--data-path`` is read when its test share holds a sample in every file."""
    model, data, logging = config.model, config.data, config.logging
    if not logging.eval_iters:
        return False, None
    if data.mock_data:
        return True, None
    blend, per_split = data_paths(data)
    if any(paths for _, paths in per_split):
        return bool(per_split[2][1]), None
    try:
        if not blend[1] or split_ranges(data.split, 1000)[2] is None:
            return False, None
    except ValueError:  # the dataset checks name it
        return False, None
    problems = split_problems(_blend(*blend), None, data.split, model.seq_length, [0, 0, 1])
    if problems:
        return False, problems[0].removeprefix("error: ").split("; ")[0]
    return True, None


def build_datasets(config: RunConfig, tokenizer, num_samples: list[int]):
    """``((train, valid, test), cache records)``: GPT datasets of at least ``num_samples``
    sequences each, and what ``--data-cache-path`` gave them (cache.CacheRecord each,
    as rank 0 saw it; None without a cache path or with --mock-data)."""
    model, training, data = config.model, config.training, config.data
    paths, per_split_paths = data_paths(data)
    per_split = [_blend(flag, split) for flag, split in per_split_paths]
    blend = None if data.mock_data else _blend(*paths)
    if not data.mock_data:
        check_training_data(blend, per_split if any(per_split) else None,
                            None if any(per_split) else data.split, model.seq_length, num_samples)
        check_train_epochs(blend, per_split if any(per_split) else None,
                           None if any(per_split) else data.split, model.seq_length,
                           num_samples[0], data.max_data_epochs)
        _check_token_ids([blend, *per_split], tokenizer.vocab_size, data.tokenizer_type)
    dataset_config = GPTDatasetConfig(
        random_seed=training.seed,
        sequence_length=model.seq_length,
        blend=blend,
        blend_per_split=per_split if any(per_split) else None,
        split=None if any(per_split) else data.split,
        path_to_cache=data.data_cache_path,
        tokenizer=tokenizer,
        reset_position_ids=data.reset_position_ids,
        reset_attention_mask=data.reset_attention_mask,
        eod_mask_loss=data.eod_mask_loss,
        create_attention_mask=data.reset_attention_mask,
    )
    # A split asked for no samples is not built: Megatron-Core counts epochs for ever over an
    # empty one (the test split of a small dataset), even to draw none from it.
    if dataset_config.split_matrix:
        dataset_config.split_matrix = [r if n else None
                                       for r, n in zip(dataset_config.split_matrix, num_samples)]
    if data.mock_data:
        return BlendedMegatronDatasetBuilder(MockGPTDataset, num_samples, lambda: True,
                                             dataset_config).build(), None
    cache_dir = data.data_cache_path
    if cache_dir:
        cache.check_visible(cache_dir, data.require_data_cache)
    before = cache.listing(cache_dir)
    try:
        built = BlendedMegatronDatasetBuilder(cache.gpt_dataset_class(
            data.require_data_cache), num_samples, lambda: True, dataset_config).build()
    except FileNotFoundError as e:  # a blend's index that rank 0 saved, unseen here
        if cache_dir and e.filename and os.path.dirname(os.path.abspath(e.filename)) == \
                os.path.abspath(cache_dir):
            raise DataError(cache.not_shared(cache_dir, os.path.basename(e.filename))) from e
        raise
    return built, cache_dir and cache.cache_report(built, cache_dir, before)


class ResumableBatchSampler:
    """Yields this data-parallel rank's micro-batches of sample indices, from ``consumed``.

    Each global step of ``micro x dp`` samples gives rank r the slice ``[r*micro, (r+1)*micro)``,
    so a run resumed at ``consumed`` samples reads exactly what the uninterrupted run read.
    """

    def __init__(self, total: int, consumed: int, micro_batch_size: int, dp_rank: int,
                 dp_size: int):
        self.total, self.consumed = total, consumed
        self.micro, self.dp_rank, self.dp_size = micro_batch_size, dp_rank, dp_size

    def __iter__(self) -> Iterator[list[int]]:
        step = self.micro * self.dp_size
        for start in range(self.consumed, self.total - step + 1, step):
            first = start + self.dp_rank * self.micro
            yield list(range(first, first + self.micro))

    def __len__(self) -> int:
        return max(0, (self.total - self.consumed) // (self.micro * self.dp_size))


def build_loader(dataset, micro_batch_size: int, num_workers: int, consumed: int):
    sampler = ResumableBatchSampler(
        len(dataset), consumed, micro_batch_size,
        parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size())
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers,
                                       pin_memory=torch.cuda.is_available(),
                                       persistent_workers=False)


def build_train_valid_test(config: RunConfig, tokenizer, num_samples: list[int],
                           consumed_train: int):
    """The train micro-batch iterator (from ``consumed_train``), the validation dataset and
    the test dataset (None where not evaluated); ``num_samples``: per split, as
    :func:`samples_per_split` gives them.

    Every evaluation reads the same first ``--eval-iters`` global batches of the validation
    split, so validation curves are comparable across steps, arms and resumed runs (Megatron-LM
    reads the next batches each time)."""
    training, data, logging = config.training, config.data, config.logging
    (train_ds, valid_ds, test_ds), records = build_datasets(config, tokenizer, num_samples)
    if records and torch.distributed.get_rank() == 0:  # rank 0 decides to build or to load
        built = [f"{r.split} {r.kind} of {r.source}" for r in records if r.built]
        print(f"[fixedcode] dataset index caches in --data-cache-path {data.data_cache_path}: "
              f"{len(records) - len(built)} loaded, "
              + (f"{len(built)} built: {'; '.join(built)}" if built else "none built"),
              flush=True)
    train = iter(build_loader(train_ds, training.micro_batch_size, data.num_workers,
                              consumed_train))
    return train, (valid_ds if logging.eval_iters else None), (test_ds if num_samples[2] else None)


def build_caches(config: RunConfig, tokenizer, num_samples: list[int]) -> list:
    """Build (or find) the dataset index caches of the run of ``config`` in this process,
    ahead of the training job (tools/build_data_cache.py): the datasets training builds,
    under a one-process group of their own when torch.distributed is not started; returns
    the cache.CacheRecord of each."""
    own_group = cache.one_process_group()
    try:
        _, records = build_datasets(config, tokenizer, num_samples)
    finally:
        if own_group:
            torch.distributed.destroy_process_group()
    return records
