"""Megatron-LM's flags that a recipe of its users carries, each shown by the run it changes:
the checkpoint flags by a resume (--use-checkpoint-args, --no-load-optim, --no-load-rng,
--finetune), the schedule flags by the learning rates and batches a run takes
(--lr-warmup-fraction, --lr-warmup-samples, --lr-decay-samples, --rampup-batch-size, a resume
in the middle of the ramp), the data flags by the batches and losses
(--eod-mask-loss, --reset-position-ids, --reset-attention-mask, --data-args-path,
--per-split-data-args-path), and the README's training example as written."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from conftest import REPO, TINY_MODEL, TINY_RUN, run_pretrain, step_losses
from helpers.indexed_data import training_data
from helpers.saves import rewrite_common
from megatron_ext.checkpoint.loading import load_common
from megatron_ext.runtime.megatron_compat import has_batch_ramp, null_tokenizer_counts

# The base run the checkpoint flags resume: the binary arm with dropout (random numbers to
# restore), warm-up 2 of 8 iterations, saved at 3.
BASE = TINY_RUN + ["--input-interface", "binary", "--hidden-dropout", "0.1",
                   "--norm-epsilon", "1e-6", "--lr-warmup-iters", "2", "--lr-decay-iters", "8"]


def step_lrs(run) -> dict[int, float]:
    return {r["iteration"]: r["learning-rate"] for r in run.metrics if r["kind"] == "train"}


@pytest.fixture(scope="module")
def saved_at_3(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("base") / "ckpt"
    run_pretrain(BASE + ["--train-iters", "3", "--save", ckpt, "--save-interval", "3"])
    return ckpt


@pytest.fixture(scope="module")
def full_resume(saved_at_3, tmp_path_factory):
    """The plain resume to iteration 5, which each flag is compared with."""
    ckpt = tmp_path_factory.mktemp("full") / "ckpt"
    shutil.copytree(saved_at_3, ckpt)
    (ckpt / "metrics.jsonl").unlink()  # the records of the resumed run alone
    return run_pretrain(BASE + ["--train-iters", "5", "--load", ckpt, "--save", ckpt])


def resume(saved_at_3, tmp_path, *flags, model=BASE):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(saved_at_3, ckpt)
    (ckpt / "metrics.jsonl").unlink()
    return run_pretrain(model + ["--train-iters", "5", "--load", ckpt, "--save", ckpt, *flags],
                        check=False)


@pytest.mark.integration
def test_no_load_optim_keeps_the_weights_and_restarts_optimizer_and_schedule(
        saved_at_3, full_resume, tmp_path):
    run = resume(saved_at_3, tmp_path, "--no-load-optim")
    assert run.returncode == 0, run.stderr
    assert "model weights loaded; optimizer and learning-rate scheduler start fresh" in run.stdout
    losses, full = step_losses(run), step_losses(full_resume)
    assert sorted(losses) == [4, 5]  # the iteration count continues
    assert losses[4] == full[4]  # same weights, data and dropout: the same first loss
    assert losses[5] != full[5]  # a fresh Adam took the step
    lr = 3e-3
    # the schedule starts over: step 1 of the warm-up, not step 4 of the decay
    assert step_lrs(run)[4] == pytest.approx(lr / 2)
    assert step_lrs(full_resume)[4] < lr


@pytest.mark.integration
def test_no_load_rng_resumes_everything_but_the_random_numbers(saved_at_3, full_resume,
                                                                tmp_path):
    run = resume(saved_at_3, tmp_path, "--no-load-rng")
    assert run.returncode == 0, run.stderr
    assert "random-number states not loaded from" in run.stdout
    assert step_lrs(run) == step_lrs(full_resume)  # the schedule resumed
    assert step_losses(run)[4] != step_losses(full_resume)[4]  # other dropout masks


@pytest.mark.integration
def test_use_checkpoint_args_takes_the_model_flags_from_the_checkpoint(saved_at_3,
                                                                       full_resume, tmp_path):
    # No shape, no arm, no dropout on the command line: all of them from the checkpoint.
    rest = BASE[len(TINY_MODEL):]
    for flag in ("--input-interface", "--hidden-dropout", "--norm-epsilon"):
        i = rest.index(flag)
        rest = rest[:i] + rest[i + 2:]
    without = resume(saved_at_3, tmp_path / "without", model=rest)
    assert without.returncode == 1 and "--num-layers is required" in without.stderr
    run = resume(saved_at_3, tmp_path / "with", "--use-checkpoint-args", model=rest)
    assert run.returncode == 0, run.stderr
    assert re.search(r"--use-checkpoint-args: from .*iter_0000003: --num-layers 2, "
                     r"--hidden-size 64, ", run.stdout)
    assert "--input-interface binary" in run.stdout and "--hidden-dropout 0.1" in run.stdout
    assert "--norm-epsilon 1e-06" in run.stdout
    assert step_losses(run) == step_losses(full_resume)


@pytest.mark.integration
def test_finetune_loads_the_weights_only_and_a_requeue_continues_it(saved_at_3, tmp_path):
    tuned = tmp_path / "tuned"
    flags = BASE + ["--train-iters", "3", "--load", saved_at_3, "--save", tuned,
                    "--save-interval", "2", "--finetune"]
    first = run_pretrain(flags + ["--exit-interval", "2"])
    assert "--finetune: model weights from" in first.stdout
    assert sorted(step_losses(first)) == [1, 2]  # iteration 0, a fresh schedule
    assert step_lrs(first)[1] == pytest.approx(3e-3 / 2)
    fresh = run_pretrain(BASE + ["--train-iters", "1"])  # the same first batch, untrained
    assert step_losses(first)[1] < step_losses(fresh)[1]  # trained weights
    saved = load_common(str(tuned), 2)[1]
    assert saved["consumed_train_samples"] == 8  # the data read from its start
    requeued = run_pretrain(flags)  # its own save resumes whole, not the pretrained one
    assert f"--save {tuned} holds iteration 2: resuming from it" in requeued.stdout
    assert f"resumed from {tuned}/iter_0000002 at iteration 2" in requeued.stdout
    assert sorted(step_losses(requeued)) == [1, 2, 3]  # its metrics file: 3 appended once


@pytest.mark.integration
def test_warmup_fraction_and_sample_counts_give_megatron_lms_schedule():
    """--lr-warmup-fraction is a share of the decay; --lr-warmup-samples and
    --lr-decay-samples count samples: the same schedules as in iterations (4 samples each)."""
    iters = step_lrs(run_pretrain(TINY_RUN + ["--train-iters", "4", "--lr-warmup-iters", "2",
                                              "--lr-decay-iters", "4"]))
    fraction = step_lrs(run_pretrain(TINY_RUN + ["--train-iters", "4",
                                                 "--lr-warmup-fraction", "0.5"]))
    samples = step_lrs(run_pretrain(TINY_RUN + ["--train-samples", "16",
                                                "--lr-warmup-samples", "8",
                                                "--lr-decay-samples", "16"]))
    lr = 3e-3
    assert iters[1] == pytest.approx(lr / 2) and iters[2] == pytest.approx(lr)
    assert fraction == pytest.approx(iters) and samples == pytest.approx(iters)
    longer = step_lrs(run_pretrain(TINY_RUN + ["--train-samples", "16",
                                               "--lr-decay-samples", "32"]))
    assert longer[4] > samples[4]  # half-way through a longer decay


RAMP = TINY_RUN[:TINY_RUN.index("--global-batch-size")] + TINY_RUN[
    TINY_RUN.index("--global-batch-size") + 2:] + [
    "--global-batch-size", "8", "--train-samples", "40", "--rampup-batch-size", "4", "4", "8"]


@pytest.mark.integration
@pytest.mark.skipif(not has_batch_ramp(), reason="megatron-core 0.18.0 removed the batch ramp: "
                    "tests/unit/test_megatron_flags.py pins its refusal")
def test_rampup_batch_size_grows_the_batch_and_resumes_mid_ramp_exactly(tmp_path):
    straight = run_pretrain(RAMP)
    consumed = [r["consumed_samples"] for r in straight.metrics if r["kind"] == "train"]
    # Megatron-Core's ramp: 4 until 8 samples are consumed, then 8; 40 samples in 6 updates
    assert consumed == [4, 8, 16, 24, 32, 40]
    assert "global batch size:     4" in straight.stdout
    assert "global batch size:     8" in straight.stdout
    ckpt = tmp_path / "ckpt"
    run_pretrain(RAMP + ["--save", ckpt, "--save-interval", "1", "--exit-interval", "1"])
    resumed = run_pretrain(RAMP + ["--save", ckpt, "--load", ckpt])
    assert f"resumed from {ckpt}/iter_0000001 at iteration 1" in resumed.stdout
    # its metrics file: iteration 1 before the exit, 2-6 after the resume
    assert step_losses(resumed) == step_losses(straight)
    assert step_lrs(resumed) == step_lrs(straight)
    assert [r["consumed_samples"] for r in resumed.metrics if r["kind"] == "train"] == consumed


# TINY_RUN's NullTokenizer --vocab-size 511: EOD 511 (ids 0..510) before megatron-core 0.18.0,
# 510 from it (ids 0..509).
EOD = null_tokenizer_counts(511)[1]


def documents(prefix, lengths) -> str:
    """An indexed dataset of documents of ``lengths`` tokens, each ending in EOD."""
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for i, length in enumerate(lengths):
        ids = torch.cat([(i + torch.arange(length - 1)) % EOD, torch.tensor([EOD])])
        builder.add_document(ids, [length])
    builder.finalize(f"{prefix}.idx")
    return str(prefix)


@pytest.fixture(scope="module")
def short_documents(tmp_path_factory) -> str:
    return documents(tmp_path_factory.mktemp("docs") / "docs", [5, 9, 7, 12] * 40)


@pytest.mark.integration
def test_the_data_flags_build_megatrons_masks(cpu_dist, short_documents):
    plain = next(training_data("--data-path", short_documents)[0])
    assert "attention_mask" not in plain and bool((plain["loss_mask"] == 1).all())
    batch = next(training_data("--data-path", short_documents, "--eod-mask-loss",
                               "--reset-position-ids", "--reset-attention-mask")[0])
    tokens, positions, mask = batch["tokens"], batch["position_ids"], batch["attention_mask"]
    assert bool((tokens == EOD).any())
    assert torch.equal(batch["loss_mask"] == 0, tokens == EOD)
    for row in range(tokens.shape[0]):
        ends = (tokens[row] == EOD).nonzero().flatten().tolist()
        starts = [0] + [e + 1 for e in ends if e + 1 < tokens.shape[1]]
        for start, end in zip(starts, starts[1:] + [tokens.shape[1]]):
            assert positions[row, start:end].tolist() == list(range(end - start))
            allowed = ~mask[row, 0, start:end]  # True where a token may attend
            assert bool(allowed[:, start:end].equal(torch.ones(end - start, end - start,
                                                               dtype=torch.bool).tril()))
            assert not bool(allowed[:, :start].any())  # nothing of the earlier documents


@pytest.mark.integration
def test_documents_kept_apart_by_sdpa_and_by_megatrons_attention_alike(short_documents,
                                                                       monkeypatch):
    # GPTModel sets NVTE_*_ATTN for its attention backend and refuses another backend's
    # values: a model built earlier in this process (outside a run) may have left them
    for name in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN"):
        monkeypatch.delenv(name, raising=False)
    data = [a for a in TINY_RUN if a != "--mock-data"] + [
        "--data-path", short_documents, "--train-iters", "2"]
    causal = step_losses(run_pretrain(data))
    sdpa = step_losses(run_pretrain(data + ["--reset-attention-mask"]))
    unfused = step_losses(run_pretrain(data + ["--reset-attention-mask",
                                               "--attention-backend", "unfused"]))
    assert sdpa == pytest.approx(unfused, rel=1e-5)
    assert sdpa[1] != pytest.approx(causal[1], rel=1e-5)  # the mask reached the attention
    refused = run_pretrain(data + ["--reset-attention-mask", "--attention-backend", "flash"],
                           check=False)
    assert refused.returncode == 1 and "flash kernel, which takes no mask" in refused.stderr


@pytest.mark.integration
def test_data_args_files_give_the_data_path_flags_values(cpu_dist, short_documents, tmp_path):
    (tmp_path / "blend.txt").write_text(f"0.5 {short_documents}\n0.5 {short_documents}\n")
    from_file = training_data("--data-args-path", tmp_path / "blend.txt")
    given = training_data("--data-path", "0.5", short_documents, "0.5", short_documents)
    assert torch.equal(next(from_file[0])["tokens"], next(given[0])["tokens"])
    (tmp_path / "splits.json").write_text(json.dumps(
        {"train": short_documents, "valid": [short_documents], "test": ""}))
    per_split = training_data("--per-split-data-args-path", tmp_path / "splits.json")
    given = training_data("--train-data-path", short_documents, "--valid-data-path",
                          short_documents)
    assert torch.equal(next(per_split[0])["tokens"], next(given[0])["tokens"])
    (tmp_path / "bad.json").write_text(json.dumps({"train": short_documents}))
    with pytest.raises(ValueError, match=r"--per-split-data-args-path .*bad.json: expected a "
                                         r"JSON object with train, valid and test keys"):
        training_data("--per-split-data-args-path", tmp_path / "bad.json")


@pytest.mark.integration
def test_the_readme_training_example_runs_as_written():
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index("# A tiny run on CPU, no data files needed:"):]
    command = block[:block.index("```")].split("\n", 1)[1].replace("\\\n", " ").split()
    assert command[:2] == [".venv/bin/python", "pretrain_fixedcode.py"]
    run = run_pretrain(command[2:] + ["--train-iters", "2"])  # the last --train-iters wins
    assert "training done: iteration 2" in run.stdout


@pytest.mark.integration
def test_a_checkpoint_whose_scheduler_counted_updates_resumes_its_schedule(
        saved_at_3, full_resume, tmp_path):
    """Before format 3 the scheduler counted updates, not samples: converted on resume."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(saved_at_3, ckpt)
    (ckpt / "metrics.jsonl").unlink()
    assert load_common(str(ckpt), 3)[1]["scheduler"]["num_steps"] == 12  # 3 updates of 4
    rewrite_common(ckpt, 3, lambda saved: {**saved, "checkpoint_format": 2,
                                           "scheduler": {**saved["scheduler"], "num_steps": 3}})
    run = run_pretrain(BASE + ["--train-iters", "5", "--load", ckpt, "--save", ckpt])
    assert step_lrs(run) == step_lrs(full_resume)


@pytest.mark.integration
def test_spiky_losses_are_flagged_as_megatron_defines_them_and_acted_on(tmp_path):
    spiky = TINY_RUN + ["--train-iters", "4", "--check-for-spiky-loss",
                        "--spiky-loss-samples", "2"]
    # No signal: at Megatron-LM's factor 10 nothing is a spike, and nothing changes.
    reference = run_pretrain(spiky)
    losses = step_losses(reference)
    assert "spiky loss" not in reference.stdout
    assert losses == step_losses(run_pretrain(TINY_RUN + ["--train-iters", "4"]))
    # A known signal: a factor that puts iteration 3's loss at the threshold.
    factor = ["--spiky-loss-factor", repr(losses[3] / max(losses[1], losses[2]) * (1 - 1e-9))]
    logged = run_pretrain(spiky + factor)
    assert "iteration 3: spiky loss" in logged.stdout and "update applied" in logged.stdout
    assert step_losses(logged) == losses
    skipped = run_pretrain(spiky + factor + ["--spiky-loss-action", "skip"])
    assert "iteration 3: spiky loss" in skipped.stdout
    assert step_losses(skipped)[3] == losses[3] and step_losses(skipped)[4] != losses[4]
    ckpt = tmp_path / "ckpt"
    stopped = run_pretrain(spiky + factor + ["--spiky-loss-action", "stop", "--save", ckpt])
    assert "spiky loss at iteration 3 (--spiky-loss-action stop): exiting at iteration 3" \
        in stopped.stdout
    resumed = run_pretrain(TINY_RUN + ["--train-iters", "4", "--save", ckpt, "--load", ckpt])
    # saved without the spiky update, past its batch: as the skipping run went on
    assert step_losses(resumed)[4] == step_losses(skipped)[4]
