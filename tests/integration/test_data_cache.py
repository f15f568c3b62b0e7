"""Dataset index caches built ahead of time: tools/build_data_cache.py, the job that
tools/submit.py --build-cache queues before the arms, training's reuse of its files
(--require-data-cache), and the errors of a rank that does not see --data-cache-path."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, TINY_RUN, run_pretrain
from megatron_ext.datasets import cache as data_cache
from megatron_ext.runtime.errors import DataError, message
from helpers.gpt2_bpe import gpt2_bpe_files
from helpers.indexed_data import make_dataset, training_data
from tools import build_data_cache, submit

FAKE_SBATCH = """#!/bin/bash
echo "$*" >>"$FAKE_DIR/sbatch.calls"
echo $((100 + $(wc -l <"$FAKE_DIR/sbatch.calls")))
"""
FAKE_SRUN = '#!/bin/bash\nexec "$@"\n'


def snapshot(folder: Path) -> dict:
    """{name: (inode, mtime, sha256)} of every file in ``folder``."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns,
                     hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.iterdir())}


def recipe_flags(tmp_path: Path) -> list[str]:
    """TINY_RUN on a blend of two indexed datasets, validating, caching in tmp_path/cache."""
    a = make_dataset(tmp_path / "a", [20 + i % 7 for i in range(400)])
    b = make_dataset(tmp_path / "b", [30 + i % 5 for i in range(300)], first_id=3)
    return [a for a in TINY_RUN if a != "--mock-data"] + [
        "--train-iters", "3", "--eval-iters", "2", "--eval-interval", "3",
        "--data-path", "0.6", a, "0.4", b, "--data-cache-path", str(tmp_path / "cache")]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_cache_job_builds_what_training_then_loads(tmp_path, monkeypatch, capsys):
    """submit.py --build-cache queues the builder, then the arms after it; the builder's job
    script (run here with srun as a pass-through) writes the caches; the arm's training flags
    load every one of them, unchanged, and a second build finds them all."""
    flags = recipe_flags(tmp_path)
    (tmp_path / "recipe.args").write_text(" ".join(flags))
    for name, text in (("sbatch", FAKE_SBATCH), ("srun", FAKE_SRUN)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    run = tmp_path / "run"
    submit.main(["--recipe", str(tmp_path / "recipe.args"), "--run-dir", str(run),
                 "--gpus-per-node", "2", "--build-cache",
                 "--build-cache-partition", "cpu", "--build-cache-time", "00:30:00"])
    out = capsys.readouterr().out
    assert (tmp_path / "sbatch.calls").read_text().splitlines() == (
        [f"--parsable {run / 'data_cache' / 'job.sbatch'}"]
        + [f"--parsable --dependency=afterok:101 {run / arm / 'job.sbatch'}"
           for arm in ("learned", "binary", "gf2")])
    assert f"data_cache: job 101, log {run / 'data_cache' / 'slurm-101.log'}" in out
    assert "binary: job 103 (after job 101)" in out
    cache_script = (run / "data_cache" / "job.sbatch").read_text()
    for line in ("#SBATCH --nodes=1", "#SBATCH --ntasks=1", "#SBATCH --partition=cpu",
                 "#SBATCH --time=00:30:00", "    --world-size 2"):
        assert line in cache_script.splitlines(), line
    assert not [line for line in cache_script.splitlines()
                if "gpu" in line and line.startswith("#SBATCH")]
    assert "    --require-data-cache" not in cache_script.splitlines()
    arm_script = (run / "gf2" / "job.sbatch").read_text()
    assert "    --require-data-cache" in arm_script.splitlines()
    assert "--dependency" not in arm_script  # resubmitting job.sbatch by hand needs none

    built = subprocess.run(["bash", str(run / "data_cache" / "job.sbatch")], cwd=tmp_path,
                           capture_output=True, text=True,
                           env={**os.environ, "SLURM_JOB_ID": "101"})
    assert built.returncode == 0, built.stderr[-3000:]
    assert "built 6 of 6 caches" in built.stdout, built.stdout
    assert "Build and save the GPTDataset train indices" in built.stderr  # Megatron's progress
    cache = tmp_path / "cache"
    files = snapshot(cache)
    assert len(files) == 4 * 4 + 3 * 2  # 2 files x (train, valid), + the 2 splits' blends

    trained = run_pretrain(flags + ["--require-data-cache"])
    assert "dataset index caches in --data-cache-path " \
           f"{cache}: 6 loaded, none built" in trained.stdout, trained.stdout
    assert [r["iteration"] for r in trained.metrics if r["kind"] == "valid"] == [3]
    assert snapshot(cache) == files

    records = build_data_cache.main(flags)
    assert not any(r.built for r in records) and len(records) == 6
    assert "all 6 caches were already there, nothing built" in capsys.readouterr().out
    assert snapshot(cache) == files


@pytest.mark.integration
def test_a_dataset_rebuilt_in_place_gets_new_indices(tmp_path, capsys):
    """The caches are keyed by the data files' size and time too: a dataset rebuilt under the
    same prefix (40 documents appended) gets new indices, which read its new documents;
    Megatron-Core keys them by path only, and the old indices were loaded, the appended
    documents never read. The other dataset's caches are kept."""
    import numpy as np
    flags = recipe_flags(tmp_path)
    assert all(r.built for r in build_data_cache.main(flags))
    a = str(tmp_path / "a")
    make_dataset(tmp_path / "a", [20 + i % 7 for i in range(440)])  # 400 before
    rebuilt = build_data_cache.main(flags)
    assert {(r.kind, r.source) for r in rebuilt if r.built} == {
        ("GPTDataset", a), ("BlendedDataset", f"{a} {tmp_path / 'b'}")}
    assert not any(r.built for r in rebuilt if r.source == str(tmp_path / "b"))
    train = next(r for r in rebuilt if r.built and r.source == a and r.split == "train")
    documents = np.load(next(f for f in train.files if f.endswith("document_index.npy")))
    assert documents.max() >= 400  # the appended documents are drawn from


@pytest.mark.integration
def test_the_cache_job_reads_gpt2_bpe_files(tmp_path, capsys):
    """--vocab-file/--merge-file reach the builder's tokenizer (it used to ask for them)."""
    vocab, merges = map(str, gpt2_bpe_files(tmp_path))
    flags = recipe_flags(tmp_path)
    for name, lengths in (("a", [20 + i % 7 for i in range(400)]),
                          ("b", [30 + i % 5 for i in range(300)])):
        make_dataset(tmp_path / name, lengths, modulo=264)  # ids of the 264-token vocabulary
    null = flags.index("--tokenizer-type")
    records = build_data_cache.main(flags[:null] + flags[null + 4:] + [
        "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges])
    assert len(records) == 6 and all(r.built for r in records)


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_require_data_cache_refuses_to_build_for_other_flags(cpu_dist, tmp_path):
    """Caches built for --train-iters 3: a run of --train-iters 2 would need others."""
    flags = recipe_flags(tmp_path)
    build_data_cache.main(flags)
    cache = tmp_path / "cache"
    files = snapshot(cache)
    with pytest.raises(DataError, match=f"^--require-data-cache: --data-cache-path "
                                         f"{cache} holds no train indices of "):
        training_data(*flags[flags.index("--data-path"):], "--eval-iters", "2",
                      "--require-data-cache")
    assert snapshot(cache) == files
    with pytest.raises(DataError, match="does not exist"):
        training_data("--data-path", str(tmp_path / "a"), "--require-data-cache",
                      "--data-cache-path", str(tmp_path / "nowhere"))


@pytest.mark.timeout(60)
def test_a_rank_without_the_cache_path_fails_at_once_naming_it(cpu_dist, tmp_path,
                                                                monkeypatch):
    cache = tmp_path / "cache"
    # Rank 0 sees a file there that this rank does not: a node-local path, not shared.
    monkeypatch.setattr(data_cache, "_rank0_view",
                        lambda path, require: (None, None, ["x-description.txt"]))
    with pytest.raises(DataError) as e:
        data_cache.check_visible(str(cache), False)
    assert str(e.value) == data_cache.not_shared(str(cache), str(cache))
    cache.mkdir()
    with pytest.raises(DataError) as e:
        data_cache.check_visible(str(cache), False)
    assert f"error: --data-cache-path {cache}: rank 0 on " in message(e.value)
    assert "does not see x-description.txt, which rank 0 sees there: not a shared " \
           "filesystem?" in str(e.value)
    monkeypatch.undo()

    (tmp_path / "file").write_text("")
    with pytest.raises(DataError, match="rank 0 cannot write there"):
        data_cache.check_visible(str(tmp_path / "file" / "cache"), False)

    # A rank other than 0 that finds no index after rank 0's build: the flag, not numpy.
    a = make_dataset(tmp_path / "a", [20 + i % 7 for i in range(400)])
    monkeypatch.setattr(torch.distributed, "get_rank", lambda *_: 1)
    with pytest.raises(DataError, match=f"^--data-cache-path {cache}: rank 1 on .* "
                                         f"not a shared filesystem?"):
        training_data("--data-path", a, "--data-cache-path", str(cache))


@pytest.mark.integration
def test_build_cache_needs_a_cached_recipe(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "submit.py"), "--recipe",
         str(REPO / "slurm" / "recipes" / "tiny_cpu.args"), "--run-dir", str(tmp_path),
         "--gpus-per-node", "0", "--ntasks-per-node", "2", "--build-cache", "--dry-run"],
        capture_output=True, text=True)
    assert done.returncode != 0 and "--build-cache: recipe" in done.stderr \
        and "sets no --data-cache-path" in done.stderr
