"""The same weights give the same logits at TP=1 and TP=2 (two processes over gloo), for
every arm (every code scheme, both tilings): a fixed-code input needs no communication to
stay consistent across TP ranks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, _free_port
from helpers.tp_parity_worker import ARMS

WORKER = REPO / "tests" / "helpers" / "tp_parity_worker.py"


@pytest.mark.integration
@pytest.mark.xdist_group("processes")  # torchrun: both cores
def test_logits_equal_at_tp1_and_tp2(tmp_path):
    subprocess.run([sys.executable, str(WORKER), "save", str(tmp_path)], check=True,
                   capture_output=True, timeout=300)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                    "--master-port", str(_free_port()), str(WORKER), "check", str(tmp_path)],
                   check=True, capture_output=True, timeout=300)
    diffs = json.loads((tmp_path / "tp2_diff.json").read_text())
    assert set(diffs) == set(ARMS)
    for arm, diff in diffs.items():
        assert diff <= 1e-5, f"{arm}: TP=2 logits differ from TP=1 by {diff}"
