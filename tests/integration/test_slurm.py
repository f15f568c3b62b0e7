"""Slurm submission (tools/submit.py, slurm/fixedcode.sbatch), down to a real cluster.

The first tests render the job scripts with ``--dry-run`` and run their batch logic with
stand-ins for srun and scontrol, down to a signal that comes before srun is started and one
that srun drops while it starts the tasks. The last one brings up Debian's Slurm on
localhost (slurm/localcluster.sh, installing it when absent), submits a tiny CPU recipe
twice with 2 tasks and preempts one of the jobs by hand four times, in four phases of its
runs: mid-training, during a requeued run's start-up, during validation and during a save.
It checks that each run stopped where it should, the job requeued itself and the next run
resumed from the right checkpoint, and that the job ended with the uninterrupted one's
per-step and final losses and the same metrics file. It fails, with the reason, when Slurm
cannot start.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from conftest import TIMING
from helpers.megatron_log import training_lines
from megatron_ext.codes.schemes import PAPER_ARMS
from megatron_ext.checkpoint.saving import SaveFailed
from tools import submit as submit_tool

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "slurm" / "recipes" / "tiny_cpu.args"
# One worker runs them all (pytest-xdist --dist loadgroup): the module brings its cluster up
# once.
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]
CPU_JOB = ["--gpus-per-node", "0", "--ntasks-per-node", "2"]
ARMS = PAPER_ARMS  # tools/submit.py's default arms


def submit(*args: str, env=None) -> subprocess.CompletedProcess:
    """tools/submit.py with ``args``, in a process of its own under the cluster's ``env``."""
    return subprocess.run([sys.executable, str(REPO / "tools" / "submit.py"), *args],
                          capture_output=True, text=True, env=env)


def dry_run(*args: str) -> subprocess.CompletedProcess:
    """``tools/submit.py --dry-run ARGS`` in this process (it only prints): its exit status,
    stdout and stderr as its own process would end (a status-1 ``SystemExit`` prints its
    message)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            submit_tool.main(["--dry-run", *args])
            status = 0
        except SystemExit as end:
            status = end.code if isinstance(end.code, int) else 1
            if isinstance(end.code, str):
                print(end.code, file=sys.stderr)
    return subprocess.CompletedProcess(args, status, out.getvalue(), err.getvalue())


def dry_run_scripts(*args: str) -> dict:
    """{arm: script} from the ``# ===== ARM: PATH =====`` sections of --dry-run's output."""
    done = dry_run(*args)
    assert done.returncode == 0, done.stderr
    parts = re.split(r"^# ===== (\w+): \S+ =====\n", done.stdout, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_dry_run_prints_one_valid_cpu_script_per_arm(tmp_path):
    run_dir = tmp_path / "run"
    scripts = dry_run_scripts("--recipe", str(RECIPE), "--run-dir", str(run_dir), *CPU_JOB)
    assert sorted(scripts) == sorted(ARMS)
    for arm, script in scripts.items():
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)
        ckpt = run_dir / arm / "checkpoints"
        for line in (f"--input-interface {arm}", f"--save {ckpt}", f"--load {ckpt}",
                     f"--tensorboard-dir {run_dir / arm / 'tensorboard'}",
                     "--exit-signal-handler", "--train-iters 30",
                     "#SBATCH --ntasks-per-node=2", "#SBATCH --requeue",
                     "#SBATCH --open-mode=append", "#SBATCH --signal=B:USR1@300",
                     f"#SBATCH --output={run_dir / arm / 'slurm-%j.log'}"):
            assert line in script.splitlines() or f"    {line}" in script.splitlines(), line
        assert "--gpus-per-node" not in script and "--container-image" not in script
    assert not run_dir.exists(), "--dry-run must not write anything"


def test_an_arm_with_flags_of_its_own_is_submitted_under_its_name(tmp_path):
    """The arms of issue 31 as a study names them: a folder per name, the arm's own flags."""
    run_dir = tmp_path / "run"
    scripts = dry_run_scripts("--recipe", str(RECIPE), "--run-dir", str(run_dir), *CPU_JOB,
                              "--arms", "frozen,r32:factorized@--input-table-rank=32,"
                                        "map:binary@--code-projection")
    assert sorted(scripts) == ["frozen", "map", "r32"]
    for name, lines in (("frozen", ["--input-interface frozen"]),
                        ("r32", ["--input-interface factorized", "--input-table-rank 32"]),
                        ("map", ["--input-interface binary", "--code-projection"])):
        ckpt = run_dir / name / "checkpoints"
        for line in lines + [f"--save {ckpt}", f"--load {ckpt}"]:
            assert line in scripts[name].splitlines() or \
                f"    {line}" in scripts[name].splitlines(), (name, line)
    refused = dry_run("--recipe", str(RECIPE), "--run-dir", str(run_dir),
                      "--arms", "learned,tabled")
    assert refused.returncode == 2 and \
        "error: --arms: arm 'tabled': unknown input interface 'tabled'" in refused.stderr


def test_gpu_container_script_requests_gpus_and_runs_in_the_image(tmp_path):
    # 2 nodes x 2 GPUs: the recipe's global batch of 8 is 2 per rank (the plan refuses more)
    scripts = dry_run_scripts("--recipe", str(RECIPE), "--run-dir", str(tmp_path),
                              "--arms", "gf2", "--nodes", "2", "--gpus-per-node", "2",
                              "--time", "04:00:00",
                              "--container-image", "nvcr.io/nvidia/pytorch:25.01-py3")
    script = scripts["gf2"]
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2",
                 "#SBATCH --gpus-per-node=2", "#SBATCH --time=04:00:00"):
        assert line in script.splitlines(), line
    assert f"--container-image=nvcr.io/nvidia/pytorch:25.01-py3 " \
           f"--container-mounts={REPO}:{REPO},{tmp_path}:{tmp_path}" in script
    assert "    python pretrain_fixedcode.py" in script


@pytest.mark.parametrize("recipe_text, extra, flag", [
    ("--num-layers 2\n--save /elsewhere\n", [], "--save"),
    ("--num-layers 2 --input-interface=gf2\n", [], "--input-interface"),
    ("--num-layers 2\n", ["--gpus-per-node", "0"], "--ntasks-per-node"),
    ("--num-layers 2\n", ["--arms", "binary,ternary"], "--arms"),
])
def test_bad_input_is_refused_naming_the_flag(tmp_path, recipe_text, extra, flag):
    recipe = tmp_path / "recipe.args"
    recipe.write_text(recipe_text)
    done = dry_run("--recipe", str(recipe), "--run-dir", str(tmp_path / "run"), *extra)
    assert done.returncode != 0 and flag in done.stderr, done.stderr


def test_missing_recipe_is_refused_naming_the_file(tmp_path):
    done = dry_run("--recipe", str(tmp_path / "nope.args"), "--run-dir", str(tmp_path))
    assert done.returncode != 0 and f"--recipe {tmp_path / 'nope.args'}" in done.stderr


FAKE_SRUN = """#!/bin/bash
# Drops the first $FAKE_DROPS signals, as srun does before it has started the tasks.
dropped=0
trap 'if (( dropped < ${FAKE_DROPS:-0} )); then dropped=$((dropped + 1))
      else echo "srun got USR1"; exit $FAKE_RC; fi' USR1
touch "$FAKE_DIR/srun.started" "$FAKE_DIR/ready"
while :; do sleep 0.05; done
"""
FAKE_SCONTROL = """#!/bin/bash
echo "$*" >>"$FAKE_DIR/scontrol.calls"
if [[ $1 == show ]]; then
    echo localhost
    # With FAKE_SLOW_SHOW, the batch script is held here, before srun, for the signal.
    if [[ -n $FAKE_SLOW_SHOW ]]; then touch "$FAKE_DIR/ready"; sleep 1; fi
fi
exit 0
"""


def run_batch_logic(tmp_path, **fake_env) -> tuple[str, list, int]:
    """Run the binary arm's job script with stand-ins for srun and scontrol on PATH, send
    its shell SIGUSR1 once the stand-in says ``ready``; ``(output, scontrol calls, exit
    status)``."""
    script = dry_run_scripts("--recipe", str(RECIPE), "--run-dir", str(tmp_path / "run"),
                             "--arms", "binary", "--max-restarts", "2", *CPU_JOB)["binary"]
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "FAKE_DIR": str(tmp_path),
           "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "localhost", **fake_env}
    job = subprocess.Popen(["bash", "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    end = time.monotonic() + 30
    while not (tmp_path / "ready").exists() and time.monotonic() < end:
        time.sleep(0.05)
    job.send_signal(signal.SIGUSR1)
    out, _ = job.communicate(timeout=30)
    return out, (tmp_path / "scontrol.calls").read_text().splitlines(), job.returncode


@pytest.mark.parametrize("restart_count, train_rc, requeued, job_rc, says", [
    ("", 0, True, 0, "preempted: requeueing job 7"),
    ("1", 0, True, 0, "preempted: requeueing job 7"),
    ("2", 0, False, 1, "restart cap 2 reached: not requeueing"),
    # A rank killed by the forwarded signal itself (still starting): requeued.
    ("", 128 + 10, True, 0, "killed by the forwarded signal (exit 138)"),
    ("", 128 + 15, True, 0, "killed by the forwarded signal (exit 143)"),
    # Any other failure after the signal is a crash.
    ("", 1, False, 1, "training exited with 1 after the signal: a crash, not requeueing"),
    # A save that failed (full disk) would fail again.
    ("", SaveFailed.exit_code, False, SaveFailed.exit_code, "save failed (exit 4: full disk"),
])
def test_usr1_reaches_srun_and_requeues_up_to_the_cap(tmp_path, restart_count, train_rc,
                                                     requeued, job_rc, says):
    """The batch logic alone, with stand-ins for srun and scontrol on PATH."""
    fake_env = {"FAKE_RC": str(train_rc)}
    if restart_count:
        fake_env["SLURM_RESTART_COUNT"] = restart_count
    out, calls, rc = run_batch_logic(tmp_path, **fake_env)
    assert "srun got USR1" in out and says in out, out
    assert ("requeue 7" in calls) == requeued and rc == job_rc, (out, calls)


def test_a_signal_before_srun_starts_requeues_without_starting_it(tmp_path):
    out, calls, rc = run_batch_logic(tmp_path, FAKE_SLOW_SHOW="1")
    assert "[slurm] the signal came before training was started: nothing new to save" in out
    assert not (tmp_path / "srun.started").exists(), out
    assert "requeue 7" in calls and rc == 0, (out, calls)


def test_a_signal_that_srun_dropped_while_starting_is_passed_on_again(tmp_path):
    """A real srun drops a signal that comes before it has started the tasks: the script
    passes it on again (every second while srun is in its first 10 s)."""
    out, calls, rc = run_batch_logic(tmp_path, FAKE_RC="0", FAKE_DROPS="2")
    assert "srun got USR1" in out and "preempted: requeueing job 7" in out, out
    assert "requeue 7" in calls and rc == 0, (out, calls)


FAKE_SRUN_ENDS = """#!/bin/bash
# Training that ends by itself, saying how (FAKE_STATUS) where the batch script asked.
if [[ -n $FAKE_STATUS ]]; then echo "$FAKE_STATUS" >"$FIXEDCODE_RUN_STATUS_FILE"; fi
exit 0
"""


@pytest.mark.parametrize("status, restart_count, requeued, job_rc, says", [
    ("done at iteration 30", "", False, 0, "training done at iteration 30: finished, not "
                                           "requeueing"),
    # A SIGTERM to the step alone (scancel --signal=TERM JOB.0): saved, stopped, requeued.
    ("stopped at iteration 25: received SIGTERM", "", True, 0,
     "training stopped at iteration 25: received SIGTERM (before --train-iters): a stopped "
     "run, not a finished one"),
    ("stopped at iteration 25: received SIGTERM", "2", False, 1,
     "restart cap 2 reached: not requeueing"),
    ("", "", False, 0, "training exited 0 without saying how it ended"),
])
def test_a_run_that_ends_by_itself_is_told_done_or_stopped(tmp_path, status, restart_count,
                                                           requeued, job_rc, says):
    """No signal to the batch script: the run's status file, not its exit status 0, says
    whether it finished (the job ends) or stopped before --train-iters (requeued, within
    --max-restarts)."""
    script = dry_run_scripts("--recipe", str(RECIPE), "--run-dir", str(tmp_path / "run"),
                             "--arms", "binary", "--max-restarts", "2", *CPU_JOB)["binary"]
    for name, text in (("srun", FAKE_SRUN_ENDS), ("scontrol", FAKE_SCONTROL)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    (tmp_path / "run" / "binary").mkdir(parents=True)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "FAKE_DIR": str(tmp_path),
           "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "localhost", "FAKE_STATUS": status,
           **({"SLURM_RESTART_COUNT": restart_count} if restart_count else {})}
    job = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                         timeout=60)
    calls = (tmp_path / "scontrol.calls").read_text().splitlines()
    assert says in job.stdout, job.stdout + job.stderr
    assert ("requeue 7" in calls) == requeued and job.returncode == job_rc, (job.stdout, calls)
    if requeued:
        assert "[slurm] stopped: requeueing job 7" in job.stdout


# ---------------------------------------------------------------------------- real Slurm

@pytest.fixture
def slurm_env():
    """A fresh one-node cluster advertising 4 CPUs (two 2-task jobs at once); env for it."""
    state = Path(tempfile.mkdtemp(prefix="fixedcode-slurm-"))   # munged must reach it
    cluster = ["bash", str(REPO / "slurm" / "localcluster.sh")]
    try:
        up = subprocess.run(cluster + ["up", str(state)], capture_output=True, text=True,
                            env={**os.environ, "CPUS": "4"}, timeout=300)
        if up.returncode != 0:
            pytest.fail(f"Slurm could not start: {up.stdout}{up.stderr}", pytrace=False)
        yield {**os.environ, "SLURM_CONF": str(state / "slurm.conf")}
    finally:
        subprocess.run(cluster + ["down", str(state)], timeout=120)
        shutil.rmtree(state, ignore_errors=True)


def job_field(job_id: str, field: str, env) -> str:
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True,
                           text=True, env=env).stdout
    return re.search(rf"\b{field}=(\S+)", shown).group(1)


def daemon_lines(job_id: str, env) -> str:
    """The last 200 lines that the cluster's slurmctld and slurmd logged about ``job_id``
    (at debug level): who signalled, requeued or cancelled it is there, not in its log."""
    logs = Path(env["SLURM_CONF"]).parent / "log"
    found = []
    for daemon in ("slurmctld", "slurmd"):
        path = logs / f"{daemon}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        found += [f"{daemon}: {line}" for line in text.splitlines() if job_id in line]
    return "\n".join(found[-200:]) or "(nothing)"


def wait_until(condition, what: str, job_id: str, log: Path, env, deadline: float,
               poll: float = 0.2):
    """Poll ``condition`` every ``poll`` seconds (the job's state about every second) until
    it holds; fail, with the job's log and the daemons' lines about it, when the job ended
    first or ``deadline`` passed."""
    checked = 0.0
    while not condition():
        if time.monotonic() - checked >= 1.0:
            checked = time.monotonic()
            state = job_field(job_id, "JobState", env)
            ended = state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                              "OUT_OF_MEMORY") and not condition()
            if ended or checked > deadline:
                why = f"job {job_id} is {state} while waiting for {what}" if ended else \
                    f"no {what} in time (job {job_id} {state})"
                pytest.fail(f"{why}; log:\n{log.read_text() if log.exists() else '(none)'}\n"
                            f"Slurm's daemons on job {job_id}:\n{daemon_lines(job_id, env)}")
        time.sleep(poll)


def submit_tiny_binary_job(run_dir: Path, env, recipe: Path = RECIPE, max_restarts: int = 1):
    done = submit("--recipe", str(recipe), "--run-dir", str(run_dir), "--arms", "binary",
                  "--max-restarts", str(max_restarts), *CPU_JOB, env=env)
    assert done.returncode == 0, done.stderr
    job_id, log = re.fullmatch(r"binary: job (\d+), log (\S+)\n", done.stdout).groups()
    return job_id, Path(log)


FINAL = re.compile(r"final train loss (\S+)")
RUN_START = re.compile(r"^\[slurm\] job \d+ on \S+, SLURM_RESTART_COUNT=(\d+),", re.M)


def losses(text: str) -> dict:
    return {int(m["iteration"]): m["lm_loss"] for m in training_lines(text)}


def runs(log: Path) -> list[str]:
    """The log of each run of a requeued job (all append to one file), in order: the text
    from its ``SLURM_RESTART_COUNT=N`` line to the next run's."""
    text = log.read_text() if log.exists() else ""
    starts = list(RUN_START.finditer(text))
    assert [int(m.group(1)) for m in starts] == list(range(len(starts))), text
    ends = [m.start() for m in starts[1:]] + [len(text)]
    return [text[m.start():end] for m, end in zip(starts, ends)]


def untimed_metrics(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl without the wall-clock keys."""
    from megatron_ext.metrics.sinks import read_metrics
    return [{k: v for k, v in record.items() if k not in TIMING}
            for record in read_metrics(str(run_dir / "binary" / "checkpoints"))]


# The real-Slurm recipe: tiny_cpu.args with a periodic checkpoint every SAVE_EVERY
# iterations and a validation of EVAL_ITERS batches at EVAL_AT and at the end, each held open
# HOLD_VALIDATION s after its first batch (FIXEDCODE_TEST_VALIDATION_SECONDS). The preempted
# job stops mid-training at SAVE_EVERY + 2 or a little later (the signal takes a moment; any
# iteration before EVAL_AT will do), in the validation at EVAL_AT, and in the save at SAVE_AT
# (not a validation iteration).
TRAIN_ITERS, SAVE_EVERY, EVAL_AT, EVAL_ITERS, HOLD_VALIDATION = 30, 9, 25, 5, 5
SAVE_AT = 27


def write_recipe(path: Path) -> Path:
    text = RECIPE.read_text()
    for old, new in (("--save-interval 10", f"--save-interval {SAVE_EVERY}"),
                     ("--eval-iters 0", f"--eval-iters {EVAL_ITERS} --eval-interval {EVAL_AT}"),
                     ("--train-iters 30", f"--train-iters {TRAIN_ITERS}")):
        assert old in text, f"{RECIPE} no longer says {old!r}: update this test"
        text = text.replace(old, new)
    path.write_text(text)
    return path


# slurmstepd's line for a step cancelled by a plain SIGTERM/SIGKILL (scancel JOB.STEP, srun
# killing its step): never asked for by the preemption scenario, whose signals are USR1 and
# whose requeues print "... DUE TO JOB REQUEUE".
OUTSIDE_CANCEL = re.compile(
    r"^slurmstepd\S*: error: \*\*\* STEP \d+\.\d+ ON \S+ CANCELLED AT \S+ \*\*\*$", re.M)


@pytest.mark.timeout(1200)
@pytest.mark.one_leg(1, "Slurm's requeue and the batch script's signals; the save on a signal "
                        "and the resume are test_training's, on both legs")
def test_preempted_job_requeues_resumes_and_ends_with_the_uninterrupted_loss(
        slurm_env, tmp_path):
    """Two jobs of one recipe: one runs straight through; the other is preempted four times
    (``scancel --signal=USR1 --batch``, as Slurm does before a time limit), each time in
    another phase of a run, and must requeue itself each time and end like the first:

    0. mid-training, after the first periodic checkpoint: the run finishes its step, saves
       and stops there;
    1. as soon as the requeued run's batch script has started (whichever instant that lands
       in: before srun, while srun starts the tasks, before Python's handler, during
       start-up): the run ends without training a step or saving;
    2. during the validation at EVAL_AT: the run stops validating, saves, and the next run
       validates EVAL_AT before it trains on;
    3. during the save at SAVE_AT (FIXEDCODE_TEST_SAVE_SECONDS holds that save open 3 s):
       the save completes, then the run stops, and the next one resumes from it.

    At the end: 4 restarts (0 for the other job), both COMPLETED, the same final loss and
    every run's logged per-step losses equal to the uninterrupted job's, and the same
    metrics.jsonl but for the timings (so every validation happened exactly once).

    A step cancelled by Slurm itself (slurmstepd's ``*** STEP J.0 ON node CANCELLED AT t ***``,
    which nothing here asks for; seen once on the loaded 2-core CI machine, shortly after a
    requeue) voids the attempt: its jobs are cancelled and the scenario runs once more, with a
    warning that carries the first failure. A second such attempt fails."""
    for attempt in (1, 2):
        root = tmp_path / f"attempt{attempt}"
        try:
            return preemption_scenario(slurm_env, root)
        except (AssertionError, pytest.fail.Exception) as failure:
            logs = "".join(log.read_text() for log in root.glob("*/binary/slurm-*.log"))
            if attempt == 2 or not OUTSIDE_CANCEL.search(logs):
                raise
            subprocess.run(["scancel", "--full", "--user", str(os.getuid())], env=slurm_env,
                           check=True)
            warnings.warn(f"attempt 1 voided, as Slurm cancelled a step by itself: {failure}")


def preemption_scenario(slurm_env, root: Path) -> None:
    """The scenario of the test above, in the folder ``root``."""
    env = {**slurm_env, "FIXEDCODE_TEST_SAVE_SECONDS": f"3@{SAVE_AT}",  # sbatch passes them on
           "FIXEDCODE_TEST_VALIDATION_SECONDS": str(HOLD_VALIDATION)}
    deadline = time.monotonic() + 540   # ~2.5 min on an idle 2-core machine; slack for a busy one
    root.mkdir()
    recipe = write_recipe(root / "recipe.args")
    plain_dir, run_dir = root / "uninterrupted", root / "preempted"
    plain_id, plain_log = submit_tiny_binary_job(plain_dir, env, recipe, max_restarts=4)
    job_id, log = submit_tiny_binary_job(run_dir, env, recipe, max_restarts=4)
    ckpt = run_dir / "binary" / "checkpoints"

    def preempt():
        subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=env, check=True)

    def wait_for_run(n: int, condition=lambda text: True, what: str = "", poll: float = 0.2):
        """Until run ``n`` has started and its log meets ``condition``."""
        def met():
            parts = runs(log)
            return len(parts) > n and condition(parts[n])
        wait_until(met, f"run {n}{what}", job_id, log, env, deadline, poll)

    # 0. Mid-training, after the first periodic checkpoint.
    wait_for_run(0, lambda text: any(it >= SAVE_EVERY + 2 for it in losses(text)),
                 f": iteration {SAVE_EVERY + 2}")
    preempt()
    # 1. The requeued run, as soon as its batch script has started.
    wait_for_run(1, poll=0.02)
    preempt()
    # 2. The next one during the validation at EVAL_AT.
    wait_for_run(2, lambda text: EVAL_AT in losses(text), f": iteration {EVAL_AT}")
    preempt()
    # 3. The next one during the save at SAVE_AT.
    wait_for_run(3, lambda text: SAVE_AT in losses(text), f": iteration {SAVE_AT}")
    time.sleep(0.5)
    preempt()
    wait_for_run(4, lambda text: f"[slurm] training done at iteration {TRAIN_ITERS}: finished"
                 in text, ": the end")
    for jid, jlog in ((job_id, log), (plain_id, plain_log)):
        wait_until(lambda: job_field(jid, "JobState", env) == "COMPLETED",
                   "COMPLETED state", jid, jlog, env, deadline)

    text, plain_text = log.read_text(), plain_log.read_text()
    assert job_field(job_id, "Restarts", env) == "4", text
    assert job_field(plain_id, "Restarts", env) == "0", plain_text
    parts = runs(log)
    assert len(parts) == 5, text
    for part in parts[:4]:
        assert "[slurm] SIGUSR1: training saves and exits" in part, text
        assert f"[slurm] preempted: requeueing job {job_id}" in part, text

    # 0: stopped mid-training at S0, after its step, with a checkpoint of S0.
    stopped = max(losses(parts[0]))
    assert SAVE_EVERY + 2 <= stopped < EVAL_AT, parts[0]
    assert f"[fixedcode] saved checkpoint {ckpt}/iter_{stopped:07d}" in parts[0], parts[0]
    assert f"[fixedcode] received SIGUSR1: exiting at iteration {stopped}" in parts[0], parts[0]
    # 1: ended without training a step, saving nothing, and was requeued.
    assert not losses(parts[1]) and "saved checkpoint" not in parts[1], parts[1]
    assert any(how in parts[1] for how in (
        "received SIGUSR1 during start-up, before training (nothing new to save): exiting at "
        f"iteration {stopped}",
        f"received SIGUSR1 while building the datasets (nothing new to save): exiting at "
        f"iteration {stopped}",
        "[slurm] the signal came before training was started: nothing new to save",
        "[slurm] training was killed by the forwarded signal")), parts[1]
    # 2: resumed from S0, stopped in the validation at EVAL_AT and saved it as pending.
    assert f"[fixedcode] resumed from {ckpt}/iter_{stopped:07d} at iteration {stopped}" \
        in parts[2], parts[2]
    assert min(losses(parts[2])) == stopped + 1 and max(losses(parts[2])) == EVAL_AT, parts[2]
    assert f"received SIGUSR1: validation at iteration {EVAL_AT} stopped; the resumed run " \
           f"validates first" in parts[2], parts[2]
    assert f"validation loss at iteration {EVAL_AT} |" not in parts[2], parts[2]
    assert f"[fixedcode] saved checkpoint {ckpt}/iter_{EVAL_AT:07d}" in parts[2], parts[2]
    # 3: validated EVAL_AT first, then trained on; the signal came during the save at
    # SAVE_AT, which completed before the run stopped there.
    assert f"[fixedcode] resumed from {ckpt}/iter_{EVAL_AT:07d} at iteration {EVAL_AT}" \
        in parts[3], parts[3]
    assert parts[3].index(f"validation loss at iteration {EVAL_AT} |") \
        < parts[3].index(f" iteration {EVAL_AT + 1:8d}/"), parts[3]
    assert max(losses(parts[3])) == SAVE_AT, parts[3]
    assert parts[3].index(f"[fixedcode] saved checkpoint {ckpt}/iter_{SAVE_AT:07d}") \
        < parts[3].index(f"[fixedcode] received SIGUSR1: exiting at iteration {SAVE_AT}"), \
        parts[3]
    # 4: resumed from SAVE_AT and trained to the end.
    assert f"[fixedcode] resumed from {ckpt}/iter_{SAVE_AT:07d} at iteration {SAVE_AT}" \
        in parts[4], parts[4]
    assert sorted(losses(parts[4])) == list(range(SAVE_AT + 1, TRAIN_ITERS + 1)), parts[4]

    # Every run's losses are the uninterrupted job's, down to the final one.
    plain_losses = losses(plain_text)
    assert sorted(plain_losses) == list(range(1, TRAIN_ITERS + 1)), plain_text
    assert FINAL.findall(plain_text) and FINAL.findall(text), (text, plain_text)
    assert FINAL.findall(text)[-1] == FINAL.findall(plain_text)[-1], (text, plain_text)
    for part in parts:
        assert losses(part) == {it: plain_losses[it] for it in losses(part)}, (part, plain_text)
    # The metrics files hold the same records: each iteration and validation exactly once.
    metrics = untimed_metrics(run_dir)
    assert metrics == untimed_metrics(plain_dir), text
    assert [r["iteration"] for r in metrics if r["kind"] == "valid"] == [EVAL_AT, TRAIN_ITERS]
