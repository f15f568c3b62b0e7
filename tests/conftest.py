"""Shared test fixtures: Megatron-Core on CPU in this process, and running the training
entry point as a subprocess (its global parallel state then stays out of the test process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PRETRAIN = REPO / "pretrain_fixedcode.py"

# A model that trains in seconds on two cores.
TINY_MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
              "--ffn-hidden-size", "128", "--seq-length", "32"]
TINY_RUN = TINY_MODEL + ["--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "3e-3",
                         "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "512",
                         "--log-interval", "1", "--eval-iters", "0", "--num-workers", "0"]


@pytest.fixture(scope="session")
def cpu_dist():
    """torch.distributed (gloo, one process) and Megatron's parallel state, TP=PP=1."""
    from megatron_ext.initialize import initialize_distributed
    initialize_distributed("cpu", 1, 1, seed=1234)
    yield


def run_pretrain(args, nproc: int = 1, env=None, check: bool = True,
                 timeout: int = 300) -> subprocess.CompletedProcess:
    """Run pretrain_fixedcode.py (under torchrun when nproc > 1); returns the completed run.

    Output goes through files, not pipes, and the run gets its own process group, killed at
    the end: helper processes orphaned by a crash (multiprocessing's resource tracker) must
    neither hold the test's pipes open nor outlive it."""
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-port", str(_free_port()), str(PRETRAIN)]
    else:
        cmd = [sys.executable, str(PRETRAIN)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd + [str(a) for a in args], stdout=out, stderr=err, text=True,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        try:
            returncode = proc.wait(timeout=timeout)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(proc.args, returncode, out.read(), err.read())
    if check and result.returncode != 0:
        raise AssertionError(f"pretrain failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-5000:]}")
    return result


def step_losses(stdout: str) -> dict[int, str]:
    """``{iteration: 'lm loss' as printed}`` from the training log (--log-interval 1)."""
    import re
    return {int(m.group(1)): m.group(2) for m in
            re.finditer(r"iteration\s+(\d+)/\d+ \|.*?lm loss: (\S+) \|", stdout)}


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
