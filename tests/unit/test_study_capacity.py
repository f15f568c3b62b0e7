"""A study whose arms differ in trainable input parameters reports each arm's gap to the
control against that count (megatron_ext/study/capacity.py), paired by seed: validated on
fabricated records (a metrics file, checkpoint markers, cached evaluations; no training)
with known gaps, and with none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.recipes import TINY_RECIPE
from megatron_ext.study import evaluation, spec
from megatron_ext.study.report import write_report

ARMS = ["learned", "binary", "frozen", "map:binary@--code-projection",
        "r8:factorized@--input-table-rank=8"]
INPUT = {"learned": 32768, "binary": 0, "frozen": 0, "map": 1024, "r8": 4608}
GAP = {"learned": 0.0, "binary": 0.30, "frozen": 0.40, "map": 0.20, "r8": 0.10}
NOISE = {1: 0.004, 2: -0.002, 3: 0.001}  # per arm and seed: the intervals are not 0 wide


def fabricate(study: spec.Study, study_dir: Path, gap: dict) -> None:
    """Records as trained and evaluated runs leave them: the final loss is a seed offset
    shared by the arms (what pairing removes), the arm's gap, and a little noise."""
    for _, _, arm, seed, run in spec.all_runs(study, study_dir):
        ckpt = run / "checkpoints"
        (ckpt / "iter_0000004").mkdir(parents=True)
        (ckpt / "metrics.jsonl").write_text(json.dumps(
            {"kind": "train", "iteration": 4, "tokens": 4 * 128, "lm loss": 5.0}) + "\n")
        (ckpt / "latest_checkpointed_iteration.txt").write_text("4")
        noise = 0.0 if arm.name == "learned" else NOISE[seed] * (1 + list(GAP).index(arm.name))
        record = {"iteration": 4, "settings": evaluation._settings_json(study.eval),
                  "flops": 1e12,
                  "parameters": {"total": 100000 + INPUT[arm.name], "non_embedding": 100000},
                  "valid_loss": 5.0 + 0.1 * seed + gap[arm.name] + noise}
        (run / "eval").mkdir()
        (run / "eval" / "iter_0000004.json").write_text(json.dumps(record))


def report(tmp_path, gap, arms=ARMS):
    recipe = tmp_path / "recipe.args"
    recipe.write_text(TINY_RECIPE + "--tokenizer-type NullTokenizer --vocab-size 511\n")
    study = spec.build_study({"recipe": str(recipe), "arms": arms, "seeds": [1, 2, 3],
                              "eval": {"data_path": str(tmp_path / "heldout"), "tokens": 64}},
                             Path.cwd())
    fabricate(study, tmp_path / "S", gap)
    return write_report(study, tmp_path / "S"), (tmp_path / "S" / "STUDY.md").read_text()


def test_known_gaps_are_reported_against_the_trainable_input_parameters(tmp_path):
    summary, text = report(tmp_path, GAP)
    points = summary["input_capacity"]
    assert [(p["arm"], p["input_parameters"]) for p in points] == [
        ("binary", 0), ("frozen", 0), ("map", 1024), ("r8", 4608), ("learned", 32768)]
    for p in points:
        if p["arm"] == "learned":
            assert p["gap"] is None
            continue
        noise = [NOISE[s] * (1 + list(GAP).index(p["arm"])) for s in (1, 2, 3)]
        assert p["gap"]["mean"] == pytest.approx(GAP[p["arm"]] + sum(noise) / 3, abs=1e-9)
        assert p["gap"]["seeds"] == [1, 2, 3]
        assert p["gap"]["low"] < p["gap"]["mean"] < p["gap"]["high"]
        assert p["gap"]["high"] - p["gap"]["low"] < 0.1  # the seed offset is paired away
    assert "## Gap against trainable input parameters" in text
    assert "| map | 1,024 | +0.2" in text and "| learned | 32,768 | control |  |" in text
    assert (tmp_path / "S" / "input_capacity.png").stat().st_size > 0


def test_no_gap_reads_zero(tmp_path):
    summary, _ = report(tmp_path, dict.fromkeys(GAP, 0.0))
    for p in summary["input_capacity"]:
        if p["gap"] is not None:
            assert p["gap"]["low"] < 0.0 < p["gap"]["high"], p["arm"]
            assert abs(p["gap"]["mean"]) < 0.01, p["arm"]


def test_arms_of_one_count_get_no_axis(tmp_path):
    summary, text = report(tmp_path, GAP, arms=["learned", "binary", "frozen"])
    assert summary["input_capacity"] == []
    assert "trainable input parameters" not in text
    assert not (tmp_path / "S" / "input_capacity.png").exists()
