"""Sequence parallelism and the distributed optimizer on CPU (gloo runs their reduce-scatter
and all-gather): over 10 training steps of every arm, TP=2 with sequence parallelism gives
the losses of TP=1 (the fixed-code input computes only its rank's slice of the sequence),
and the distributed optimizer at DP=2 those of DDP at DP=2; it also saves and resumes
exactly, also with its parameters gathered during the forward pass
(``--overlap-param-gather``). Two pipeline stages under --bf16 --fp32-residual-connection
continue a PP=1 checkpoint with PP=1's losses. Both layers' attention is the default, SDPA, so TP=2
also checks it against TP=1."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, run_torchrun_worker
from megatron_ext.metrics.sinks import read_metrics
from helpers.parallel_worker import ARMS, FP32_RESIDUAL_SAVED, LAYOUTS, STEPS

WORKER = REPO / "tests" / "helpers" / "parallel_worker.py"
# One worker runs the file, so its fixture (23 runs) is built once (under pytest-xdist
# --dist loadgroup the tests went to both workers, each building it).
pytestmark = pytest.mark.xdist_group("parallel")


def losses(root: Path, name: str) -> dict[int, float]:
    return {r["iteration"]: r["lm loss"] for r in read_metrics(str(root / f"{name}.jsonl"))
            if r["kind"] == "train"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("parallel")
    return root, run_torchrun_worker(WORKER, root).stdout


def test_sequence_parallel_tp2_equals_tp1_for_every_arm(runs):
    root, stdout = runs
    assert stdout.count("(tp 2, pp 1, dp 1)") == len(ARMS)
    assert "--sequence-parallel turned off" not in stdout
    for arm in ARMS:
        tp1, sp = losses(root, f"dp2-{arm}"), losses(root, f"tp2-sp-{arm}")
        assert sorted(tp1) == sorted(sp) == list(range(1, STEPS + 1)), arm
        assert tp1[STEPS] < tp1[1], arm  # it learns: the comparison is of a moving loss
        for it in tp1:
            assert sp[it] == pytest.approx(tp1[it], abs=1e-5), (arm, it)
    assert set(LAYOUTS) == {"dp2", "tp2-sp"}


def test_distributed_optimizer_dp2_equals_ddp_and_resumes_exactly(runs):
    root, stdout = runs
    ddp, dist = losses(root, "dp2-binary"), losses(root, "dist-opt")
    assert sorted(dist) == list(range(1, STEPS + 1))
    for it in ddp:
        assert dist[it] == pytest.approx(ddp[it], abs=1e-6), it
    first, resumed = losses(root, "dist-opt-first"), losses(root, "dist-opt-resumed")
    assert sorted(first) == [1, 2, 3, 4, 5] and sorted(resumed) == list(range(6, STEPS + 1))
    assert "at iteration 5" in stdout
    assert {**first, **resumed} == dist


def test_overlapped_parameter_gather_gives_the_same_run(runs):
    """Gradients reduced and parameters gathered bucket by bucket during the passes; the
    checkpoint (and the parameter norm) read between steps see the gathered parameters, so
    the run interrupted and resumed has the straight run's losses."""
    root, stdout = runs
    dist = losses(root, "dist-opt")
    overlapped = {**losses(root, "overlap-first"), **losses(root, "overlap-resumed")}
    assert sorted(overlapped) == list(range(1, STEPS + 1))
    for it in dist:
        assert overlapped[it] == pytest.approx(dist[it], abs=1e-6), it
    norms = [r["params-norm"] for r in read_metrics(str(root / "overlap-resumed.jsonl"))]
    assert len(norms) == STEPS - 5 and all(n > 0 for n in norms)


def test_pipeline_stages_send_the_fp32_residual_stream(runs):
    """Under --bf16 --fp32-residual-connection a stage sends its fp32 stream: the receive
    buffers are fp32 too (they were bf16, half the bytes sent, and gloo aborted). From the
    same checkpoint, two stages continue with the losses of one (bf16 layers either way:
    the same GEMMs on the same micro-batches, the gradients summed in fp32)."""
    root, stdout = runs
    assert stdout.count("(tp 1, pp 2, dp 1)") == 1
    assert f"ckpt-fp32-residual/iter_{FP32_RESIDUAL_SAVED:07d} at iteration" in stdout
    pp1, pp2 = (losses(root, name) for name in ("fp32-residual-pp1", "fp32-residual-pp2"))
    assert sorted(pp1) == list(range(1, STEPS + 1))
    assert sorted(pp2) == list(range(FP32_RESIDUAL_SAVED + 1, STEPS + 1))
    assert pp1[STEPS] < pp1[1]
    for it in pp2:
        assert pp2[it] == pytest.approx(pp1[it], abs=2e-3), it
