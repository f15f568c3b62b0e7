"""What a training run records besides its checkpoints: the metrics file, TensorBoard and
wandb (the same scalars in all three, one wandb run across a resume), the optional norm
diagnostics, checkpoint provenance, and tools/training_report.py over the metrics files."""

from __future__ import annotations

import glob
import os
import re
import shutil
import struct

import pytest
import torch

from conftest import TIMING, TINY_RUN, run_pretrain, step_losses
from megatron_ext.checkpoint import layout, loading, manifest
from megatron_ext.runtime.errors import CheckpointError
from megatron_ext.runtime.megatron_compat import installed_release
from helpers.saves import rewrite_common



def wandb_records(path: str):
    """The protobuf records of a wandb ``.wandb`` run file (LevelDB-log framing: a 7-byte
    file header, then 32 KiB blocks of records with a 7-byte header: crc, length, type)."""
    from wandb.proto.wandb_internal_pb2 import Record
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", path
    pos, payload = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # block trailer
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        payload += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            yield Record.FromString(payload)
            payload = b""


def wandb_history(wandb_dir) -> tuple[set, dict]:
    """``(run ids, {(step, key): value})`` over every offline run under ``wandb_dir``."""
    import json
    ids, history = set(), {}
    for path in glob.glob(f"{wandb_dir}/wandb/offline-run-*/run-*.wandb"):
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
            elif kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                         for i in record.history.item}
                step = items.pop("_step")
                history.update({(step, k): v for k, v in items.items()
                                if not k.startswith("_")})
    return ids, history


# One worker runs the file (pytest-xdist --dist loadgroup), so its module fixtures are built
# once, not once per worker that gets one of its tests.
pytestmark = pytest.mark.xdist_group("run_records")


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """A learned-arm run interrupted at iteration 2 and resumed to 4, with every record on:
    ``(save dir, TensorBoard dir, first run, resumed run)``."""
    tmp = tmp_path_factory.mktemp("records")
    ckpt, tb = tmp / "ckpt", tmp / "tb"
    run = TINY_RUN + ["--input-interface", "learned", "--train-iters", "4",
                      "--eval-interval", "2", "--eval-iters", "1", "--save", ckpt,
                      "--load", ckpt, "--tensorboard-dir", tb, "--wandb-project", "fixedcode",
                      "--log-params-norm", "--log-num-zeros-in-grad", "--log-layer-norms"]
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    first = run_pretrain(run + ["--exit-interval", "2"], env=env)
    second = run_pretrain(run, env=env)
    assert "resumed from" in second.stdout
    return ckpt, tb, first, second


@pytest.mark.integration
def test_the_metrics_file_holds_each_iteration_once_with_the_diagnostics(resumed_run):
    _, _, first, second = resumed_run
    records = second.metrics
    assert [(r["kind"], r["iteration"]) for r in records] == [
        ("train", 1), ("train", 2), ("valid", 2), ("train", 3), ("train", 4), ("valid", 4),
        ("test", 4)]
    assert records[:3] == first.metrics  # the first run's records are kept as written
    assert [r["tokens"] for r in records if r["kind"] == "train"] == [128, 256, 384, 512]
    train = records[-3]
    for key in ("params-norm", "num-zeros", "grad-norm/input-table", "grad-norm/layer-01",
                "grad-norm/layer-02", "grad-norm/output-layer", "params-norm/input-table",
                "params-norm/output-layer"):
        assert key in train, key
    assert train["params-norm"] > train["params-norm/layer-01"] > 0
    assert "  norms: grad-norm/input-table" in second.stdout


@pytest.mark.integration
def test_tensorboard_holds_the_metrics_file_scalars(resumed_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    _, tb, _, second = resumed_run
    events = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    events.Reload()
    for r in second.metrics:
        for key, value in r.items():
            if key not in {"kind", "iteration", "consumed_samples", "tokens", "time"}:
                logged = {e.step: e.value for e in events.Scalars(key)}
                assert logged[r["iteration"]] == pytest.approx(value, rel=1e-6), key


@pytest.mark.integration
def test_tensorboard_takes_each_iterations_values_as_megatron_lms(tmp_path):
    """--tensorboard-log-interval (Megatron-LM's, default 1): TensorBoard holds each
    iteration's own loss, learning rate, batch size and grad norm (also by consumed samples),
    as Megatron-LM writes them, while the log line and the metrics file keep one record per
    --log-interval; --tensorboard-log-interval 2 writes every other iteration."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from helpers.megatron_log import training_lines
    every = run_pretrain(TINY_RUN + ["--train-iters", "4"])  # a line per iteration

    def scalars(folder, *flags):
        run_pretrain(TINY_RUN + ["--train-iters", "4", "--log-interval", "4",
                                 "--tensorboard-dir", str(folder), *flags])
        events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        events.Reload()
        return {tag: {e.step: e.value for e in events.Scalars(tag)}
                for tag in events.Tags()["scalars"]}

    logged = scalars(tmp_path / "tb")
    lines = {int(m["iteration"]): m for m in training_lines(every.stdout)}
    for tag, field in (("lm loss", "lm_loss"), ("grad-norm", "grad_norm"),
                       ("learning-rate", "learning_rate")):
        assert logged[tag] == pytest.approx({i: float(m[field]) for i, m in lines.items()},
                                            rel=1e-3, abs=1e-3), tag
    assert logged["batch-size"] == {1: 4, 2: 4, 3: 4, 4: 4}
    assert sorted(logged["lm loss vs samples"]) == [4, 8, 12, 16]
    assert sorted(logged["tokens-per-second"]) == [4]  # the interval's, at --log-interval
    assert sorted(scalars(tmp_path / "tb2", "--tensorboard-log-interval", "2")["lm loss"]) \
        == [2, 4]


@pytest.mark.integration
def test_wandb_offline_holds_the_same_scalars_in_one_run_across_the_resume(resumed_run):
    ckpt, _, _, second = resumed_run
    ids, history = wandb_history(ckpt / "wandb")
    assert len(ids) == 1 and len(glob.glob(f"{ckpt}/wandb/wandb/offline-run-*")) == 2
    (saved_id,) = ids
    assert loading.load_common(str(ckpt))[1]["wandb_run_id"] == saved_id
    for r in second.metrics:
        for key, value in r.items():
            if key not in TIMING | {"kind", "iteration", "consumed_samples", "tokens"}:
                assert history[(r["iteration"], key)] == value, key


@pytest.mark.integration
def test_a_checkpoint_records_provenance_and_a_newer_format_is_refused(resumed_run, tmp_path):
    import megatron.core
    ckpt = tmp_path / "ckpt"
    shutil.copytree(resumed_run[0] / "iter_0000004", ckpt / "iter_0000004")
    path, common = loading.load_common(str(ckpt), 4)
    assert common["checkpoint_format"] == layout.CHECKPOINT_FORMAT
    assert common["megatron_core_version"] == installed_release()
    assert installed_release() in megatron.core.__version__
    assert common["fixedcode_version"] == "0.1.0"
    assert common["working_directory"] == os.getcwd()  # the run started here (in-process)
    rewrite_common(ckpt, 4, lambda saved: {**saved, "checkpoint_format": 99,
                                           "fixedcode_version": "9.9"})
    with pytest.raises(CheckpointError, match=re.escape(
            f"{path} has checkpoint format 99 (written by fixedcode 9.9, megatron-core "
            f"{installed_release()}); "
            f"this fixedcode 0.1.0 reads formats up to {layout.CHECKPOINT_FORMAT}")):
        loading.load_common(str(ckpt), 4)


def test_provenance_works_from_a_source_checkout(monkeypatch):
    """Run from a git checkout on PYTHONPATH (no installed package metadata), as on the first
    GPU run: the first save used to die with PackageNotFoundError."""
    from importlib import metadata
    import megatron_ext
    installed = metadata.version("fixedcode")

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(metadata, "version", not_installed)
    assert layout.provenance()["fixedcode_version"] == megatron_ext.__version__ == installed


@pytest.mark.integration
def test_training_report_reads_run_directories_and_metrics_files(resumed_run, tmp_path):
    from tools import training_report
    ckpt, _, _, second = resumed_run
    png, md = tmp_path / "valid.png", tmp_path / "report.md"
    table = training_report.main([f"learned={ckpt}", f"again={ckpt / 'metrics.jsonl'}",
                                  "--plot", str(png), "--markdown", str(md)])
    for arm in ("learned", "again"):
        assert table[arm]["iteration"] == 4
        assert table[arm]["train_loss"] == step_losses(second)[4]
        assert table[arm]["valid_loss"] == second.metrics[-2]["lm loss validation"]
        assert table[arm]["test_loss"] == second.metrics[-1]["lm loss test"]
        assert f"| {arm} | 4 | {table[arm]['train_loss']:.4f} |" in md.read_text()
    assert png.read_bytes().startswith(b"\x89PNG")
    with pytest.raises(SystemExit, match="expected ARM=RUN_DIR"):
        training_report.main([str(ckpt)])
    (tmp_path / "bad.jsonl").write_text('{"kind": "train", "iteration": 1}\nnot json\n')
    with pytest.raises(SystemExit, match=re.escape(f"{tmp_path / 'bad.jsonl'}:2: not a JSON")):
        training_report.main([f"x={tmp_path / 'bad.jsonl'}"])
