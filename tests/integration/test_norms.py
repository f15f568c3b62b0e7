"""megatron_ext.metrics.norms: parameter and gradient norms of the whole model and of the watched
groups equal norms computed independently with torch, and stay the same at TP=2 and PP=2."""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict

import pytest
import torch
from megatron.core import dist_checkpointing

from conftest import REPO, run_torchrun_worker
from megatron_ext.metrics.norms import NormReporter, watched_groups
from helpers.norms_worker import LAYOUTS, VARIANTS, batch, build, norms_after_backward

WORKER = REPO / "tests" / "helpers" / "norms_worker.py"
# The watched layers of a 4-layer model by their 0-based index in decoder.layers (one
# process), and the watched parameters by name (every input parameter is the input's: a
# table, a factorised table's factors, a code's map).
LAYER_GROUPS = {0: "layer-01", 1: "layer-02", 3: "layer-04"}
NAMED_GROUPS = {"output_layer.weight": "output-layer"}


def torch_group_norms(model, tensor_of) -> dict[str, float]:
    """``{group: L2 norm of tensor_of(parameter) over its parameters}``, from parameter names."""
    squares = defaultdict(float)
    for name, p in model.named_parameters():
        layer = re.match(r"decoder\.layers\.(\d+)\.", name)
        group = LAYER_GROUPS.get(int(layer[1])) if layer else \
            "input-table" if name.startswith("embedding.") else NAMED_GROUPS.get(name)
        if group:
            squares[group] += tensor_of(p).double().square().sum().item()
    return {group: math.sqrt(s) for group, s in squares.items()}


def distinct_weights(model) -> None:
    """Scale every parameter by its own factor, so that no two groups have similar norms."""
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.mul_(1 + i / 16)


@pytest.mark.parametrize("num_layers, groups", [
    (1, ["input-table", "layer-01", "output-layer"]),
    (2, ["input-table", "layer-01", "layer-02", "output-layer"]),
    (4, ["input-table", "layer-01", "layer-02", "layer-04", "output-layer"]),
    (24, ["input-table", "layer-01", "layer-12", "layer-24", "output-layer"]),
])
def test_watched_groups(num_layers, groups):
    assert watched_groups(num_layers) == groups


@pytest.mark.parametrize("num_layers", [1, 2])
def test_few_layers_report_each_layer_once(cpu_dist, num_layers):
    _, model = build("learned", num_layers)
    assert list(NormReporter(model).param_norms()) == watched_groups(num_layers)


@pytest.mark.parametrize("variant, absent", [("learned", None), ("learned-tied", "output-layer"),
                                             ("binary", "input-table"), ("factorized", None),
                                             ("binary-map", None)])
def test_param_norms_equal_torch(cpu_dist, variant, absent):
    """A tied table is the input table; a fixed-code input has none: absent, not 0."""
    _, model = build(variant)
    distinct_weights(model)
    reporter = NormReporter(model)
    norms = reporter.param_norms()
    assert norms == pytest.approx(torch_group_norms(model, lambda p: p), rel=1e-6)
    assert list(norms) == [g for g in watched_groups(4) if g != absent]
    everything = sum(p.double().square().sum().item() for p in model.parameters())
    assert reporter.params_norm() == pytest.approx(math.sqrt(everything), rel=1e-6)


@pytest.mark.parametrize("variant", ["learned", "binary", "factorized", "binary-map"])
def test_grad_norms_equal_torch(cpu_dist, variant):
    """Megatron DDP's ``main_grad`` when there is one (``.grad`` is then None), else ``.grad``:
    the same gradients either way."""
    args, model = build(variant)
    distinct_weights(model)
    _, plain = build(variant)
    plain.load_state_dict(model.state_dict())
    through_ddp = norms_after_backward(args, model)["grad_norms"]
    assert all(p.grad is None for p in model.parameters())
    assert through_ddp == pytest.approx(torch_group_norms(model, lambda p: p.main_grad), rel=1e-6)

    data = batch(args.model.seq_length)
    plain(data["tokens"], data["position_ids"], None, labels=data["labels"]).mean().backward()
    reporter = NormReporter(plain)
    norms = reporter.grad_norms()
    assert norms == pytest.approx(torch_group_norms(plain, lambda p: p.grad), rel=1e-6)
    assert norms == pytest.approx(through_ddp, rel=1e-5)
    assert reporter.grad_norms(loss_scale=4.0) == pytest.approx(
        {group: norm / 4 for group, norm in norms.items()}, rel=1e-6)


@pytest.mark.integration
def test_norms_equal_at_tp1_tp2_and_pp2(cpu_dist, tmp_path):
    """Tensor-parallel duplicates count once; under pipelining layers keep their global
    numbers and the last stage's copy of a tied table is not counted again."""
    expected = {}
    for variant in VARIANTS:
        args, model = build(variant)
        distinct_weights(model)
        (tmp_path / variant).mkdir()
        dist_checkpointing.save(model.sharded_state_dict(), str(tmp_path / variant))
        expected[variant] = norms_after_backward(args, model)
    run_torchrun_worker(WORKER, tmp_path, timeout=300)
    results = json.loads((tmp_path / "norms.json").read_text())
    assert set(results) == set(LAYOUTS)
    for layout, by_variant in results.items():
        assert set(by_variant) == set(VARIANTS)
        for variant, norms in by_variant.items():
            want = expected[variant]
            where = f"{variant} at {layout}"
            assert norms["params_norm"] == pytest.approx(want["params_norm"], rel=1e-5), where
            assert norms["param_norms"] == pytest.approx(want["param_norms"], rel=1e-5), where
            assert norms["grad_norms"] == pytest.approx(want["grad_norms"], rel=1e-5), where
