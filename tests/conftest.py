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
# Metrics-file fields that follow the machine's speed, load or memory: left out when the records
# of two runs are compared.
TIMING = frozenset({"time", "tokens-per-second", "step-time-ms", "tflops-per-gpu", "mfu",
                    "mfu-fp8-peak", "memory-gib", "memory-reserved-gib"})
TINY_RUN = TINY_MODEL + ["--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "3e-3",
                         "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "511",
                         "--log-interval", "1", "--eval-iters", "0", "--num-workers", "0"]


@pytest.fixture(scope="session")
def cpu_dist():
    """torch.distributed (gloo, one process) and Megatron's parallel state, TP=PP=1."""
    from megatron_ext.initialize import initialize_distributed
    initialize_distributed("cpu", 1, 1, seed=1234)
    yield


def run_pretrain(args, nproc: int = 1, env=None, check: bool = True,
                 timeout: int = 300) -> subprocess.CompletedProcess:
    """Run pretrain_fixedcode.py (under torchrun when nproc > 1); returns the completed run,
    with ``.metrics``: the records of the run's metrics file (``--metrics-file``, else
    ``--save``'s ``metrics.jsonl``; a temporary one when the arguments name neither).

    Output goes through files, not pipes, and the run gets its own process group, killed at
    the end: helper processes orphaned by a crash (multiprocessing's resource tracker) must
    neither hold the test's pipes open nor outlive it."""
    from megatron_ext.metric_sinks import read_metrics
    args = [str(a) for a in args]
    with tempfile.TemporaryDirectory() as scratch:
        if "--metrics-file" in args:
            metrics = args[args.index("--metrics-file") + 1]
        elif "--save" in args:
            metrics = os.path.join(args[args.index("--save") + 1], "metrics.jsonl")
        else:
            metrics = os.path.join(scratch, "metrics.jsonl")
            args += ["--metrics-file", metrics]
        result = _run(args, nproc, env, timeout)
        result.metrics = read_metrics(metrics) if os.path.exists(metrics) else []
    if check and result.returncode != 0:
        raise AssertionError(f"pretrain failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-5000:]}")
    return result


def _run(args, nproc: int, env, timeout: int) -> subprocess.CompletedProcess:
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-port", str(_free_port()), str(PRETRAIN)]
    else:
        cmd = [sys.executable, str(PRETRAIN)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd + args, stdout=out, stderr=err, text=True,
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
        return subprocess.CompletedProcess(proc.args, returncode, out.read(), err.read())


def step_losses(run: subprocess.CompletedProcess) -> dict[int, float]:
    """``{iteration: train loss}`` from a run's metrics file (--log-interval 1: each step's
    loss, at full precision); a resumed run's records start after its checkpoint."""
    return {r["iteration"]: r["lm loss"] for r in run.metrics
            if r["kind"] == "train" and "lm loss" in r}


def valid_losses(run: subprocess.CompletedProcess) -> dict[int, float]:
    return {r["iteration"]: r["lm loss validation"] for r in run.metrics if r["kind"] == "valid"}


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
