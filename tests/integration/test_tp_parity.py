"""The same weights give the same logits at TP=1 and TP=2 (two processes over gloo), for
every arm (every code scheme, both tilings): a fixed-code input needs no communication to
stay consistent across TP ranks."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, run_torchrun_worker
from helpers import tp_parity_worker
from helpers.tp_parity_worker import ARMS

WORKER = REPO / "tests" / "helpers" / "tp_parity_worker.py"


@pytest.mark.integration
def test_logits_equal_at_tp1_and_tp2(cpu_dist, tmp_path):
    tp_parity_worker.main("save", str(tmp_path))  # TP=1: this process, one rank
    run_torchrun_worker(WORKER, "check", tmp_path)
    diffs = json.loads((tmp_path / "tp2_diff.json").read_text())
    assert set(diffs) == set(ARMS)
    for arm, diff in diffs.items():
        assert diff <= 1e-5, f"{arm}: TP=2 logits differ from TP=1 by {diff}"
