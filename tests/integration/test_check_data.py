"""Data checks before training: megatron_ext/datasets/indexed.py (damaged files, the splits of
--split as megatron.core computes them), training's refusal of data it would hang on, and
tools/check_data.py. Datasets are written by megatron.core's IndexedDatasetBuilder."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.blended_megatron_dataset_config import BlendedMegatronDatasetConfig
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDataset

from conftest import REPO, TINY_RUN
from helpers.gpt2_bpe import gpt2_bpe_files
from helpers.indexed_data import make_dataset, null_vocab_size, training_data
from megatron_ext.datasets.indexed import IndexCheckError, read_index, token_id_range
from megatron_ext.datasets.split_checks import (check_train_epochs, split_problems, split_ranges,
                                                train_epochs)
from megatron_ext.datasets.tokenizer import NullTokenizer
from megatron_ext.runtime import errors
from megatron_ext.runtime.errors import DataError
from megatron_ext.runtime.megatron_compat import null_tokenizer_counts
from tools import check_data

# TINY_RUN's NullTokenizer --vocab-size 511 holds 512 ids before megatron-core 0.18.0 (EOD 511),
# 511 from it (EOD 510): the first id past its vocabulary.
PAST_TINY_VOCAB = null_tokenizer_counts(511)[0]


# --- --split as megatron.core divides a dataset ------------------------------------------------

class _Recorder:
    """A stand-in GPT dataset class: megatron's builder hands it each split's sequence indices."""

    build_low_level_dataset = staticmethod(lambda sequences, config: sequences)
    numel_low_level_dataset = staticmethod(lambda sequences: sequences)

    def __init__(self, low_level, path, indices, num_samples, split, config):
        self.indices = indices.tolist()


def megatron_split_indices(split: str, sequences: int) -> list:
    config = BlendedMegatronDatasetConfig(random_seed=0, sequence_length=1,
                                          blend=(["unused"], None), split=split)
    builder = BlendedMegatronDatasetBuilder(_Recorder, [1, 1, 1], lambda: True, config)
    built = builder._build_megatron_dataset_splits(sequences, config.split_matrix, [1, 1, 1],
                                                   False)
    return [None if b is None else b.indices for b in built]


def test_split_ranges_are_megatrons():
    rng = np.random.default_rng(0)
    splits = ["969,30,1", "99,1,0", "1,1,1", "100,0,0", "0,1,0", "0,0,1", "98,2", "1",
              "0.7,0.2,0.1", "949,50,1", "3,0,1", "80, 10, 10", "1/2/3", "33.3,33.3,33.4"]
    splits += [",".join(map(str, rng.integers(0, 1000, 3) + [1, 0, 0])) for _ in range(40)]
    sizes = list(range(0, 130)) + [997, 1000, 12_345, 99_999, 1_000_003]
    for split in splits:
        for sequences in sizes:
            ours = [None if r is None else list(range(*r)) for r in split_ranges(split, sequences)]
            assert ours == megatron_split_indices(split, sequences), (split, sequences)


@pytest.mark.parametrize("split", ["1,2,3,4", "0,0,0", "", "a,b"])
def test_a_malformed_split_is_refused(split):
    with pytest.raises(ValueError, match=f"--split {split}: give one to three"):
        split_ranges(split, 10)


# --- damaged files ----------------------------------------------------------------------------

def _patch(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(data)] = data
    path.write_bytes(bytes(raw))


def _truncate_bin(prefix):
    Path(f"{prefix}.bin").write_bytes(Path(f"{prefix}.bin").read_bytes()[:1000])


def _extend_bin(prefix):
    with open(f"{prefix}.bin", "ab") as f:
        f.write(b"\0\0")


def _other_idx(prefix):  # the index of a larger dataset beside this .bin
    bigger = make_dataset(f"{prefix}_bigger", [300] * 12)
    Path(f"{prefix}.idx").write_bytes(Path(f"{bigger}.idx").read_bytes())


def _grow_a_length(prefix):  # lengths no longer match the offsets
    _patch(Path(f"{prefix}.idx"), 34, struct.pack("<i", 301))


def _bad_documents(prefix):  # the last document index is not the sequence count
    path = Path(f"{prefix}.idx")
    _patch(path, path.stat().st_size - 8, struct.pack("<q", 9))


def _extra_idx_bytes(prefix):
    with open(f"{prefix}.idx", "ab") as f:
        f.write(b"\0" * 8)


DAMAGE = {  # how to damage a dataset of 10 documents of 300 uint16 tokens: (file, message)
    "truncated .bin": (_truncate_bin, ".bin", r"\.bin is truncated: 1,000 bytes, but .*\.idx "
                                              r"describes 6,000"),
    "longer .bin": (_extend_bin, ".bin", r"\.bin is longer than its index says: 6,002 bytes"),
    "the .idx of another dataset": (_other_idx, ".bin", r"is truncated: 6,000 bytes, but .* "
                                                        r"describes 7,200"),
    "wrong magic": (lambda p: _patch(Path(f"{p}.idx"), 0, b"NOTANIDX"), ".idx",
                    "is not a Megatron index"),
    "wrong version": (lambda p: _patch(Path(f"{p}.idx"), 9, struct.pack("<Q", 2)), ".idx",
                      "index version 2 is not supported"),
    "unknown dtype code": (lambda p: _patch(Path(f"{p}.idx"), 17, b"\x09"), ".idx",
                           "unknown dtype code 9"),
    "sequence count": (lambda p: _patch(Path(f"{p}.idx"), 18, struct.pack("<Q", 11)), ".idx",
                       r"holds 242 bytes, but its counts \(11 sequences, 11 document indices\) "
                       r"make 254"),
    "extra .idx bytes": (_extra_idx_bytes, ".idx", "holds 250 bytes, but its counts"),
    "document indices": (_bad_documents, ".idx", "document indices do not run from 0 to its 10"),
    "sequence offsets": (_grow_a_length, ".idx", "sequence offsets disagree with its sequence "
                                                 "lengths"),
    "missing .bin": (lambda p: Path(f"{p}.bin").unlink(), ".bin", r"\.bin does not exist"),
    "missing .idx": (lambda p: Path(f"{p}.idx").unlink(), ".idx", r"\.idx does not exist"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_dataset_is_refused_naming_the_file(damage, tmp_path):
    prefix = make_dataset(tmp_path / "data", [300] * 10)
    read_index(prefix)  # intact: accepted
    corrupt, suffix, message = DAMAGE[damage]
    corrupt(prefix)
    with pytest.raises(IndexCheckError, match=message) as e:
        read_index(prefix)
    assert str(e.value).startswith(prefix + suffix)


def test_an_intact_index_reads_as_megatrons(tmp_path):
    prefix = make_dataset(tmp_path / "data", [5, 1, 300, 7], dtype=np.int32, first_id=40_000,
                          modulo=100_000)
    index, megatrons = read_index(prefix), IndexedDataset(prefix)
    assert index.dtype == megatrons.index.dtype == np.int32
    assert np.array_equal(index.sequence_lengths, megatrons.sequence_lengths)
    assert np.array_equal(index.document_indices, megatrons.document_indices)
    assert (index.documents, index.sequences, index.tokens()) == (4, 4, 313)
    assert index.tokens(1, 3) == 301
    seen = []
    assert token_id_range(index, seen.append, chunk_tokens=7) == (40_000, 40_301)
    assert sum(seen) == Path(f"{prefix}.bin").stat().st_size and len(seen) == 45


# --- what training refuses --------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_small_dataset_is_refused_fast_naming_the_split(cpu_dist, tmp_path):
    """30 documents of 20 tokens: --split 969,30,1 gives the valid split one document, short of
    a sample of 33 tokens (Megatron-Core used to count epochs for ever here)."""
    prefix = make_dataset(tmp_path / "small", [20] * 30)
    start = time.monotonic()
    with pytest.raises(DataError) as e:
        training_data("--data-path", prefix, "--eval-iters", "2",
                      "--data-cache-path", tmp_path / "cache")
    assert time.monotonic() - start < 3
    assert errors.message(e.value) == (
        f"error: --data-path {prefix}: --split 969,30,1 gives the valid split 1 of its 30 "
        f"documents (20 tokens), fewer than the --seq-length 32 + 1 = 33 tokens of one sample; "
        f"give the valid split more weight in --split, use --valid-data-path, or pass "
        f"--eval-iters 0")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case,message", [
    ("empty valid split", "gives the valid split 0 of its 10 documents (0 tokens)"),
    ("valid split of weight 0", "--split 100,0,0 gives the valid split 0 of its 67 documents"),
    ("small train split", "gives the train split 2 of its 2 documents (20 tokens), fewer than "
                          "the --seq-length 32 + 1 = 33 tokens of one sample; give the train "
                          "split more weight in --split, or use --train-data-path"),
    ("small --valid-data-path", "--valid-data-path {valid} holds 1 of its 1 documents "
                                "(20 tokens), fewer than the --seq-length 32 + 1 = 33 tokens of "
                                "one sample; give --valid-data-path more data, or pass "
                                "--eval-iters 0"),
    ("--train-data-path alone", "error: the valid split is read (8 samples) but no "
                                "--valid-data-path is given; give --valid-data-path, or pass "
                                "--eval-iters 0 (without it no validation runs)"),
    ("truncated .bin", "error: --data-path: {train}.bin is truncated: 1,000 bytes, but "
                       "{train}.idx describes 2,680"),
    ("ids of another tokenizer", f"{{train}}.bin holds token id {PAST_TINY_VOCAB} (in its "
                                 f"first or last tokens), outside the --tokenizer-type "
                                 f"NullTokenizer vocabulary of {PAST_TINY_VOCAB}: it was "
                                 f"tokenized by another tokenizer"),
])
def test_training_refuses_data_it_cannot_use(cpu_dist, tmp_path, case, message):
    train = make_dataset(tmp_path / "train", [20] * 67)
    valid = make_dataset(tmp_path / "valid", [20])
    flags = {
        "empty valid split": ["--data-path", make_dataset(tmp_path / "ten", [20] * 10)],
        "valid split of weight 0": ["--data-path", train, "--split", "100,0,0"],
        "small train split": ["--data-path", make_dataset(tmp_path / "two", [10, 10]),
                              "--eval-iters", "0"],
        "small --valid-data-path": ["--train-data-path", train, "--valid-data-path", valid],
        "--train-data-path alone": ["--train-data-path", train],
        "truncated .bin": ["--data-path", train],
        "ids of another tokenizer": ["--data-path", train, "--split", "90,10,0"],
    }[case]
    if case == "truncated .bin":
        _truncate_bin(train)
    if case == "ids of another tokenizer":  # an <EOD> past the vocabulary ends the last document
        train = make_dataset(tmp_path / "train", [20] * 66 + [19], modulo=511)
        data = np.memmap(f"{train}.bin", np.uint16, mode="r+")
        data[-1] = PAST_TINY_VOCAB
    with pytest.raises(DataError) as e:
        training_data("--eval-iters", "2", *flags, "--data-cache-path", tmp_path / "cache")
    assert message.format(train=train, valid=valid) in errors.message(e.value)


@pytest.mark.timeout(60)
def test_a_small_dataset_that_holds_its_samples_trains(cpu_dist, tmp_path):
    """67 documents: the default split leaves the test split empty, which is not built (it hung
    Megatron-Core); per-split paths, and no validation over an empty valid split, build too."""
    small = make_dataset(tmp_path / "small", [20] * 67)
    cache = ["--data-cache-path", tmp_path / "cache"]
    train, valid = training_data("--data-path", small, "--eval-iters", "2", *cache)
    assert len(next(train)["tokens"][0]) == 32 and len(valid) >= 8
    train, valid = training_data("--train-data-path", small, "--valid-data-path", small,
                                 "--test-data-path", small, "--eval-iters", "1", *cache)
    assert len(next(train)["tokens"]) == 2 and len(valid) >= 4
    ten = make_dataset(tmp_path / "ten", [20] * 10)
    train, valid = training_data("--data-path", ten, "--eval-iters", "0", *cache)
    assert next(train)["tokens"].shape == (2, 32) and valid is None
    train, valid = training_data("--train-data-path", small, "--eval-iters", "0", *cache)
    assert next(train)["tokens"].shape == (2, 32) and valid is None


@pytest.mark.timeout(60)
def test_skipping_the_unasked_test_split_leaves_the_train_samples_alone(cpu_dist, tmp_path):
    prefix = make_dataset(tmp_path / "data", [20 + i % 7 for i in range(1000)])
    train, _ = training_data("--data-path", prefix, "--eval-iters", "1",
                             "--data-cache-path", tmp_path / "cache")
    config = GPTDatasetConfig(
        random_seed=1234, sequence_length=32, blend=([prefix], None), split="969,30,1",
        path_to_cache=str(tmp_path / "megatron"), tokenizer=NullTokenizer(511),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        create_attention_mask=False)
    megatrons, _, test = BlendedMegatronDatasetBuilder(GPTDataset, [8, 4, 0], lambda: True,
                                                      config).build()
    assert len(test.indices) == 1  # megatron builds the test split; training does not
    first = [next(train)["tokens"] for _ in range(2)]
    assert torch.equal(torch.cat(first), torch.stack([megatrons[i]["tokens"] for i in range(4)]))


def test_split_problems_list_every_file(tmp_path):
    """Blends: each component of a split that is asked for samples must hold one."""
    good = make_dataset(tmp_path / "good", [20] * 67)
    small = make_dataset(tmp_path / "small", [20] * 30)
    missing = str(tmp_path / "missing")
    problems = split_problems(([good, small, missing], [0.5, 0.3, 0.2]), None, "969,30,1", 32,
                              [8, 4, 0])
    assert len(problems) == 2
    assert problems[0].startswith(f"error: --data-path {small}: --split 969,30,1 gives the "
                                  f"valid split 1 of its 30 documents")
    assert problems[1] == f"error: --data-path: {missing}.idx does not exist"
    assert split_problems(([good, small], None), None, "969,30,1", 32, [8, 0, 0]) == []


# --- tools/check_data.py ----------------------------------------------------------------------

def run_tool(*flags):
    return check_data.main([str(f) for f in flags])


def test_the_tool_reports_a_good_dataset(tmp_path, capsys):
    prefix = make_dataset(tmp_path / "good", [20] * 60 + [30] * 7, first_id=3)
    result = run_tool(prefix, "--vocab-size", 512, "--seq-length", 32, "--train-iters", 10,
                      "--global-batch-size", 4, "--json", tmp_path / "report.json")
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == prefix
    assert lines[2].split() == ["67", "67", "1,410", "uint16", "3", "98"]
    assert lines[3].split() == ["--split", "969,30,1", "documents", "range", "tokens"]
    assert lines[4].split() == ["train", "65", "[0,", "65)", "1,350"]
    assert lines[5].split() == ["valid", "2", "[65,", "67)", "60"]
    assert lines[6].split() == ["test", "0", "[67,", "67)", "0"]
    assert lines[7] == ("  40 train samples x --seq-length 32 + 1 = 1,281 tokens: 0.95 epochs "
                        "of the train split")
    assert lines[-1] == "ok: 1 dataset checked"
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved == result and saved["problems"] == []
    report = saved["files"][0]
    assert (report["tokens"], report["min_token_id"], report["max_token_id"]) == (1410, 3, 98)
    assert report["splits"]["valid"] == {"begin": 65, "end": 67, "count": 2, "tokens": 60}
    assert report["train_epochs"] == pytest.approx(1281 / 1350)
    assert not list(tmp_path.glob("*.tmp"))


def test_the_tool_lists_every_problem(tmp_path, capsys):
    truncated = make_dataset(tmp_path / "truncated", [300] * 10)
    _truncate_bin(truncated)
    small = make_dataset(tmp_path / "small", [20] * 30)
    wide = make_dataset(tmp_path / "wide", [50] * 40, dtype=np.int32, first_id=70_000,
                        modulo=100_000)
    with pytest.raises(SystemExit) as e:
        run_tool(truncated, small, wide, tmp_path / "missing", "--vocab-size", 80_000,
                 "--seq-length", 32, "--json", tmp_path / "report.json")
    assert e.value.code == 1
    captured = capsys.readouterr()
    errors = captured.err.strip().splitlines()
    assert errors == [
        f"error: {truncated}.bin is truncated: 1,000 bytes, but {truncated}.idx describes 6,000",
        f"error: --data-path {small}: --split 969,30,1 gives the valid split 1 of its 30 "
        f"documents (20 tokens), fewer than the --seq-length 32 + 1 = 33 tokens of one sample; "
        f"give the valid split more weight in --split, use --valid-data-path, or pass "
        f"--eval-iters 0",
        f"error: {wide}.bin: token id 70,088 does not fit --code-bits 16 (ids < 2^16 = "
        f"65,536 for the fixed-code arms); raise --code-bits",
        f"error: {tmp_path}/missing.idx does not exist",
    ]
    assert f"{small}\n" in captured.out and f"{wide}\n" in captured.out
    assert "ok:" not in captured.out
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["problems"] == errors
    assert [f["prefix"] for f in saved["files"]] == [small, wide]


@pytest.mark.parametrize("flags,ok", [
    (["--vocab-size", "99"], True),
    (["--vocab-size", "98"], False),
    # ids 0..98: EOD 98 (--vocab-size 98 before megatron-core 0.18.0, 99 from it)
    (["--tokenizer-type", "NullTokenizer", "--vocab-size", str(null_vocab_size(99))], True),
    (["--tokenizer-type", "NullTokenizer", "--vocab-size", str(null_vocab_size(98))], False),
    (["--code-bits", "7"], True),
    (["--code-bits", "6"], False),
    (["--seq-length", "32", "--eval-iters", "0"], True),
    (["--seq-length", "32"], False),
])
def test_the_tool_checks_ids_and_splits_against_the_flags(tmp_path, capsys, flags, ok):
    prefix = make_dataset(tmp_path / "data", [20] * 30, first_id=50)  # ids 50 .. 98
    if ok:
        assert run_tool(prefix, *flags)["problems"] == []
        return
    with pytest.raises(SystemExit) as e:
        run_tool(prefix, *flags)
    assert e.value.code == 1
    message = capsys.readouterr().err
    assert message.startswith("error: ") and ({
        "--vocab-size": "token id 98 is outside --vocab-size of 98 tokens",
        "--tokenizer-type": "token id 98 is outside the NullTokenizer's vocabulary of 98",
        "--code-bits": "token id 98 does not fit --code-bits 6",
        "--seq-length": "gives the valid split 1 of its 30 documents",
    }[flags[0]] in message)


def test_the_tool_checks_ids_against_gpt2_bpe_files(tmp_path, capsys):
    vocab, merges = map(str, gpt2_bpe_files(tmp_path))  # 264 tokens
    flags = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges]
    assert run_tool(make_dataset(tmp_path / "fits", [20] * 30, modulo=264), *flags)[
        "problems"] == []
    with pytest.raises(SystemExit):
        run_tool(make_dataset(tmp_path / "wide", [20] * 30, first_id=250), *flags)
    assert "token id 298 is outside the GPT2BPETokenizer's vocabulary of 264" \
        in capsys.readouterr().err


@pytest.mark.integration
def test_the_tool_starts_without_torch_or_megatron():
    code = ("import sys; from tools import check_data; "
            "print(sorted({'torch', 'megatron'} & {m.split('.')[0] for m in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


# --- epochs of the train data -------------------------------------------------------------------

def test_repeated_train_data_warns_or_refuses_with_the_epochs(cpu_dist, tmp_path, capsys):
    big = make_dataset(tmp_path / "big", [20] * 300)  # 6,000 tokens
    small = make_dataset(tmp_path / "small", [20] * 100)  # 2,000 tokens
    blend = ([big, small], [3.0, 1.0])
    check_train_epochs(blend, None, "100,0,0", 32, 100, None)  # 0.40 and 0.40 epochs
    assert capsys.readouterr().err == ""
    check_train_epochs(blend, None, "100,0,0", 32, 300, None)  # 1.20 and 1.20
    err = capsys.readouterr().err
    assert err.count("WARNING") == 2
    assert f"{small}: its train split would be read 1.20 times by the 300 train samples" in err
    with pytest.raises(DataError, match=r"1\.20 times .* more than --max-data-epochs 1;"):
        check_train_epochs(blend, None, "100,0,0", 32, 300, 1.0)
    check_train_epochs(blend, None, "100,0,0", 32, 300, 1.5)
    assert train_epochs(None, [([small], None), None, None], None, 32, 125) == [(small, 2.0)]

    with pytest.raises(DataError, match="more than --max-data-epochs 1"):  # training refuses
        training_data("--data-path", small, "--split", "100,0,0", "--eval-iters", "0",
                      "--train-iters", "100", "--max-data-epochs", "1")


def test_the_test_split_is_read_where_it_holds_a_sample(cpu_dist, tmp_path):
    """At the end of training the test split is evaluated when the flags give one that holds
    a sample: a --test-data-path, or a test share of --split that does in every file; a
    small dataset's empty test share is skipped with the reason, not refused."""
    from megatron_ext.datasets.gpt_datasets import samples_per_split, test_split
    from megatron_ext.train.setup import check_machine_and_tokenizer
    from pretrain_fixedcode import parse_args
    small = make_dataset(tmp_path / "small", [40] * 30)
    base = [a for a in TINY_RUN if a != "--mock-data"] + ["--train-iters", "2"]
    for flags, read, samples in (
            (["--data-path", small, "--eval-iters", "2"], False, 0),
            (["--data-path", small, "--eval-iters", "2", "--split", "80,10,10"], True, 8),
            (["--data-path", small, "--eval-iters", "0", "--split", "80,10,10"], False, 0),
            (["--train-data-path", small, "--valid-data-path", small, "--eval-iters", "2"],
             False, 0),
            (["--train-data-path", small, "--valid-data-path", small, "--test-data-path",
              small, "--eval-iters", "2"], True, 8)):
        args = parse_args(base + flags)
        assert test_split(args)[0] is read, flags
        assert samples_per_split(args, check_machine_and_tokenizer(args, "cpu")[2])[2] == \
            samples, flags
    assert test_split(parse_args(base + ["--data-path", small, "--eval-iters", "2"]))[1] == (
        f"--data-path {small}: --split 969,30,1 gives the test split 0 of its 30 documents "
        "(0 tokens), fewer than the --seq-length 32 + 1 = 33 tokens of one sample")

