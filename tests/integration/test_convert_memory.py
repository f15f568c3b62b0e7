"""The converter's memory (tools/convert_to_hf.py, megatron_ext/hf/export.py): its peak grows
by about one fp32 copy of the weights per copy more (never two: the model is read into
uninitialised weights, the export's tensors view them, and ``--validate`` reloads the export
only after the Megatron model's reference logits are taken and the model let go), under what
the up-front check asks for; a machine without that memory is refused before any work.
Checkpoints are made without training (``save_initialised_model``), as bench/bench_convert.py
makes the 1.7B one."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch

from conftest import REPO
from megatron_ext.config.arguments import add_training_args, parse_model_config
from megatron_ext.hf import export
from megatron_ext.hf.megatron_checkpoint import SavedRun, read_checkpoint
from megatron_ext.runtime.errors import DeviceError
from megatron_ext.train.setup import save_initialised_model

# Layers dominate (a small vocabulary): the two shapes differ by 7 layers of 16.8M weights
# (0.55 GiB in fp32 against 0.1 GiB: the small one's peak is the process's own).
SHAPE = ["--hidden-size", "1024", "--num-attention-heads", "16", "--ffn-hidden-size", "4096",
         "--seq-length", "64", "--tokenizer-type", "NullTokenizer", "--vocab-size", "8191",
         "--mock-data", "--bf16", "--train-iters", "1", "--device", "cpu",
         "--input-interface", "binary"]
LAYERS = (1, 8)
pytestmark = pytest.mark.xdist_group("convert_memory")  # its module fixture: built once


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, cpu_dist) -> dict:
    """``{layers: checkpoint directory}``, each the initialised model saved alone."""
    root = tmp_path_factory.mktemp("convert_memory")
    out = {}
    for layers in LAYERS:
        save = root / f"L{layers}"
        save_initialised_model(parse_model_config(
            SHAPE + ["--num-layers", str(layers), "--save", str(save)], "",
            add_training_args)[0])
        out[layers] = save
    return out


def peak_rss(argv: list) -> int:
    """The converter's peak resident set in bytes, run as a user runs it, measured as
    bench/bench_convert.py measures it (bench/ is no package)."""
    spec = importlib.util.spec_from_file_location("bench_convert",
                                                  REPO / "bench" / "bench_convert.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rc, _, peak, out = bench.measured([sys.executable, "tools/convert_to_hf.py", *argv])
    assert rc == 0, out[-3000:]
    assert "validate: max |logits_hf - logits_megatron| = 0" in out
    return peak


def fp32_weights(ckpt) -> int:
    train = read_checkpoint(str(ckpt))[1]
    return export.memory_needed(train, torch.float32) - export.PROCESS_BYTES


def test_the_peak_grows_by_one_fp32_copy_of_the_weights(checkpoints, tmp_path):
    """From 0.1 to 0.55 GiB of fp32 weights the peak grows by about the difference (the weights
    once, and what is in flight), never twice it, and stays under what the up-front check
    asks for."""
    peaks, needs = {}, {}
    for layers, ckpt in checkpoints.items():
        peaks[layers] = peak_rss(["--load", str(ckpt), "--output", str(tmp_path / str(layers)),
                                  "--validate"])
        train = read_checkpoint(str(ckpt))[1]
        needs[layers] = export.memory_needed(train, torch.float32)
        assert peaks[layers] < needs[layers]  # the up-front check asks for enough
    # memory_needed's weights: 1.5 x one fp32 copy
    weights = {layers: fp32_weights(ckpt) / 1.5 for layers, ckpt in checkpoints.items()}
    small, large = LAYERS
    growth = (peaks[large] - peaks[small]) / (weights[large] - weights[small])
    assert 0.5 < growth < 1.25, (growth, peaks, weights)


def test_a_machine_without_the_memory_is_refused_before_any_work(checkpoints, tmp_path,
                                                                 monkeypatch):
    ckpt = checkpoints[LAYERS[1]]
    train = read_checkpoint(str(ckpt))[1]
    short = export.memory_needed(train, torch.float32) - 1
    monkeypatch.setattr(export.psutil, "virtual_memory",
                        lambda: types.SimpleNamespace(available=short))
    monkeypatch.setattr(export, "load_model", lambda *a: pytest.fail("the work started"))
    with pytest.raises(DeviceError, match=r"needs about [\d.]+ GiB of memory .* GiB available"):
        export.export_checkpoint(str(ckpt), str(tmp_path / "hf"), check=True)
    assert not (tmp_path / "hf").exists()
    # a bf16 export also holds the bf16 copy it writes
    assert export.memory_needed(train, torch.bfloat16) > export.memory_needed(
        train, torch.float32)
    assert isinstance(train, SavedRun)
