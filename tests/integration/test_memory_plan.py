"""The planned memory of a run (megatron_ext/model/memory.py) against what a training step
on CPU really holds (tests/helpers/memory_probe.py): the weights, gradients and optimizer
state equal the tensors of the built model and optimizer, byte for byte, for every arm, in
fp32 and bf16, at TP 1 and 2, PP 1 and 2, and with the distributed optimizer at DP 2
(torchrun, tests/helpers/memory_worker.py); the activation peak of a step is within
:data:`TOLERANCE` of the planned one, across precisions, attention, MLPs, norms, GQA,
recompute, dropout, micro-batches and the layouts. The start-up log prints the plan as
Megatron-LM's line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, TINY_RUN, _free_port, run_pretrain
from pretrain_fixedcode import parse_args
from helpers.memory_probe import measure
from helpers.memory_worker import ARMS as WORKER_ARMS
from helpers.memory_worker import LAYOUTS
from megatron_ext.codes.schemes import ARMS
from megatron_ext.model.memory import footprint

TOLERANCE = 0.10  # measured activation peak / planned, within 1 +- this
WORKER = REPO / "tests" / "helpers" / "memory_worker.py"
ARM_FLAGS = {arm: ["--input-interface", arm] for arm in ARMS if arm != "factorized"}
ARM_FLAGS["factorized"] = ["--input-interface", "factorized", "--input-table-rank", "16"]
ARM_FLAGS["binary+projection"] = ["--input-interface", "binary", "--code-projection"]


def check(got: dict) -> None:
    planned = got["planned"]
    assert got["state"] == {"weights": planned.weights, "gradients": planned.gradients,
                            "optimizer": planned.optimizer}
    assert got["peak"] / planned.activations == pytest.approx(1, abs=TOLERANCE)


@pytest.mark.parametrize("arm", sorted(ARM_FLAGS))
def test_every_arms_state_is_its_tensors(cpu_dist, arm):
    """bf16: 16-bit weights, fp32 gradients, fp32 master weights and Adam moments."""
    check(measure(ARM_FLAGS[arm] + ["--bf16"]))


@pytest.mark.parametrize("flags", [
    [], ["--input-interface", "binary"],  # fp32: no master copy
    ["--attention-backend", "unfused"], ["--bf16", "--attention-backend", "unfused"],
    ["--no-swiglu"], ["--normalization", "LayerNorm", "--bf16"],
    ["--bf16", "--num-query-groups", "2", "--attention-backend", "unfused"],
    ["--recompute-granularity", "selective", "--attention-backend", "unfused"],
    ["--recompute-granularity", "full", "--recompute-method", "uniform",
     "--recompute-num-layers", "2", "--num-layers", "4"],
    ["--recompute-granularity", "full", "--recompute-method", "block",
     "--recompute-num-layers", "1"],
    ["--hidden-dropout", "0.1", "--attention-dropout", "0.1"],
    ["--micro-batch-size", "1", "--global-batch-size", "4", "--fp32-residual-connection",
     "--bf16"],
], ids=lambda flags: " ".join(flags))
def test_the_activation_peak_is_planned(cpu_dist, flags):
    check(measure(flags))


def test_layouts_tp2_pp2_and_the_distributed_optimizer(tmp_path):
    """Each rank's state equals its plan (its TP shard, its PP stage, its share of the
    distributed optimizer: the ranks' shards sum to the whole); its activation peak is
    within the tolerance."""
    worker = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(_free_port()), str(WORKER), str(tmp_path)],
        capture_output=True, text=True,
        timeout=300, env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"})
    assert worker.returncode == 0, worker.stdout[-3000:] + worker.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert set(ranks[0]) == {f"{layout}/{arm}" for layout in LAYOUTS for arm in WORKER_ARMS}
    for run in ranks[0]:
        for rank in ranks:
            got, planned = rank[run], dict(rank[run]["planned"])
            activations = planned.pop("activations")
            assert got["state"] == planned, run
            assert got["peak"] / activations == pytest.approx(1, abs=TOLERANCE), run
    stages = [ranks[r]["pp2/binary"]["planned"]["weights"] for r in (0, 1)]
    assert stages[0] < stages[1]  # the head on the last stage, no table on the first


def test_the_start_up_log_prints_megatron_lms_line(cpu_dist):
    """The run's own plan (TINY_RUN: vocabulary 512 padded, 2 micro-batches, on CPU)."""
    flags = TINY_RUN + ["--train-iters", "1", "--device", "cpu"]
    run = run_pretrain(flags)
    line = next(line for line in run.stdout.splitlines()
                if line.startswith("Theoretical memory footprints:"))
    assert re.fullmatch(r"Theoretical memory footprints: weight and optimizer=[\d.]+ MB, "
                        r"activation=[\d.]+ MB, total=[\d.]+ MB", line)
    assert line == footprint(parse_args(flags), 512, 1, 2, "cpu").megatron_line()
