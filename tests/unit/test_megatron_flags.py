"""Megatron-LM's flags without a training: the batch ramp against Megatron-Core's (refused
where the installed release has none), the
refusals of flags that do not go together (each naming them), and our defaults that differ
from Megatron-LM's against the parser and docs/training.md."""

from __future__ import annotations

import re

import pytest

from conftest import REPO, TINY_RUN
from helpers.gpt2_bpe import gpt2_bpe_files
from megatron_ext.config.megatron_defaults import (DIFFERING_DEFAULTS, defaults_in_force,
                                                  flag_text, query_groups_line)
from megatron_ext.config.schedule import BatchRamp, ramped_train_iters
from megatron_ext.config.model_config import document_mask_refusal
from megatron_ext.runtime.errors import FixedcodeError, FlagError
from megatron_ext.runtime.megatron_compat import (has_batch_ramp, installed_release,
                                                  megatron_core_batch_ramp)
from megatron_ext.checkpoint.resume import resolve_checkpoint
from megatron_ext.train.setup import check_machine_and_tokenizer
from pretrain_fixedcode import parse_args


# megatron-core 0.18.0 removed the batch-size ramp (and Megatron-LM --rampup-batch-size).
with_ramp = pytest.mark.skipif(not has_batch_ramp(), reason="the installed megatron-core has "
                               "no batch ramp: test_a_ramp_is_refused_without_megatron_cores")


@with_ramp
@pytest.mark.parametrize("start,increment,samples,global_batch", [
    (4, 4, 8, 8), (8, 8, 1000, 64), (16, 16, 333, 128), (8, 24, 100, 80)])
def test_the_batch_ramp_is_megatron_cores(start, increment, samples, global_batch):
    core = megatron_core_batch_ramp(global_batch, 2, 2, [start, increment, samples])
    ramp = BatchRamp(global_batch, 4, [start, increment, samples])
    consumed = iterations = 0
    while consumed <= samples + 3 * global_batch:
        core.update(consumed, consistency_check=True)
        assert ramp.batch_size(consumed) == core.get_current_global_batch_size(), consumed
        assert ramp.num_microbatches(consumed) == core.get()
        consumed += ramp.batch_size(consumed)
        iterations += 1
    # Megatron-LM's update_train_iters: the ramp's updates, then whole full batches
    total = consumed + 5 * global_batch + 3
    assert ramped_train_iters(ramp, total) == iterations + 5


@pytest.mark.skipif(has_batch_ramp(), reason="the installed megatron-core has the batch ramp")
def test_a_ramp_is_refused_without_megatron_cores():
    with pytest.raises(FlagError, match=re.escape(
            f"--rampup-batch-size 4 4 8: the installed megatron-core {installed_release()} has "
            f"no batch-size ramp (0.18.0 removed it")):
        BatchRamp(8, 4, [4, 4, 8])
    assert BatchRamp(8, 4).batch_size(100) == 8  # a constant batch is what remains


@pytest.mark.parametrize("flags,message", [
    (["--train-iters", "4", "--lr-warmup-samples", "8"],
     "--lr-warmup-samples count samples: use them with --train-samples, not --train-iters"),
    (["--train-iters", "4", "--rampup-batch-size", "2", "2", "8"],
     "--rampup-batch-size count samples: use them with --train-samples"),
    (["--train-iters", "4", "--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "1"],
     "give one of --lr-warmup-fraction, --lr-warmup-iters and --lr-warmup-samples"),
    (["--train-iters", "4", "--lr-warmup-fraction", "1.5"],
     "--lr-warmup-fraction 1.5 is outside [0, 1]"),
    (["--train-samples", "16", "--lr-decay-iters", "4", "--lr-decay-samples", "16"],
     "give one of --lr-decay-iters and --lr-decay-samples"),
    (["--train-samples", "16", "--rampup-batch-size", "2", "2", "8", "--lr-warmup-iters", "1"],
     "--lr-warmup-iters: under --rampup-batch-size an iteration has no fixed size"),
    pytest.param(["--train-samples", "16", "--rampup-batch-size", "2", "3", "8"],
     "--global-batch-size 4 - START must be a non-negative multiple of INCREMENT",
                 marks=with_ramp),
    pytest.param(["--train-samples", "16", "--rampup-batch-size", "1", "1", "8"],
                 "--rampup-batch-size START 1 is not a multiple of --micro-batch-size x "
                 "data-parallel size 2", marks=with_ramp),
    (["--train-iters", "2", "--finetune"], "--finetune needs --load"),
    (["--train-iters", "2", "--no-load-optim"], "--no-load-optim needs --load"),
    (["--train-iters", "2", "--no-load-rng"], "--no-load-rng needs --load"),
    (["--train-iters", "2", "--finetune", "--load", "/nonexistent/base"],
     "--finetune: --load /nonexistent/base holds no checkpoint (no "
     "latest_checkpointed_iteration.txt); without one the run would start from a random"),
    (["--train-iters", "2", "--no-load-optim", "--no-load-rng", "--load", "/nonexistent/base"],
     "--no-load-optim --no-load-rng: --load /nonexistent/base holds no checkpoint"),
    (["--train-iters", "2", "--data-path", "/nonexistent/corpus"],
     "give either --data-path or --mock-data, not both: --mock-data trains on synthetic"),
    (["--train-iters", "2", "--valid-data-path", "/nonexistent/corpus"],
     "give either --valid-data-path or --mock-data, not both"),
    (["--train-iters", "2", "--reset-attention-mask", "--attention-backend", "flash"],
     "--attention-backend flash runs the flash kernel, which takes no mask"),
    (["--train-iters", "2", "--data-args-path", "/nonexistent/blend.txt"],
     "give either --data-args-path /nonexistent/blend.txt or --mock-data, not both"),
])
def test_flags_that_do_not_go_together_are_named(cpu_dist, flags, message):
    from megatron_ext.datasets.gpt_datasets import data_paths
    with pytest.raises(FixedcodeError, match=re.escape(message)):
        args = parse_args(TINY_RUN + flags)
        resolve_checkpoint(*check_machine_and_tokenizer(args, "cpu")[1:])
        data_paths(args.data)


@pytest.mark.parametrize("shape,swiglu,ffn", [
    (["--hidden-size", "4096", "--num-attention-heads", "32"], "--swiglu", 10880),
    (["--hidden-size", "512", "--num-attention-heads", "8"], "--swiglu", 1344),
    (["--hidden-size", "512", "--num-attention-heads", "8"], "--no-swiglu", 2048)])
def test_the_default_mlp_width_is_megatron_lms(shape, swiglu, ffn):
    """Megatron-LM's validate_args: 4 x hidden, or under SwiGLU 2/3 of it in multiples of 64
    (it was 4 x hidden here, a 1.5x larger MLP than a Megatron-LM script builds)."""
    model = TINY_RUN[:2] + TINY_RUN[8:] + shape + [swiglu, "--train-iters", "2"]
    assert parse_args(model).model.ffn_hidden_size == ffn
    if swiglu == "--swiglu":
        with pytest.raises(FixedcodeError, match="give --ffn-hidden-size"):
            parse_args(model + ["--hidden-size", "16", "--num-attention-heads", "2"])


def test_train_samples_run_whole_batches_as_megatron_lm(cpu_dist):
    """--train-samples 10 at a global batch of 4 is 2 iterations (Megatron-LM's
    update_train_iters; it was rounded up to 3 here), and less than one batch is refused."""
    for samples, iterations in (("10", 2), ("12", 3)):
        args = parse_args(TINY_RUN + ["--train-samples", samples])
        assert check_machine_and_tokenizer(args, "cpu")[2].train_iters == iterations
    with pytest.raises(FixedcodeError, match="--train-samples 3 is not one batch of "
                                             "--global-batch-size 4"):
        check_machine_and_tokenizer(parse_args(TINY_RUN + ["--train-samples", "3"]), "cpu")


def test_megatron_lm_flags_that_ask_for_what_is_done_anyway_are_taken(cpu_dist):
    """Megatron-LM scripts pass these at the values that ask for what fixedcode builds (the
    Llama 3 8B example: --kv-channels 128 at 4096 / 32 heads, --context-parallel-size 1, ...):
    taken; another value is refused, naming the one taken."""
    noop = ["--context-parallel-size", "1", "--dataloader-type", "single", "--rotary-percent",
            "1.0", "--kv-channels", "16", "--log-throughput", "--use-mcore-models",
            "--no-create-attention-mask-in-dataloader", "--ddp-bucket-size", "1000"]
    plain = parse_args(TINY_RUN + ["--train-iters", "2"])
    taken = parse_args(TINY_RUN + ["--train-iters", "2"] + noop)
    assert {k: v for k, v in taken.record().items() if plain.record().get(k) != v} == {
        "kv_channels": 16, "ddp_bucket_size": 1000}
    check_machine_and_tokenizer(taken, "cpu")
    for flags, message in ((["--context-parallel-size", "2"], "(it is taken as 1 only)"),
                           (["--rotary-percent", "0.5"], "partial rotary embeddings"),
                           (["--kv-channels", "32"], "--kv-channels 32: the head width here "
                                                     "is --hidden-size / --num-attention-heads "
                                                     "= 16")):
        with pytest.raises(FixedcodeError, match=re.escape(message)):
            parse_args(TINY_RUN + ["--train-iters", "2"] + flags)


def test_query_groups_without_the_gqa_switch_are_said_at_start_up():
    """Megatron-LM reads --num-query-groups only under --group-query-attention; here the
    number alone builds GQA, which the start-up log says."""
    flags = TINY_RUN + ["--train-iters", "2", "--num-query-groups", "2"]
    assert "--num-query-groups 2 without --group-query-attention: grouped-query attention " \
           "with 2 groups (Megatron-LM would build full multi-head" in query_groups_line(
               parse_args(flags).model)
    assert query_groups_line(parse_args(flags + ["--group-query-attention"]).model) is None
    assert query_groups_line(parse_args(TINY_RUN + ["--train-iters", "2"]).model) is None


def test_use_checkpoint_args_needs_load():
    with pytest.raises(FixedcodeError, match="--use-checkpoint-args needs --load"):
        parse_args(TINY_RUN + ["--train-iters", "2", "--use-checkpoint-args"])


def test_a_first_launch_that_resumes_its_own_saves_starts_anew(cpu_dist, tmp_path, capsys):
    """--no-load-optim --no-load-rng with --load = --save, still empty (Megatron-LM's Mixtral
    script at its first launch) starts from scratch as in Megatron-LM; --finetune of nothing
    is still refused."""
    flags = TINY_RUN + ["--train-iters", "2", "--load", str(tmp_path), "--save", str(tmp_path)]
    args = parse_args(flags + ["--no-load-optim", "--no-load-rng"])
    resume = resolve_checkpoint(*check_machine_and_tokenizer(args, "cpu")[1:])
    assert (resume.path, resume.common, resume.own) == (None, None, False)
    assert (f"--load {tmp_path} holds no checkpoint yet: starting from a random initialisation "
            "(--no-load-optim --no-load-rng apply when it resumes its saves)"
            in capsys.readouterr().out)
    args = parse_args(flags + ["--finetune"])
    with pytest.raises(FixedcodeError, match="--finetune: --load .* holds no checkpoint"):
        resolve_checkpoint(*check_machine_and_tokenizer(args, "cpu")[1:])


def test_finetuning_into_the_checkpoints_own_directory_is_refused(cpu_dist, tmp_path):
    (tmp_path / "iter_0000004").mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("4")
    args = parse_args(TINY_RUN + ["--train-iters", "2", "--finetune", "--load", str(tmp_path),
                                  "--save", str(tmp_path)])
    with pytest.raises(FixedcodeError, match="save the fine-tuning to another directory"):
        resolve_checkpoint(*check_machine_and_tokenizer(args, "cpu")[1:])


def test_document_masks_are_refused_where_the_attention_would_ignore_them():
    assert document_mask_refusal("local", "auto", "cuda", True, 1) is None
    assert document_mask_refusal("local", "unfused", "cpu", True, 2) is None
    assert document_mask_refusal("local", "unfused", "cuda", False, 1) is None
    assert "Transformer Engine" in document_mask_refusal("transformer_engine", "auto", "cuda",
                                                         True, 1)
    assert "--no-masked-softmax-fusion" in document_mask_refusal("local", "unfused", "cuda",
                                                                 True, 1)
    assert "middle stages" in document_mask_refusal("local", "auto", "cpu", True, 4)


def test_the_differing_defaults_are_the_parsers_and_the_docs_table_lists_them():
    args = parse_args(TINY_RUN[:-4] + ["--train-iters", "2"])  # without --eval-iters etc.
    parsed = (parse_args(["--num-layers", "1", "--hidden-size", "8", "--ffn-hidden-size",
                              "16", "--num-attention-heads", "1", "--seq-length", "8",
                              "--train-iters", "1", "--vocab-size", "8", "--mock-data"]).record())
    table = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    for dest, (ours, megatron, _) in DIFFERING_DEFAULTS.items():
        assert parsed[dest] == ours != megatron, dest
        assert f"| `{flag_text(dest, ours)}` |" in table, dest
    assert "--lr 0.003" not in " ".join(defaults_in_force(args))  # TINY_RUN's own --lr
    assert "--adam-beta2 0.95 (Megatron-LM: Adam beta2 0.999)" in defaults_in_force(args)


# Our defaults that are not Megatron-LM's but chosen per machine at start-up (docs/training.md,
# docs/gpu.md), or spelled otherwise for the same behaviour.
CHOSEN_AT_START = {
    "transformer_impl": "None: Transformer Engine where it imports, local layers otherwise",
    "cross_entropy_loss_fusion": "None: fused on a GPU under --bf16, unfused otherwise",
    "num_query_groups": "None: one group per head, as Megatron-LM's 1 without "
                        "--group-query-attention",
}
MEGATRON_LM_DEFAULTS = REPO / "tests" / "data" / "megatron_lm_core_v0.16.1_defaults.json"


def test_every_flag_megatron_lm_has_takes_its_default_unless_documented():
    """A default of ours that drifts from Megatron-LM core_v0.16.1's (its parser's, recorded
    by tests/helpers/megatron_lm_defaults.py) changes a user's run without a word: each one
    must be a listed differing default (said at start-up) or chosen at start-up."""
    import argparse
    import json
    from megatron_ext.config.arguments import add_training_args, build_parser
    megatron = json.loads(MEGATRON_LM_DEFAULTS.read_text())
    parser = build_parser("")
    add_training_args(parser)
    differ = {}
    for action in parser._actions:
        if action.dest in megatron and action.default is not argparse.SUPPRESS:
            theirs = megatron[action.dest]
            if action.default != theirs and (action.default, theirs) != (False, None):
                differ[action.dest] = (action.default, theirs)
    assert len([d for d in megatron if d in parse_args(TINY_RUN[:-4] + [
        "--train-iters", "2"]).record()]) > 100  # the snapshot covers what we take
    assert {d for d in differ if d not in DIFFERING_DEFAULTS} == set(CHOSEN_AT_START), differ


@pytest.fixture
def gpt2_files(tmp_path):
    return gpt2_bpe_files(tmp_path)


def test_gpt2_bpe_files_give_gpt2s_ids_and_size_the_model(cpu_dist, gpt2_files):
    import json
    from megatron_ext.datasets.tokenizer import build_tokenizer
    vocab, merges = map(str, gpt2_files)
    ours = build_tokenizer("GPT2BPETokenizer", vocab_file=vocab, merge_file=merges)
    ids = json.loads(gpt2_files[0].read_text())
    # GPT-2's pre-tokenization ("the", " cat", " in", " the", " hat"), then the merges in
    # rank order: " hat" has none, " in" only "in"
    expected = ["the", "Ġcat", "Ġ", "in", "Ġthe", "Ġ", "h", "a", "t"]
    assert ours.tokenize("the cat in the hat") == [ids[t] for t in expected]
    text = "the cat in the hat, then 42 cats!\n  The end. <|endoftext|>"
    assert ours.detokenize(ours.tokenize(text)) == text
    assert ids["<|endoftext|>"] not in ours.tokenize(text)  # not matched in texts
    assert (ours.vocab_size, ours.eod) == (264, 263)
    null = TINY_RUN.index("--tokenizer-type")  # TINY_RUN's NullTokenizer and its size
    args = parse_args(TINY_RUN[:null] + TINY_RUN[null + 4:] + [
        "--train-iters", "2", "--tokenizer-type", "GPT2BPETokenizer",
        "--vocab-file", vocab, "--merge-file", merges])
    derived = check_machine_and_tokenizer(args, "cpu")[2]
    assert derived.padded_vocab_size == 384  # 264 padded to a multiple of 128
    with pytest.raises(FixedcodeError, match="needs --vocab-file and --merge-file"):
        build_tokenizer("GPT2BPETokenizer", vocab_file=vocab)
    # Megatron-LM's GPT-3 example gives the files without a type: not the default NullTokenizer
    with pytest.raises(FixedcodeError, match="--vocab-file and --merge-file are "
                                             "GPT2BPETokenizer's, not --tokenizer-type "
                                             "NullTokenizer's"):
        check_machine_and_tokenizer(parse_args(TINY_RUN + ["--train-iters", "2", "--vocab-file",
                                                           vocab, "--merge-file", merges]), "cpu")


def test_docs_training_lists_every_flag_accepted_and_refused():
    from megatron_ext.config.arguments import REFUSED_FLAGS, add_training_args, build_parser
    parser = build_parser("")
    add_training_args(parser)
    table = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    for action in parser._actions:
        flag = action.option_strings[0]  # Megatron-LM's spelling where there are several
        if flag != "-h":
            assert f"`{flag}" in table, flag
    for flag, why in REFUSED_FLAGS.items():
        assert f"| `{flag}` | {why} |" in table
    with pytest.raises(FixedcodeError, match=re.escape(
            "--context-parallel-size (Megatron-LM's) is not supported: context parallelism")):
        parse_args(TINY_RUN + ["--train-iters", "2", "--context-parallel-size", "2"])
