"""The training entry point, pretrain_fixedcode.py, on CPU: learning, exact resume, exits,
atomic checkpoints and clear errors."""

from __future__ import annotations

import json
import re
import shutil
import signal

import pytest

from conftest import (PP2_RUN, TIMING, TINY_RUN, run_pretrain, run_pretrain_series,
                      step_losses, valid_losses)
from helpers.megatron_log import final_lines, training_lines, validation_lines
from helpers.signals import signal_run
from megatron_ext.runtime.megatron_compat import null_tokenizer_counts
from megatron_ext.checkpoint.compatibility import reconcile_schedule
from megatron_ext.config.derived import derive
from megatron_ext.checkpoint.resume import resolve_checkpoint
from megatron_ext.train.setup import check_machine_and_tokenizer
from megatron_ext.runtime.errors import CheckpointError, FixedcodeError, FlagError
from pretrain_fixedcode import parse_args

MARKER = "latest_checkpointed_iteration.txt"


@pytest.mark.integration
@pytest.mark.parametrize("arm", ["learned", "binary", "gf2"])
def test_a_few_steps_lower_the_loss(tmp_path, arm):
    run = run_pretrain(TINY_RUN + ["--input-interface", arm, "--train-iters", "30"])
    losses = step_losses(run)
    assert sorted(losses) == list(range(1, 31))
    first, last = losses[1], losses[30]
    assert last < first - 0.5, f"{arm}: loss {first} -> {last}"
    assert f"[fixedcode] training done: iteration 30 | final train loss {last:.6f}" in run.stdout


@pytest.mark.integration
def test_the_log_reads_as_megatron_lms():
    """A run's stdout, read by the regular expressions written from Megatron-LM's source:
    a line per iteration and per --eval-interval validation, and at the end of training the
    validation and test set's (the test split was never read before), with the metrics
    file's values."""
    run = run_pretrain(TINY_RUN + ["--train-iters", "3", "--eval-iters", "1",
                                   "--eval-interval", "2"])
    train = {r["iteration"]: r for r in run.metrics if r["kind"] == "train"}
    valid = {r["iteration"]: r for r in run.metrics if r["kind"] == "valid"}
    lines = training_lines(run.stdout)
    assert [int(m["iteration"]) for m in lines] == sorted(train) == [1, 2, 3]
    for m in lines:
        record = train[int(m["iteration"])]
        assert int(m["train_iters"]) == 3 and int(m["global_batch_size"]) == 4
        assert int(m["consumed_samples"]) == record["consumed_samples"]
        assert float(m["lm_loss"]) == pytest.approx(record["lm loss"], rel=1e-6)
        assert float(m["learning_rate"]) == pytest.approx(record["learning-rate"], rel=1e-6)
        assert (int(m["skipped"]), int(m["nan"])) == (0, 0)
    checks = validation_lines(run.stdout)
    assert [int(m["iteration"]) for m in checks] == [2] and sorted(valid) == [2, 3]
    final = final_lines(run.stdout)
    assert [(int(m["iteration"]), m["split"]) for m in final] == [(3, "validation"), (3, "test")]
    test = [r for r in run.metrics if r["kind"] == "test"]
    for m, value in ((checks[0], valid[2]["lm loss validation"]),
                     (final[0], valid[3]["lm loss validation"]),
                     (final[1], test[0]["lm loss test"])):
        assert float(m["lm_loss"]) == pytest.approx(value, rel=1e-6)
    assert test[0]["lm loss test"] != valid[3]["lm loss validation"]  # another split's tokens
    assert f"| test loss {test[0]['lm loss test']:.6f}" in run.stdout


@pytest.mark.integration
def test_the_line_shows_the_first_iteration_and_the_logged_iterations_grad_norm():
    """As Megatron-LM's: the run's first iteration prints a line (its interval goes on), and
    `grad norm` is the logged iteration's own, not the interval's mean (as it was here)."""
    every = run_pretrain(TINY_RUN + ["--train-iters", "4"])  # --log-interval 1
    sparse = run_pretrain(TINY_RUN + ["--train-iters", "4", "--log-interval", "3"])
    lines = {int(m["iteration"]): m for m in training_lines(sparse.stdout)}
    assert sorted(lines) == [1, 3, 4]
    norms = {int(m["iteration"]): float(m["grad_norm"]) for m in training_lines(every.stdout)}
    assert {i: float(m["grad_norm"]) for i, m in lines.items()} == {i: norms[i] for i in lines}
    assert norms[3] != pytest.approx(sum(norms[i] for i in (1, 2, 3)) / 3, abs=1e-3)
    assert [r["iteration"] for r in sparse.metrics if r["kind"] == "train"] == [3, 4]
    loss = {int(m["iteration"]): float(m["lm_loss"]) for m in training_lines(every.stdout)}
    assert float(lines[3]["lm_loss"]) == pytest.approx(sum(loss[i] for i in (1, 2, 3)) / 3,
                                                       rel=1e-5)  # the mean, first included


@pytest.mark.integration
def test_the_run_says_whether_it_was_done_or_stopped(tmp_path):
    """Both exit 0; the status file the batch script names tells them apart."""
    from megatron_ext.train.run_status import STATUS_ENV
    status = tmp_path / "status"
    run_pretrain(TINY_RUN + ["--train-iters", "2"], env={STATUS_ENV: str(status)})
    assert status.read_text() == "done at iteration 2\n"
    stopped = run_pretrain(TINY_RUN + ["--train-iters", "2", "--exit-interval", "1"],
                           env={STATUS_ENV: str(status)})
    assert stopped.returncode == 0
    assert status.read_text() == "stopped at iteration 1: --exit-interval 1 reached\n"


@pytest.mark.integration
def test_an_in_process_run_is_the_subprocess_run(tmp_path):
    """The tests' in-process harness (conftest.run_pretrain) trains as the entry point's
    own process does: the same losses, metrics and log, run after run in one process."""
    run = TINY_RUN + ["--input-interface", "binary", "--train-iters", "4", "--eval-iters", "1",
                      "--eval-interval", "2", "--exit-signal-handler"]
    handler = signal.getsignal(signal.SIGTERM)
    alone = run_pretrain(run, in_process=False)
    first, again = run_pretrain(run, in_process=True), run_pretrain(run, in_process=True)
    assert len(step_losses(alone)) == 4 and len(valid_losses(alone)) == 2
    for run in (first, again):
        assert step_losses(run) == step_losses(alone)
        assert valid_losses(run) == valid_losses(alone)
        assert run.stdout.splitlines()[-1] == alone.stdout.splitlines()[-1]
    failed = run_pretrain(TINY_RUN + ["--train-iters", "1", "--input-interface", "binary",
                                      "--code-bits", "8"], in_process=True, check=False)
    assert failed.returncode == 1 and "does not fit a 8-bit code" in failed.stderr
    assert signal.getsignal(signal.SIGTERM) is handler  # --exit-signal-handler's did not stay


@pytest.mark.integration
def test_resume_gives_the_same_per_step_losses(tmp_path):
    run = TINY_RUN + ["--input-interface", "gf2", "--train-iters", "8", "--lr-warmup-iters", "2",
                      "--eval-iters", "1", "--eval-interval", "4"]
    straight = run_pretrain(run)
    ckpt = tmp_path / "ckpt"
    # The interrupted run logs iterations 1-5 to --save's metrics file, but saves at 4.
    first = run_pretrain(run + ["--save", ckpt, "--load", ckpt, "--save-interval", "4",
                                "--exit-interval", "5"])
    assert "--exit-interval 5 reached: exiting at iteration 5" in first.stdout
    assert sorted(step_losses(first)) == [1, 2, 3, 4, 5]
    (ckpt / MARKER).write_text("4")  # as if preempted between the two saves
    second = run_pretrain(run + ["--save", ckpt, "--load", ckpt])
    assert f"[fixedcode] resumed from {ckpt}/iter_0000004 at iteration 4" in second.stdout
    # The metrics file holds each iteration once, at full precision, equal to the
    # uninterrupted run's: training and validation.
    assert [(r["kind"], r["iteration"]) for r in second.metrics] == \
        [(r["kind"], r["iteration"]) for r in straight.metrics]
    assert step_losses(second) == step_losses(straight)
    assert valid_losses(second) == valid_losses(straight) and len(valid_losses(straight)) == 2


def step_lrs(run) -> dict[int, float]:
    return {r["iteration"]: r["learning-rate"] for r in run.metrics if r["kind"] == "train"}


@pytest.mark.integration
def test_a_cooldown_branches_from_a_stable_checkpoint(tmp_path):
    """WSD: decay from a stable-phase checkpoint into a directory of its own, with a new
    schedule; a requeue of the branch continues the branch."""
    stable, branch = tmp_path / "stable", tmp_path / "branch"
    run = TINY_RUN + ["--input-interface", "binary", "--lr-decay-style", "WSD",
                      "--lr-wsd-decay-style", "linear"]
    run_pretrain(run + ["--train-iters", "8", "--lr-wsd-decay-iters", "4", "--save", stable,
                        "--load", stable, "--save-interval", "2", "--exit-interval", "4"])
    # From iteration 2 (not the latest, 4), decaying over the last 2 of 4 iterations.
    cooldown = run + ["--train-iters", "4", "--lr-wsd-decay-iters", "2", "--save", branch,
                      "--load", stable, "--ckpt-step", "2", "--override-opt_param-scheduler"]
    first = run_pretrain(cooldown + ["--exit-interval", "3"])
    assert f"resumed from {stable}/iter_0000002 at iteration 2" in first.stdout
    assert "schedule from these flags, not the checkpoint's: --lr-decay-iters 4 (checkpoint " \
           "8), --lr-wsd-decay-iters 2 (checkpoint 4)" in first.stdout
    requeued = run_pretrain(cooldown)
    assert f"--save {branch} holds iteration 3: resuming from it" in requeued.stdout
    lr = 3e-3  # TINY_RUN's
    assert step_lrs(requeued) == pytest.approx({3: lr / 2, 4: 0})


def test_a_fresh_start_never_overwrites_checkpoints(tmp_path):
    (tmp_path / "iter_0000004").mkdir()
    (tmp_path / MARKER).write_text("4")
    args = parse_args(TINY_RUN + ["--train-iters", "8", "--save", str(tmp_path)])
    with pytest.raises(FlagError, match=re.escape(
            f"--save {tmp_path} already holds checkpoints (latest: iteration 4); resume them "
            f"with --load {tmp_path}, or save to another directory")):
        resolve_checkpoint(check_machine_and_tokenizer(args, "cpu")[1], derive(args, 1, 511))


def test_a_changed_schedule_needs_a_decision():
    saved = parse_args(TINY_RUN + ["--train-iters", "8", "--lr-decay-style", "WSD",
                                   "--lr-wsd-decay-iters", "4"]).record()
    cooldown = TINY_RUN + ["--train-iters", "6", "--lr-decay-style", "WSD",
                           "--lr-wsd-decay-iters", "2", "--lr", "1e-3"]
    with pytest.raises(CheckpointError, match=re.escape(
            "differs from the one CKPT was trained with: --lr 0.001 (checkpoint 0.003), "
            "--lr-decay-iters 6 (checkpoint 8), --lr-wsd-decay-iters 2 (checkpoint 4). Pass "
            "--override-opt_param-scheduler")):
        reconcile_schedule(saved, parse_args(cooldown), 6, 4, "CKPT")
    args = parse_args(cooldown + ["--use-checkpoint-opt_param-scheduler"])
    diffs, kept = reconcile_schedule(saved, args, 6, 4, "CKPT")
    assert len(diffs) == 3
    assert (kept["lr"], kept["lr_decay_iters"], kept["lr_wsd_decay_iters"]) == (3e-3, 8, 4)
    training = args.training
    assert (training.lr, training.lr_decay_iters, training.lr_wsd_decay_iters) == (
        1e-3, None, 2)  # as given
    args = parse_args(cooldown + ["--override-opt_param-scheduler"])
    diffs, kept = reconcile_schedule(saved, args, 6, 4, "CKPT")
    assert len(diffs) == 3
    assert (kept["lr"], kept["lr_decay_iters"], kept["lr_wsd_decay_iters"]) == (1e-3, None, 2)
    same = parse_args(TINY_RUN + ["--train-iters", "8", "--lr-decay-style", "WSD",
                                  "--lr-wsd-decay-iters", "4"])
    assert reconcile_schedule(saved, same, 8, 4, "CKPT")[0] == []


def test_a_resume_at_another_global_batch_is_a_changed_schedule():
    """The scheduler counts samples: an iteration-based run resumed at a global batch of 8
    (given, or by default on twice the GPUs) would have followed another schedule in silence
    (its lr at the resumed iteration twice the uninterrupted run's); it needs the decision,
    and the checkpoint's iterations cannot be kept at the new batch."""
    saved = parse_args(TINY_RUN + ["--train-iters", "8"]).record()  # global batch 4
    args = parse_args(TINY_RUN + ["--train-iters", "8", "--global-batch-size", "8"])
    with pytest.raises(CheckpointError, match=re.escape(
            "differs from the one CKPT was trained with: --global-batch-size 8 (checkpoint 4: "
            "the schedule's iterations are 2x the samples). Pass")):
        reconcile_schedule(saved, args, 8, 8, "CKPT")
    with pytest.raises(CheckpointError, match="resume at its global batch, or pass "
                                              "--override-opt_param-scheduler"):
        reconcile_schedule(saved, parse_args(TINY_RUN + [
            "--train-iters", "8", "--use-checkpoint-opt_param-scheduler"]), 8, 8, "CKPT")
    override = parse_args(TINY_RUN + ["--train-iters", "8", "--override-opt_param-scheduler"])
    assert len(reconcile_schedule(saved, override, 8, 8, "CKPT")[0]) == 1


@pytest.mark.integration
def test_data_parallel_resume_overlapped_reduction_and_fewer_processes(tmp_path):
    """Two processes (data parallel over gloo, two micro-batches each per step):

    * a save written in the background by both ranks (--async-save) completes;
    * an interrupted and resumed run equals the uninterrupted one exactly, although it
      reduces gradients bucket by bucket during the backward pass (several buckets) and the
      uninterrupted run reduces them once at the end;
    * its checkpoint also resumes on one process (a requeue on fewer GPUs): the global batch
      and data order stay, only the gradient summation order changes (same losses to 1e-4).
    """
    run = TINY_RUN + ["--input-interface", "binary", "--train-iters", "6",
                      "--global-batch-size", "8"]
    ckpt, single = tmp_path / "ckpt", tmp_path / "single"
    overlapped = run + ["--overlap-grad-reduce", "--ddp-bucket-size", "20000"]
    two_ranks = run_pretrain_series({  # one torchrun launch: the ranks start once
        "straight": run + ["--metrics-file", tmp_path / "straight-metrics.jsonl"],
        # its save at 2 is written in the background by both ranks (completed before the one
        # at 3)
        "first": overlapped + ["--save", ckpt, "--load", ckpt, "--exit-interval", "3",
                               "--save-interval", "2", "--async-save"],
        "second": overlapped + ["--save", ckpt, "--load", ckpt]}, tmp_path)
    straight, first, second = (two_ranks[name] for name in ("straight", "first", "second"))
    straight = step_losses(straight)
    assert f"saved checkpoint {ckpt}/iter_0000002 (written in the background" in first.stdout
    buckets = re.search(r"gradient reduction overlaps the backward pass: (\d+) buckets",
                        first.stdout)
    assert buckets and int(buckets.group(1)) > 1
    assert f"resumed from {ckpt}/iter_0000003 at iteration 3" in second.stdout
    assert step_losses(second) == straight

    fewer = run_pretrain(run + ["--save", single, "--load", ckpt, "--ckpt-step", "3"])
    assert "world size changed (2 -> 1): random-number states are re-seeded" in fewer.stdout
    assert "dp 1) | 4 micro-batches per step" in fewer.stdout
    resumed = {**step_losses(first), **step_losses(fewer)}
    assert sorted(resumed) == sorted(straight) == list(range(1, 7))
    for it in straight:
        assert resumed[it] == pytest.approx(straight[it], rel=1e-4), it


@pytest.mark.integration
@pytest.mark.xdist_group("pp2_checkpoint")  # conftest's pp2_checkpoint: built on one worker
def test_pipeline_parallel_trains(pp2_checkpoint, tmp_path):
    """Two pipeline stages over gloo: the last stage reports a decreasing loss and the
    checkpoint of both stages loads back."""
    from megatron_ext.metrics.sinks import read_metrics
    ckpt = tmp_path / "ckpt"
    shutil.copytree(pp2_checkpoint, ckpt)
    losses = {r["iteration"]: r["lm loss"] for r in read_metrics(str(ckpt / "metrics.jsonl"))
              if r["kind"] == "train"}
    assert sorted(losses) == [1, 2, 3] and losses[3] < losses[1]
    resumed = run_pretrain(TINY_RUN + PP2_RUN + ["--train-iters", "4", "--save", ckpt,
                                                 "--load", ckpt], nproc=2)
    assert f"resumed from {ckpt}/iter_0000003 at iteration 3" in resumed.stdout
    assert sorted(step_losses(resumed)) == [1, 2, 3, 4]


@pytest.mark.integration
def test_activation_recompute_gives_the_same_losses():
    """Recomputing activations changes memory, not results: every recompute mode matches the
    run that stores them. A fixed-code input requires no gradient of its own, yet the
    recomputed layers must still receive theirs (the losses would drift otherwise)."""
    run = TINY_RUN + ["--input-interface", "binary", "--train-iters", "4"]
    stored = step_losses(run_pretrain(run))
    for mode in (["full", "--recompute-method", "uniform", "--recompute-num-layers", "1"],
                 ["selective"]):
        assert step_losses(run_pretrain(run + ["--recompute-granularity", *mode])) \
            == stored, mode


@pytest.mark.integration
def test_pytorch_profiler_records_the_asked_iterations(tmp_path):
    tb = tmp_path / "tb"
    out = run_pretrain(TINY_RUN + ["--input-interface", "gf2", "--train-iters", "5", "--profile",
                                   "--use-pytorch-profiler", "--profile-step-start", "2",
                                   "--profile-step-end", "4", "--tensorboard-dir", tb]).stdout
    assert "rank 0: profiling iterations 3-4" in out
    (trace,) = tb.glob("rank0.*.pt.trace.json")
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert {n for n in names if n and n.startswith("iteration ")} == {"iteration 3",
                                                                        "iteration 4"}
    assert "aten::mm" in names  # the steps' operators are in the trace


@pytest.mark.parametrize("flags,message", [
    (["--profile-step-start", "4", "--profile-step-end", "4"],
     "--profile-step-start 4 must be >= 0 and below --profile-step-end 4"),
    (["--use-pytorch-profiler"], "--use-pytorch-profiler writes its trace to --tensorboard-dir"),
    ([], "--profile without --use-pytorch-profiler is for Nsight Systems and needs a GPU"),
])
def test_bad_profile_flags_are_clear_errors(flags, message):
    """The flags' own refusals when they are parsed; Nsight's need of a GPU on this machine's
    device."""
    with pytest.raises(FlagError, match=re.escape(message)):
        args = parse_args(TINY_RUN + ["--train-iters", "5", "--profile", *flags])
        args.logging.check_device("cpu")


SIGNAL_RUN = TINY_RUN + ["--input-interface", "binary", "--exit-signal-handler"]


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_exit_signal_during_training_saves_and_exits_zero(tmp_path, sig):
    ckpt = tmp_path / "ckpt"
    # A second signal while the finished process shuts down must not kill it (exit 128+n):
    # the batch script would take that for a rank killed before it could handle the first.
    rc, out, _ = signal_run(SIGNAL_RUN + ["--train-iters", "100000", "--save", ckpt], sig,
                            when="iteration        3/", again_when="exiting at iteration")
    assert rc == 0, out[-2000:]
    assert f"received {sig.name}: exiting at iteration" in out
    saved = int((ckpt / MARKER).read_text())
    assert saved >= 3 and (ckpt / f"iter_{saved:07d}").is_dir()
    assert f"saved checkpoint {ckpt}/iter_{saved:07d}" in out


@pytest.mark.integration
def test_exit_signal_during_start_up_exits_zero_without_a_save(tmp_path):
    """0.5 s after the start the process is still importing torch: before the handler was
    installed first thing, Python's default action killed it (exit -10)."""
    ckpt = tmp_path / "ckpt"
    rc, out, _ = signal_run(SIGNAL_RUN + ["--train-iters", "5", "--save", ckpt],
                            signal.SIGUSR1, delay=0.5)
    assert rc == 0, out[-2000:]
    assert "received SIGUSR1 during start-up, before training (nothing new to save): " \
           "exiting at iteration 0" in out
    assert not (ckpt / MARKER).exists() and "iteration        1/" not in out


@pytest.mark.integration
def test_exit_signal_during_validation_saves_and_the_resumed_run_validates_first(tmp_path):
    ckpt = tmp_path / "ckpt"
    run = SIGNAL_RUN + ["--train-iters", "6", "--eval-interval", "3", "--eval-iters", "4",
                        "--save", ckpt, "--load", ckpt]
    straight = run_pretrain(run[:run.index("--save")] + run[run.index("--load") + 2:])
    # the validation at 3 held open 3 s after its first batch: the signal lands inside it
    rc, out, _ = signal_run(run, signal.SIGUSR1, when="iteration        3/", delay=0.2,
                            env={"FIXEDCODE_TEST_VALIDATION_SECONDS": "3"})
    assert rc == 0, out[-2000:]
    assert "received SIGUSR1: validation at iteration 3 stopped; the resumed run validates " \
           "first" in out
    assert (ckpt / MARKER).read_text() == "3" and "validation loss at iteration 3 |" not in out
    resumed = run_pretrain(run)
    assert resumed.stdout.index("validation loss at iteration 3 |") \
        < resumed.stdout.index("iteration        4/")
    # The metrics file then holds what the uninterrupted run logged: every validation.
    untimed = lambda run: [{k: v for k, v in r.items() if k not in TIMING}  # noqa: E731
                           for r in run.metrics]
    assert untimed(resumed) == untimed(straight)
    assert sorted(valid_losses(straight)) == [3, 6]


@pytest.mark.integration
def test_exit_signal_during_a_save_lets_the_save_finish(tmp_path):
    """... and the run, exiting 0, tells its batch script it stopped before --train-iters."""
    from megatron_ext.train.run_status import STATUS_ENV
    ckpt, status = tmp_path / "ckpt", tmp_path / "status"
    rc, out, _ = signal_run(SIGNAL_RUN + ["--train-iters", "100", "--save", ckpt,
                                          "--save-interval", "2"], signal.SIGTERM,
                            when="iteration        2/", delay=0.5,
                            env={"FIXEDCODE_TEST_SAVE_SECONDS": "3", STATUS_ENV: str(status)})
    assert rc == 0, out[-2000:]
    assert out.index(f"saved checkpoint {ckpt}/iter_0000002") \
        < out.index("received SIGTERM: exiting at iteration 2")
    assert status.read_text() == "stopped at iteration 2: received SIGTERM\n"
    assert (ckpt / MARKER).read_text() == "2" and not (ckpt / "iter_0000002.partial").exists()


@pytest.mark.integration
def test_a_save_killed_midway_is_not_loaded(tmp_path):
    ckpt = tmp_path / "ckpt"
    run = TINY_RUN + ["--input-interface", "binary", "--train-iters", "4", "--save", ckpt,
                      "--load", ckpt, "--save-interval", "2"]
    # Saves iteration 2, then dies after writing the shards of iteration 4.
    crashed = run_pretrain(run, env={"FIXEDCODE_FAULT_AFTER_SHARDS": "4"}, check=False,
                           in_process=False)  # the process dies (os._exit)
    assert crashed.returncode == 17
    assert (ckpt / "iter_0000004.partial").is_dir()
    assert not (ckpt / "iter_0000004").exists()
    assert (ckpt / MARKER).read_text() == "2"
    again = run_pretrain(run).stdout
    assert f"resumed from {ckpt}/iter_0000002 at iteration 2" in again
    assert (ckpt / MARKER).read_text() == "4"
    assert (ckpt / "iter_0000004").is_dir() and not (ckpt / "iter_0000004.partial").exists()


@pytest.mark.integration
def test_nonfinite_losses_stop_with_a_clear_error(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = run_pretrain(TINY_RUN + ["--input-interface", "binary", "--train-iters", "50",
                                    "--lr", "1e12", "--clip-grad", "0", "--lr-decay-style",
                                    "constant", "--max-nonfinite-steps", "3", "--save", ckpt,
                                    "--save-interval", "1"], check=False)
    assert proc.returncode == 3
    assert "3 non-finite steps in a row (--max-nonfinite-steps 3)" in proc.stderr
    assert "update skipped (1 in a row)" in proc.stdout
    last_saved = int((ckpt / MARKER).read_text())
    stopped = int(proc.stderr.split(" at iteration ")[1].split(",")[0])
    assert last_saved == stopped - 1  # the failing step itself was never saved


@pytest.mark.integration
def test_a_bad_flag_stops_the_run_with_a_clear_error():
    """End to end: the message reaches stderr and the exit status is non-zero."""
    args = [a for a in TINY_RUN if a != "--mock-data"]
    proc = run_pretrain(args + ["--input-interface", "binary", "--data-path",
                                "/nonexistent/corpus_text_document", "--train-iters", "2"],
                        check=False)
    assert proc.returncode != 0
    assert "--data-path: /nonexistent/corpus_text_document.bin does not exist" in proc.stderr


@pytest.mark.parametrize("flags,message", [
    (["--input-interface", "gf2", "--no-untie-embeddings-and-output-weights"],
     "has no input table to tie to the output head"),
    (["--input-interface", "binary", "--code-bits", "8"],
     "does not fit a 8-bit code (at most 2^8 = 256); raise --code-bits to at least 9"),
    # The tokenizer's 1,000 tokens fit 10 bits, its padded vocabulary of 1,200 does not.
    (["--input-interface", "permuted", "--vocab-size", "999", "--code-bits", "10",
      "--make-vocab-size-divisible-by", "300"],
     f"vocabulary of 1200 tokens (the tokenizer's {null_tokenizer_counts(999)[0]}, padded by "
     "--make-vocab-size-divisible-by) does not fit a 10-bit code (at most 2^10 = 1024); raise "
     "--code-bits to at least 11 or lower --make-vocab-size-divisible-by"),
    (["--input-interface", "binary", "--global-batch-size", "5"],
     "--global-batch-size 5 is not a multiple of --micro-batch-size 2"),
    (["--overlap-param-gather", "--overlap-grad-reduce"],
     "--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce"),
    (["--overlap-param-gather", "--use-distributed-optimizer"],
     "--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce"),
    (["--log-layer-norms", "--use-distributed-optimizer"],
     "--log-layer-norms reads whole gradients, which --use-distributed-optimizer scatters"),
    (["--load", "/nonexistent/ckpt", "--ckpt-step", "7"],
     "checkpoint /nonexistent/ckpt/iter_0000007 does not exist"),
])
def test_bad_flags_are_clear_errors(cpu_dist, flags, message):
    """Checked before anything is built (in this process: the set-up the entry point runs)."""
    with pytest.raises(FixedcodeError, match=re.escape(message)):
        args = parse_args(TINY_RUN + flags + ["--train-iters", "2"])
        resolve_checkpoint(*check_machine_and_tokenizer(args, "cpu")[1:])


def test_a_resumed_run_gets_its_saved_code_once_not_the_flags(cpu_dist, tmp_path):
    """The code is resolved once, by resolve_checkpoint, and handed on explicitly: resuming with
    another --code-seed keeps the saved A and b, and nothing about it rides on the arguments."""
    from megatron_ext.checkpoint.layout import TrainState
    from megatron_ext.checkpoint.saving import save_checkpoint
    from megatron_ext.codes.schemes import build_code
    from megatron_ext.train.setup import build_model_and_optimizer
    from pretrain_fixedcode import model_provider
    run = TINY_RUN + ["--input-interface", "gf2", "--save", str(tmp_path), "--train-iters", "2"]
    args = parse_args(run)
    _, settled, derived = check_machine_and_tokenizer(args, "cpu")
    resume = resolve_checkpoint(settled, derived)
    code, args = resume.code, resume.config
    model, _, optimizer, scheduler = build_model_and_optimizer(args, derived, model_provider, code)
    assert model.embedding.code == code
    save_checkpoint(args, derived, model, optimizer, scheduler, TrainState(iteration=1), code)
    resumed = parse_args(run + ["--load", str(tmp_path), "--code-seed", "7"])
    path, _, saved, _, own = resolve_checkpoint(
        *check_machine_and_tokenizer(resumed, "cpu")[1:])
    assert path == f"{tmp_path}/iter_0000001" and own
    assert saved == code != build_code(resumed.model, derived.padded_vocab_size)
    assert not hasattr(resumed, "fixed_code") and not hasattr(args, "fixed_code")


@pytest.mark.integration
def test_the_flags_are_the_command_line_after_a_run(cpu_dist, tmp_path):
    """What start-up settles (--device auto, the default --transformer-impl,
    --sequence-parallel at TP=1, a resumed run's schedule) is not written into the parsed
    flags; the checkpoint records the values the run applied."""
    import copy
    from megatron_ext.checkpoint.loading import load_common
    from megatron_ext.train.loop import pretrain
    from pretrain_fixedcode import datasets_provider, forward_step, model_provider
    run = TINY_RUN + ["--input-interface", "binary", "--save", tmp_path, "--load", tmp_path]
    run_pretrain(run + ["--train-iters", "1"])
    args = parse_args([str(a) for a in run] + [
        "--train-iters", "2", "--sequence-parallel", "--lr", "1e-3",
        "--use-checkpoint-opt_param-scheduler"])
    parsed = copy.deepcopy(args.record())
    assert (args.training.device, args.model.transformer_impl,
            args.parallel.sequence_parallel) == ("auto", None, True)
    result = pretrain(args, model_provider, forward_step, datasets_provider)
    assert args.record() == parsed
    assert (result.iteration, result.exit_reason) == (2, None)
    saved = load_common(str(tmp_path))[1]["args"]
    assert (saved["device"], saved["transformer_impl"], saved["sequence_parallel"],
            saved["lr"]) == ("cpu", "local", False, 3e-3)  # 3e-3: the checkpoint's schedule


@pytest.mark.integration
def test_resuming_with_another_input_interface_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    run_pretrain(TINY_RUN + ["--input-interface", "binary", "--train-iters", "1", "--save", ckpt])
    proc = run_pretrain(TINY_RUN + ["--input-interface", "gf2", "--train-iters", "2",
                                    "--load", ckpt], check=False)
    assert proc.returncode != 0
    assert "cannot resume" in proc.stderr
    assert "--input-interface: checkpoint 'binary', now 'gf2'" in proc.stderr


@pytest.mark.integration
def test_a_resume_says_what_changed_and_refuses_another_precision(cpu_dist, tmp_path):
    """Flags that change the data order or the model's function without its shape may change
    on resume (a cooldown's new blend, a longer context), but the log says which (Megatron-LM
    resumes with them in silence); another precision is refused by name (it failed with a raw
    KeyError in the optimizer state)."""
    ckpt = str(tmp_path / "ckpt")
    run = TINY_RUN + ["--train-iters", "4", "--save", ckpt, "--load", ckpt]
    run_pretrain(run + ["--exit-interval", "2"])
    same = run_pretrain(run + ["--exit-interval", "3"])
    assert "flags changed since it was saved" not in same.stdout
    changed = run_pretrain(run + ["--seed", "7", "--rotary-base", "500000"])
    assert ("flags changed since it was saved (from here the data order, or what the model "
            "computes, is not the uninterrupted run's):\n  --seed: checkpoint 1234, now 7\n"
            "  --rotary-base: checkpoint 10000, now 500000") in changed.stdout
    with pytest.raises(CheckpointError, match=re.escape(
            "in another precision (its optimizer state holds that precision's parameter "
            "copies):\n  --bf16: checkpoint False, now True")):
        args = parse_args(run + ["--bf16", "--train-iters", "5"])
        resolve_checkpoint(*check_machine_and_tokenizer(args, "cpu")[1:])


def test_a_checkpoint_from_before_code_tilings_resumes_as_repeat():
    """Its saved args lack --code-tiling: they mean repeat."""
    from megatron_ext.checkpoint.compatibility import MODEL_DEFINING_ARGS, check_compatible
    current = {**parse_args(TINY_RUN + ["--input-interface", "gf2", "--train-iters",
                                        "2"]).record(), "padded_vocab_size": 512}
    saved = {k: current[k] for k in MODEL_DEFINING_ARGS if k != "code_tiling"}
    check_compatible(saved, current, "CKPT")
    current["code_tiling"] = "recode"
    with pytest.raises(CheckpointError, match="--code-tiling: checkpoint 'repeat', now 'recode'"):
        check_compatible(saved, current, "CKPT")


def test_every_flag_has_help_and_help_shows_the_defaults():
    from megatron_ext.config.arguments import add_training_args, build_parser
    parser = build_parser("pretrain")
    add_training_args(parser)
    flags = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert len(flags) > 90
    assert [a.option_strings[0] for a in flags if not a.help] == []
    text = parser.format_help()
    for shown in ("peak learning rate (default: 0.0003)", "(default: 969,30,1)",
                  "Adam beta2 (default: 0.95)", "linear warm-up steps (default: 0)"):
        assert shown in " ".join(text.split()), shown
    assert "(default: None)" not in text and "(default: False)" not in text

