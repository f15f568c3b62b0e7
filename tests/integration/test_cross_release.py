"""Checkpoints across the tested megatron-core releases: a save of 0.16.1 resumes under 0.19.x
with the uninterrupted run's losses; a save of 0.19.x read by 0.16.1 is refused before any work,
naming both releases; each save records its release, which tools/check_checkpoint.py shows.

The other release runs in its own interpreter: ``make test`` builds the 0.16.1 leg's venv
(``.venv``, Python 3.11) before the 0.19.x leg (``.venv-mcore019``, Python 3.12) runs these
tests; without both, they are skipped."""

from __future__ import annotations

import json
import subprocess

import pytest
from packaging.version import Version

from conftest import PRETRAIN, REPO, TINY_RUN, run_pretrain, step_losses
from helpers.indexed_data import make_dataset
from megatron_ext.checkpoint import loading
from megatron_ext.runtime.megatron_compat import installed_release

pytestmark = pytest.mark.integration

# Both directions run on the 0.19.x leg; the 0.16.1 leg would repeat the same four runs.
OLDER = REPO / ".venv" / "bin" / "python"   # the 0.16.1 leg's interpreter
# Saves at iteration 2 of a 4-iteration run (its schedule), then resumed to 4.
# On indexed data: synthetic (--mock-data) batches follow NullTokenizer's EOD, which moved in
# 0.18.0, so they differ between the releases.
TRAIN = [a for a in TINY_RUN if a != "--mock-data"] + ["--train-iters", "4"]


@pytest.fixture
def runs(tmp_path) -> tuple[list, list]:
    """``(uninterrupted run, run saving every 2 iterations)`` on a tiny indexed dataset."""
    data = make_dataset(tmp_path / "corpus", [40] * 100)
    uninterrupted = TRAIN + ["--data-path", data]
    return uninterrupted, uninterrupted + ["--save-interval", "2"]


@pytest.fixture
def older() -> str:
    """The 0.16.1 leg's python, seen from the 0.19.x leg."""
    if Version(installed_release()) < Version("0.19"):
        pytest.skip("the megatron-core 0.19.x leg runs both directions against this leg")
    if not OLDER.exists():
        pytest.skip(f"the megatron-core 0.16.1 leg's venv ({OLDER.parent.parent.name}) is not "
                    f"built: make test builds both")
    return str(OLDER)


def run_with(python: str, args: list, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([python, str(PRETRAIN), *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def metrics_losses(save_dir) -> dict[int, float]:
    records = [json.loads(line) for line in open(f"{save_dir}/metrics.jsonl")]
    return {r["iteration"]: r["lm loss"] for r in records
            if r["kind"] == "train" and "lm loss" in r}


def test_a_save_of_0_16_1_resumes_here_as_if_never_interrupted(runs, older, tmp_path):
    uninterrupted, run = runs
    theirs = tmp_path / "theirs"
    saved = run_with(older, run + ["--save", theirs, "--exit-interval", "2"], tmp_path)
    assert saved.returncode == 0, saved.stderr[-3000:]
    written = json.load(open(theirs / "iter_0000002" / "manifest.json"))["megatron_core"]
    assert written.startswith("0.16.1")
    assert loading.check_save(str(theirs)).endswith(f"; megatron-core {written}")
    whole = tmp_path / "whole"
    assert run_with(older, run + ["--save", whole], tmp_path).returncode == 0
    resumed = run_pretrain(run + ["--load", theirs, "--save", theirs])
    assert f"resumed from {theirs}/iter_0000002 at iteration 2" in resumed.stdout
    assert {i: step_losses(resumed)[i] for i in (3, 4)} == pytest.approx(
        {i: metrics_losses(whole)[i] for i in (3, 4)}, rel=1e-5)
    assert step_losses(run_pretrain(uninterrupted)) == pytest.approx(metrics_losses(whole),
                                                                      rel=1e-5)


def test_a_save_of_this_release_is_refused_by_0_16_1_before_any_work(runs, older, tmp_path):
    _, run = runs
    ours = tmp_path / "ours"
    run_pretrain(run + ["--save", ours, "--exit-interval", "2"])
    written = json.load(open(ours / "iter_0000002" / "manifest.json"))["megatron_core"]
    assert written == installed_release()
    assert loading.check_save(str(ours)).endswith(f"; megatron-core {written}")
    before = sorted(p.name for p in ours.iterdir())
    refused = run_with(older, run + ["--load", ours, "--save", ours], tmp_path)
    assert refused.returncode != 0
    assert (f"was written with megatron-core {written}, which keeps a save's common objects "
            f"inside its shards (no common.pt); the installed megatron-core 0.16.1 cannot "
            f"read it") in refused.stderr + refused.stdout
    assert sorted(p.name for p in ours.iterdir()) == before
    assert "iteration        3" not in refused.stdout


def test_a_mock_data_save_of_0_16_1_is_refused_naming_the_release_difference(older, tmp_path):
    """NullTokenizer(512) counts 513 ids under 0.16.1 (padded to 640) and 512 from 0.18.0:
    the refusal names that release difference and the --vocab-size that resumes the save,
    which then resumes."""
    vocab = TINY_RUN.index("--vocab-size") + 1
    theirs = tmp_path / "theirs"

    def run(vocab_size: int) -> list:
        return TINY_RUN[:vocab] + [str(vocab_size)] + TINY_RUN[vocab + 1:] + [
            "--lr-decay-iters", "8", "--save", theirs]

    saved = run_with(older, run(512) + ["--train-iters", "2"], tmp_path)
    assert saved.returncode == 0, saved.stderr[-3000:]
    resume = ["--train-iters", "3", "--load", theirs]
    refused = run_pretrain(run(512) + resume, check=False)
    assert refused.returncode != 0
    assert ("--padded-vocab-size: checkpoint 640, now 512\n  a megatron-core release "
            "difference: NullTokenizer's vocabulary changed in megatron-core 0.18.0 "
            "(NullTokenizer(512) counts 513 ids before it, 512 from it); this save was written "
            "with megatron-core 0.16.1, this run has " + installed_release()
            + ": resume it with --vocab-size 513") in refused.stderr
    resumed = run_pretrain(run(513) + resume)
    assert f"resumed from {theirs}/iter_0000002 at iteration 2" in resumed.stdout
