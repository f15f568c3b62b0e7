"""Saves at scale: a study's evaluation against retention, a full disk, damaged saves found at
resume, and asynchronous saves killed mid-write (megatron_ext/checkpoint/saving.py; the files
alone, manifests and retention without a training, are tests/unit/test_checkpoint_files.py)."""

from __future__ import annotations

import gc
import os
import re
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from conftest import PRETRAIN, TINY_RUN, run_pretrain, step_losses
from megatron_ext.checkpoint import layout, loading, manifest, retention, saving
from megatron_ext.checkpoint.layout import MARKER, TrainState
from megatron_ext.metrics.sinks import read_metrics
from megatron_ext.runtime.errors import CheckpointError, FlagError
from helpers.checkpoint_files import write_save
from helpers.signals import signal_run

CHECK_CHECKPOINT = PRETRAIN.parent / "tools" / "check_checkpoint.py"


def test_retention_during_a_study_evaluation_spares_the_save_being_read(
        cpu_dist, tmp_path, monkeypatch):
    """The study's evaluation holds each save's lock while it reads it: a training run's
    retention running meanwhile deletes the others, and the evaluation skips a save deleted
    before its turn."""
    from types import SimpleNamespace

    from megatron_ext.study import evaluation
    from megatron_ext.study.spec import EvalSettings
    arm = SimpleNamespace(name="binary")
    study = SimpleNamespace(runs=lambda: [(arm, 1)], eval=EvalSettings(), probes=None)
    ckpt = tmp_path / "binary" / "seed1" / "checkpoints"
    ckpt.mkdir(parents=True)
    for i in (1, 2, 3):
        write_save(ckpt, i)
    read, deleted = [], []

    def evaluate_checkpoint(run, iteration, settings):
        if iteration == 1:  # the training run's retention, while save 1 is being read
            deleted.extend(retention.prune(str(ckpt), 3, 1, None, print))
        assert (ckpt / f"iter_{iteration:07d}").is_dir()
        read.append(iteration)
        return {"iteration": iteration}

    monkeypatch.setattr(evaluation, "evaluate_checkpoint", evaluate_checkpoint)
    progress = []
    counts = evaluation.evaluate_study(study, tmp_path, progress.append)
    assert deleted == [2] and read == [1, 3] and counts == {"evaluated": 2, "cached": 0}
    assert any(f"skipped: {ckpt}/iter_0000002: deleted" in line for line in progress)


@pytest.mark.parametrize("flags, message", [
    (["--async-save"], "--async-save needs --save"),
    (["--keep-last-checkpoints", "2"], "--keep-last-checkpoints needs --save"),
    (["--save", "x", "--keep-checkpoints-every", "5"],
     "--keep-checkpoints-every applies with --keep-last-checkpoints only"),
])
def test_bad_save_flags_are_clear_errors(cpu_dist, flags, message):
    from megatron_ext.train.setup import check_machine_and_tokenizer
    from pretrain_fixedcode import parse_args
    with pytest.raises(FlagError, match=message):
        check_machine_and_tokenizer(parse_args(TINY_RUN + ["--train-iters", "2"] + flags), "cpu")


@pytest.fixture
def checkpointer(cpu_dist, tmp_path):
    """A Checkpointer of the tiny model, saving to tmp_path/ckpt."""
    from megatron_ext.checkpoint.resume import resolve_checkpoint
    from megatron_ext.train.setup import build_model_and_optimizer, check_machine_and_tokenizer
    from pretrain_fixedcode import model_provider, parse_args
    args = parse_args(TINY_RUN + ["--input-interface", "binary", "--train-iters", "4",
                                  "--save", str(tmp_path / "ckpt")])
    _, settled, derived = check_machine_and_tokenizer(args, "cpu")
    resume = resolve_checkpoint(settled, derived)
    args = resume.config
    model, _, optimizer, scheduler = build_model_and_optimizer(args, derived, model_provider,
                                                               resume.code)
    return saving.Checkpointer(
        args.checkpoint,
        lambda state: saving.start_save(args, derived, model, optimizer, scheduler, state,
                                        resume.code), None)


def test_a_damaged_latest_save_is_refused_naming_the_file_and_the_newest_intact_one(
        checkpointer):
    save_dir = checkpointer.config.save
    for i in (1, 2):
        checkpointer.save(TrainState(iteration=i), final=True)
    path = layout.checkpoint_path(save_dir, 2)
    files = [f for f in os.listdir(path) if f != manifest.MANIFEST]
    assert loading.check_save(save_dir).startswith(f"ok: {path}: {len(files)} files")
    shard = os.path.join(path, min(f for f in files if f.endswith(".distcp")))
    data = bytearray(open(shard, "rb").read())
    data[len(data) // 2] ^= 0x40
    open(shard, "wb").write(bytes(data))
    with pytest.raises(CheckpointError,
                       match=f"damaged checkpoint: {shard}: checksum .* The newest intact save "
                             f"is iteration 1: load it with --load {save_dir} --ckpt-step 1"):
        loading.load_common(save_dir)
    with pytest.raises(manifest.DamagedCheckpoint, match=shard):
        loading.check_save(save_dir)
    assert loading.load_common(save_dir, 1)[1]["iteration"] == 1


def test_a_full_disk_keeps_the_previous_save_and_exits_with_its_code(checkpointer, monkeypatch):
    """In the caller's process (megatron-core 0.17.0 on writes the bucket there): the error names
    ENOSPC and the file, the previous save loads, and the garbage collector finds nothing of the
    failed write to crash on (CPython 3.12.0-3.12.1, gh-111049)."""
    save_dir = checkpointer.config.save
    checkpointer.save(TrainState(iteration=1), final=True)
    monkeypatch.setenv("FIXEDCODE_FAULT_DISK_FULL", "2")
    with pytest.raises(saving.SaveFailed, match=r"the save of iteration 2 to .* failed .*\[Errno "
                       r"28\] No space left on device: '\S+iter_0000002\.partial/\S+\.distcp'"):
        checkpointer.save(TrainState(iteration=2), final=True)
    gc.collect()
    assert sorted(os.listdir(save_dir)) == sorted([MARKER, "iter_0000001"])
    assert layout.latest_iteration(save_dir) == 1
    from megatron_ext.hf.megatron_checkpoint import load_model, read_checkpoint
    path, train_args, fixed_code, iteration = read_checkpoint(save_dir)  # verified first
    assert iteration == 1 and load_model(path, train_args, fixed_code) is not None
    # The entry point turns it into exit code 4 (the Slurm script does not requeue it).
    import pretrain_fixedcode

    def fails(*args):
        raise saving.SaveFailed("disk full")

    monkeypatch.setattr(pretrain_fixedcode, "pretrain", fails)
    with pytest.raises(SystemExit) as ended:
        pretrain_fixedcode.main(TINY_RUN + ["--train-iters", "1"])
    assert ended.value.code == saving.SaveFailed.exit_code == 4


def test_a_full_disk_ends_the_run_naming_enospc_and_the_file(tmp_path):
    """A run whose save of iteration 4 meets a full disk ends with exit code 4, the error
    naming ENOSPC (errno 28) and the file; the save of iteration 2 stays the latest and loads, and no
    process of the run (its writer's queue) is left behind."""
    ckpt = tmp_path / "ckpt"
    run = TINY_RUN + ["--train-iters", "4", "--save", ckpt, "--save-interval", "2"]
    proc = subprocess.Popen([sys.executable, str(PRETRAIN), *map(str, run)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "FIXEDCODE_FAULT_DISK_FULL": "4"},
                            start_new_session=True)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == saving.SaveFailed.exit_code, out[-3000:]
    assert re.search(r"the save of iteration 4 to \S+ failed .*\[Errno 28\] No space left on "
                     r"device: '\S+iter_0000004\.partial/\S+\.distcp'", out), out[-3000:]
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nothing of the run's session is left
    assert sorted(f for f in os.listdir(ckpt) if f.startswith("iter_")) == ["iter_0000002"]
    assert loading.check_save(str(ckpt)).startswith(f"ok: {ckpt}/iter_0000002")
    assert loading.load_common(str(ckpt))[1]["iteration"] == 2


def test_an_async_save_killed_mid_write_resumes_from_the_previous_one(tmp_path):
    """Saves every 2 iterations in the background, each write held 3 s: at iteration 6 the
    run waits for the write of iteration 4 and is killed -9 there, with 6 steps trained. The
    resumed run starts from iteration 2 and ends with the killed run's losses; it also applies
    retention."""
    ckpt = tmp_path / "ckpt"
    run = TINY_RUN + ["--input-interface", "binary", "--train-iters", "6", "--save", ckpt,
                      "--load", ckpt, "--save-interval", "2", "--async-save"]
    proc = subprocess.Popen([sys.executable, str(PRETRAIN), *map(str, run)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "FIXEDCODE_TEST_WRITE_SECONDS": "3"},
                            start_new_session=True)
    out = []
    for line in proc.stdout:
        out.append(line)
        if "waiting for the background save of iteration 4" in line:
            os.killpg(proc.pid, signal.SIGKILL)  # the rank and its writer processes
            break
    proc.wait(timeout=60)
    out = "".join(out)
    assert proc.returncode == -signal.SIGKILL, out[-2000:]
    assert f"saved checkpoint {ckpt}/iter_0000002 (written in the background" in out
    assert (ckpt / MARKER).read_text() == "2" and not (ckpt / "iter_0000004").exists()
    killed = {r["iteration"]: r["lm loss"] for r in read_metrics(str(ckpt / "metrics.jsonl"))
              if r["kind"] == "train"}
    assert sorted(killed) == list(range(1, 7))

    resumed = run_pretrain(run + ["--keep-last-checkpoints", "1",
                                  "--keep-checkpoints-every", "4"])
    assert f"resumed from {ckpt}/iter_0000002 at iteration 2" in resumed.stdout
    # The metrics file keeps iterations 1-2 of the killed run; 3-6 are the resumed run's.
    assert step_losses(resumed) == killed
    assert f"retention: deleted {ckpt}/iter_0000002" in resumed.stdout
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("iter_")) == \
        ["iter_0000004", "iter_0000006"]
    checked = subprocess.run([sys.executable, str(CHECK_CHECKPOINT), str(ckpt)],
                             capture_output=True, text=True)
    assert checked.returncode == 0 and f"ok: {ckpt}/iter_0000006" in checked.stdout


def test_a_second_run_on_one_save_refuses_until_the_first_is_gone(tmp_path):
    """A job submitted twice: the second run, on the first's --save, refuses naming the
    holder and writes nothing there; once the first is killed -9, the next run takes its
    lease over at once (same host, process gone) and resumes its save."""
    ckpt = tmp_path / "ckpt"
    run = TINY_RUN + ["--train-iters", "1000", "--save", ckpt, "--load", ckpt,
                      "--save-interval", "2"]
    first = subprocess.Popen([sys.executable, str(PRETRAIN), *map(str, run)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        for line in first.stdout:
            if f"saved checkpoint {ckpt}/iter_0000002" in line:
                break
        metrics = (ckpt / "metrics.jsonl").read_text()
        second = run_pretrain(run + ["--exit-interval", "4"], check=False)
        assert second.returncode == 1, second.stderr[-2000:]
        assert f"error: --save {ckpt} is in use by another run (host {socket.gethostname()}, " \
               f"pid {first.pid}, last heartbeat" in second.stderr, second.stderr[-2000:]
        assert (ckpt / "metrics.jsonl").read_text().startswith(metrics)  # not rewritten
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    stopped = int((ckpt / MARKER).read_text())
    third = run_pretrain(run + ["--exit-interval", str(stopped + 1)])
    assert f"lease on --save {ckpt} taken over: its holder, pid {first.pid} on this host, " \
           f"is gone" in third.stdout
    assert f"resumed from {ckpt}/iter_{stopped:07d}" in third.stdout
    assert not (ckpt / retention.LOCKS / "run.lease").exists()  # given back at the end


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE  # ended; its reaper is elsewhere
    except psutil.NoSuchProcess:
        return True


def test_a_training_killed_9_leaves_no_process_behind(tmp_path):
    """kill -9 to the training process alone (not its group), while a background write is
    held 3 s: its helpers (the writer, the Manager of the writers' result queue, the data
    loader's worker) die with it; before, the forked Manager lived on."""
    ckpt = tmp_path / "ckpt"
    run = TINY_RUN + ["--train-iters", "50", "--save", ckpt, "--save-interval", "2",
                      "--async-save", "--num-workers", "1"]
    proc = subprocess.Popen([sys.executable, str(PRETRAIN), *map(str, run)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "FIXEDCODE_TEST_WRITE_SECONDS": "3"},
                            start_new_session=True)
    try:
        out = []
        for line in proc.stdout:
            out.append(line)
            if "in the background (training stalled" in line:
                break
        helpers = psutil.Process(proc.pid).children(recursive=True)
        assert len(helpers) >= 2, "".join(out)[-2000:]  # the writer, the Manager, ...
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        deadline = time.time() + 20
        while time.time() < deadline and not all(map(_gone, helpers)):
            time.sleep(0.2)
        left = [p for p in psutil.process_iter() if not _gone(p) and _session(p) == proc.pid]
        assert left == [], [p.cmdline() for p in left]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _session(process: psutil.Process):
    try:
        return os.getsid(process.pid)
    except (ProcessLookupError, PermissionError):
        return None


def test_an_exit_signal_during_a_background_write_waits_for_it(tmp_path):
    """SIGTERM while the save of iteration 2 is written in the background (held 3 s): the run
    stops after its step, waits for that write and completes the save, saves the iteration it
    stopped at (unless that is 2), exits 0."""
    ckpt = tmp_path / "ckpt"
    rc, out, _ = signal_run(TINY_RUN + ["--input-interface", "binary", "--train-iters", "100",
                                        "--exit-signal-handler", "--save", ckpt,
                                        "--save-interval", "2", "--async-save"],
                            signal.SIGTERM, when="in the background (training stalled",
                            env={"FIXEDCODE_TEST_WRITE_SECONDS": "3"})
    assert rc == 0, out[-2000:]
    stopped = int(out.split("received SIGTERM: exiting at iteration ")[1].split()[0])
    assert out.index("waiting for the background save of iteration 2") \
        < out.index(f"saved checkpoint {ckpt}/iter_0000002 (written in the background") \
        < out.index("received SIGTERM: exiting at iteration")
    assert (ckpt / MARKER).read_text() == str(stopped)
    assert loading.check_save(str(ckpt)).startswith(f"ok: {ckpt}/iter_{stopped:07d}")
