"""tools/param_report.py counts trainable parameters from instantiated modules."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def run_report(*flags: str) -> str:
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "param_report.py"), *flags],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_reference_shape_counts():
    out = run_report("--preset", "smollm2-1.7b", "--json")
    import json
    counts = json.loads(out)
    assert counts["binary"]["total"] == 1_711_376_384
    assert counts["gf2"]["total"] == 1_711_376_384
    assert counts["learned"]["total"] == 1_812_039_680
    assert counts["learned"]["total"] - counts["binary"]["total"] == 100_663_296
    assert counts["binary"]["input_table"] == 0
    assert counts["learned"]["input_table"] == 100_663_296
    assert counts["binary"]["head"] == 100_663_296


def test_small_shape_matches_independent_formula():
    L, d, ffn, V = 3, 64, 160, 1000
    out = run_report("--num-layers", str(L), "--hidden-size", str(d), "--num-attention-heads",
                     "4", "--ffn-hidden-size", str(ffn), "--seq-length", "32",
                     "--vocab-size", str(V), "--json")
    import json
    counts = json.loads(out)
    padded = 1024  # 1000 rounded up to a multiple of 128
    # Per layer: QKV + output projection, SwiGLU (two up + one down), two RMSNorm weights.
    backbone = L * (4 * d * d + 3 * d * ffn + 2 * d) + d
    assert counts["binary"] == {"input_table": 0, "backbone": backbone, "head": padded * d,
                                "total": backbone + padded * d}
    assert counts["learned"]["total"] == backbone + 2 * padded * d


def test_table_output_shows_the_difference():
    out = run_report("--preset", "smollm2-1.7b", "--arms", "learned", "binary")
    assert "1,711,376,384" in out and "1,812,039,680" in out
    assert "learned - binary: 100,663,296 parameters" in out
