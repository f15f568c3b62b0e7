"""Slurm submission (tools/submit.py, slurm/fixedcode.sbatch), down to a real cluster.

The first tests render the job scripts with ``--dry-run`` and run their batch logic with
stand-ins for srun and scontrol. The last one brings up Debian's
Slurm on localhost (slurm/localcluster.sh, installing it when absent), submits the tiny CPU
recipe twice with 2 tasks, preempts one run by hand mid-training and checks that it was
requeued, resumed from its checkpoint and ended with the uninterrupted run's losses. It
fails, with the reason, when Slurm cannot start.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "slurm" / "recipes" / "tiny_cpu.args"
CPU_JOB = ["--gpus-per-node", "0", "--ntasks-per-node", "2"]
ARMS = ("learned", "binary", "gf2")


def submit(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "tools" / "submit.py"), *args],
                          capture_output=True, text=True, env=env)


def dry_run_scripts(*args: str) -> dict:
    """{arm: script} from the ``# ===== ARM: PATH =====`` sections of --dry-run's output."""
    done = submit("--dry-run", *args)
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


def test_gpu_container_script_requests_gpus_and_runs_in_the_image(tmp_path):
    scripts = dry_run_scripts("--recipe", str(RECIPE), "--run-dir", str(tmp_path),
                              "--arms", "gf2", "--nodes", "4", "--time", "04:00:00",
                              "--container-image", "nvcr.io/nvidia/pytorch:25.01-py3")
    script = scripts["gf2"]
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=8",
                 "#SBATCH --gpus-per-node=8", "#SBATCH --time=04:00:00"):
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
    done = submit("--recipe", str(recipe), "--run-dir", str(tmp_path / "run"), "--dry-run",
                  *extra)
    assert done.returncode != 0 and flag in done.stderr, done.stderr


def test_missing_recipe_is_refused_naming_the_file(tmp_path):
    done = submit("--recipe", str(tmp_path / "nope.args"), "--run-dir", str(tmp_path),
                  "--dry-run")
    assert done.returncode != 0 and f"--recipe {tmp_path / 'nope.args'}" in done.stderr


FAKE_SRUN = """#!/bin/bash
trap 'echo "srun got USR1"; exit $FAKE_RC' USR1
touch "$FAKE_DIR/ready"
while :; do sleep 0.05; done
"""
FAKE_SCONTROL = """#!/bin/bash
echo "$*" >>"$FAKE_DIR/scontrol.calls"
[[ $1 == show ]] && echo localhost
exit 0
"""


@pytest.mark.parametrize("restart_count, train_rc, requeued, job_rc, says", [
    ("", 0, True, 0, "checkpoint saved: requeueing job 7"),
    ("1", 0, True, 0, "checkpoint saved: requeueing job 7"),
    ("2", 0, False, 1, "restart cap 2 reached: not requeueing"),
    ("", 1, False, 1, "training exited with 1: not requeueing"),
])
def test_usr1_reaches_srun_and_requeues_up_to_the_cap(tmp_path, restart_count, train_rc,
                                                     requeued, job_rc, says):
    """The batch logic alone, with stand-ins for srun and scontrol on PATH."""
    script = dry_run_scripts("--recipe", str(RECIPE), "--run-dir", str(tmp_path / "run"),
                             "--arms", "binary", "--max-restarts", "2", *CPU_JOB)["binary"]
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "FAKE_DIR": str(tmp_path),
           "FAKE_RC": str(train_rc), "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "localhost"}
    if restart_count:
        env["SLURM_RESTART_COUNT"] = restart_count
    job = subprocess.Popen(["bash", "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    end = time.monotonic() + 30
    while not (tmp_path / "ready").exists() and time.monotonic() < end:
        time.sleep(0.05)
    job.send_signal(signal.SIGUSR1)
    out, _ = job.communicate(timeout=30)
    calls = (tmp_path / "scontrol.calls").read_text().splitlines()
    assert "srun got USR1" in out and says in out, out
    assert ("requeue 7" in calls) == requeued and job.returncode == job_rc, (out, calls)


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


def wait_until(condition, what: str, job_id: str, log: Path, env, deadline: float):
    while not condition():
        state = job_field(job_id, "JobState", env)
        if state in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            pytest.fail(f"job {job_id} is {state} while waiting for {what}; log:\n"
                        f"{log.read_text() if log.exists() else '(none)'}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} in time (job {job_id} {state}); log:\n"
                        f"{log.read_text() if log.exists() else '(none)'}")
        time.sleep(0.2)


def submit_tiny_binary_job(run_dir: Path, env):
    done = submit("--recipe", str(RECIPE), "--run-dir", str(run_dir), "--arms", "binary",
                  "--max-restarts", "1", *CPU_JOB, env=env)
    assert done.returncode == 0, done.stderr
    job_id, log = re.fullmatch(r"binary: job (\d+), log (\S+)\n", done.stdout).groups()
    return job_id, Path(log)


ITERATION = re.compile(r"iteration\s+(\d+)/\s*\d+.*?lm loss: (\S+)")
FINAL = re.compile(r"final train loss (\S+)")


def losses(text: str) -> dict:
    return {int(it): loss for it, loss in ITERATION.findall(text)}


@pytest.mark.timeout(900)
def test_preempted_job_requeues_resumes_and_ends_with_the_uninterrupted_loss(
        slurm_env, tmp_path):
    env = slurm_env
    deadline = time.monotonic() + 720   # ~2 min on an idle 2-core machine; slack for a busy one
    plain_id, plain_log = submit_tiny_binary_job(tmp_path / "uninterrupted", env)
    job_id, log = submit_tiny_binary_job(tmp_path / "preempted", env)

    # Preempt after the first periodic checkpoint (iteration 10), as the time limit would.
    wait_until(lambda: log.exists() and any(it >= 12 for it in losses(log.read_text())),
               "iteration 12 in the log", job_id, log, env, deadline)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=env, check=True)
    for jid, jlog in ((job_id, log), (plain_id, plain_log)):
        wait_until(lambda: job_field(jid, "JobState", env) == "COMPLETED",
                   "COMPLETED state", jid, jlog, env, deadline)

    text = log.read_text()
    assert job_field(job_id, "Restarts", env) == "1", text
    assert job_field(plain_id, "Restarts", env) == "0"
    first, requeued = text.split("SLURM_RESTART_COUNT=1", 1)
    assert "[slurm] checkpoint saved: requeueing" in first, text
    assert "[fixedcode] resumed from" not in first, text
    assert re.search(r"^\[fixedcode\] resumed from", requeued, flags=re.M), text
    # The first run stopped mid-training; the second went on from the step it saved at.
    stopped_at, resumed_at = max(losses(first)), min(losses(requeued))
    assert 12 <= stopped_at < 30 and resumed_at == stopped_at + 1, text

    plain_text = plain_log.read_text()
    assert FINAL.findall(plain_text) and FINAL.findall(text), (text, plain_text)
    assert FINAL.findall(text)[-1] == FINAL.findall(plain_text)[-1], (text, plain_text)
    plain_losses = losses(plain_text)
    assert sorted(plain_losses) == list(range(1, 31))
    for part in (first, requeued):
        assert losses(part) == {it: plain_losses[it] for it in losses(part)}, (part, plain_text)
