"""What a first GPU run depends on, tested on CPU where the mechanism runs there (issue #17):
mixed precision through megatron-core's own optimizer (fp16 loss scaling, bf16 main
parameters), the skip policy for non-finite steps, the layers and sequence parallelism a GPU
gets by default, the decoder's final norm, the distributed-optimizer checkpoint layout and the
MFU peaks. Training runs here are in process (the ``cpu_dist`` fixture's process group)."""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch

from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params
from megatron.core.transformer.module import Float16Module

from conftest import TINY_RUN
from megatron_ext import checkpointing, training
from megatron_ext.hf.megatron_checkpoint import load_model, read_checkpoint
from megatron_ext.derived import derive
from megatron_ext.metric_sinks import read_metrics
from megatron_ext.metrics import peak_flops
from megatron_ext.model import model_provider as build_gpt
from megatron_ext.training import (NonFiniteLossError, build_model_and_optimizer, pretrain,
                                   resolve_layers, setup_args, train_step)
import pretrain_fixedcode  # noqa: E402
from pretrain_fixedcode import datasets_provider, model_provider, parse_args
from test_embedding import SMALL_VOCAB, small_args

NAN = float("nan")


def poisoned_at(args, iterations, poison):
    """A callable for the once-per-micro-batch calls of training (forward steps, gradient
    hooks) of a one-rank run: ``poison(x)`` during ``iterations``, ``x`` otherwise."""
    calls, per_step = itertools.count(), args.global_batch_size // args.micro_batch_size
    return lambda x: poison(x) if next(calls) // per_step + 1 in iterations else x


@pytest.mark.integration
def test_fp16_overflows_are_counted_apart_and_a_nan_loss_still_stops(cpu_dist, tmp_path):
    """--fp16 on the CPU backend, through megatron-core's mixed-precision optimizer: the
    dynamic loss scaler starts at 2^32 and skips the first steps while it comes down; those
    skips are counted apart (more of them than --max-nonfinite-steps, and training goes on
    with updates), while NaN losses from iteration 24 on stop the run after 3."""
    metrics = tmp_path / "metrics.jsonl"
    args = parse_args(TINY_RUN + ["--input-interface", "binary", "--fp16", "--train-iters", "40",
                                  "--max-nonfinite-steps", "3", "--metrics-file", str(metrics)])
    step = pretrain_fixedcode.forward_step
    nan_loss = poisoned_at(args, range(24, 41), lambda output: output * NAN)

    def forward_step(data_iterator, model):
        output, loss_func = step(data_iterator, model)
        return nan_loss(output), loss_func

    with pytest.raises(NonFiniteLossError, match=re.escape(
            "3 non-finite steps in a row (--max-nonfinite-steps 3) at iteration 26, the last: "
            "non-finite loss; the last good checkpoint is intact")):
        pretrain(args, model_provider, forward_step, datasets_provider)
    train = {r["iteration"]: r for r in read_metrics(str(metrics)) if r["kind"] == "train"}
    assert sorted(train) == list(range(1, 26))
    updated = [i for i in range(1, 24) if "grad-norm" in train[i]]
    overflows = 23 - len(updated)
    assert train[23]["overflow-skipped-iterations"] == overflows > 3
    assert updated[-5:] == [19, 20, 21, 22, 23]  # the scale has settled
    assert train[1]["loss-scale"] == 2.0 ** 32 > train[23]["loss-scale"]
    assert train[23]["skipped-iterations"] == 0 and train[25]["skipped-iterations"] == 2
    assert train[23]["lm loss"] < train[updated[0]]["lm loss"]
    assert "lm loss" not in train[25]  # a non-finite loss is not averaged into the log


def random_batch(args) -> dict:
    """One micro-batch of random tokens, as the data loader gives it."""
    tokens = torch.randint(0, args.vocab_size, (args.micro_batch_size, args.seq_length + 1))
    return {"tokens": tokens[:, :-1], "labels": tokens[:, 1:],
            "loss_mask": torch.ones(args.micro_batch_size, args.seq_length),
            "position_ids": torch.arange(args.seq_length).expand(args.micro_batch_size, -1)}


def test_bf16_wraps_the_model_and_keeps_fp32_main_parameters(cpu_dist):
    """As Megatron-LM: every parameter in bf16 (the local layers' norms included), the
    optimizer's fp32 main copies, one update through them."""
    args = parse_args(TINY_RUN + ["--input-interface", "gf2", "--bf16", "--train-iters", "1"])
    _, derived, resolved = setup_args(args, "cpu")
    args = resolved.applied_to(args)
    model, ddp, optimizer, scheduler = build_model_and_optimizer(args, derived, model_provider)
    assert isinstance(ddp.module, Float16Module) and ddp.module.module is model
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    (inner,) = optimizer.chained_optimizers
    assert isinstance(inner, Float16OptimizerWithFloat16Params)
    main = [p.main_param for p in model.parameters()]  # set by the optimizer, per parameter
    assert {p.dtype for p in main} == {torch.float32}
    before = [p.detach().clone() for p in main]
    batch = random_batch(args)
    step = train_step(args, derived.num_microbatches, pretrain_fixedcode.forward_step,
                      itertools.repeat(batch), ddp, optimizer, scheduler)
    assert step.skip is None and math.isfinite(step.loss) and step.grad_norm > 0
    assert all(not torch.equal(p, b) for p, b in zip(main, before))
    assert all(torch.equal(p.detach(), p.main_param.bfloat16()) for p in model.parameters())


@pytest.mark.integration
def test_a_nan_gradient_with_a_finite_loss_is_never_applied(cpu_dist, tmp_path):
    """One NaN in one gradient at iteration 4 (the loss stays finite): that update is
    skipped and counted, training goes on, and no checkpoint holds a NaN."""
    ckpt = tmp_path / "ckpt"
    args = parse_args(TINY_RUN + ["--input-interface", "gf2", "--train-iters", "6",
                                  "--save", str(ckpt), "--save-interval", "1"])

    def one_nan(grad):
        grad = grad.clone()
        grad.view(-1)[0] = NAN
        return grad

    def provider(args, padded_vocab_size, pre_process=True, post_process=True, code=None):
        model = model_provider(args, padded_vocab_size, pre_process, post_process, code)
        model.output_layer.weight.register_hook(poisoned_at(args, {4}, one_nan))
        return model

    result = pretrain(args, provider, pretrain_fixedcode.forward_step, datasets_provider)
    assert result.iteration == 6
    train = {r["iteration"]: r for r in read_metrics(str(ckpt)) if r["kind"] == "train"}
    assert [train[i]["skipped-iterations"] for i in range(1, 7)] == [0, 0, 0, 1, 1, 1]
    assert "grad-norm" not in train[4] and math.isfinite(train[4]["lm loss"])
    weights = {}
    for iteration in (3, 4, 6):
        path, saved_args, code, _ = read_checkpoint(str(ckpt), iteration)
        weights[iteration] = dict(load_model(path, saved_args, code).named_parameters())
        assert all(torch.isfinite(w).all() for w in weights[iteration].values())
    assert all(torch.equal(weights[3][k], weights[4][k]) for k in weights[3])  # skipped
    assert not torch.equal(weights[4]["output_layer.weight"], weights[6]["output_layer.weight"])


@pytest.fixture
def te_imports(monkeypatch):
    """``te_imports(True/False)``: whether Transformer Engine 'imports' for resolve_layers."""
    return lambda imports: monkeypatch.setattr(training, "transformer_engine_imports",
                                               lambda: imports)


def gpu_args(*flags):
    return parse_args(TINY_RUN + ["--train-iters", "1", *flags])


def test_a_gpu_gets_transformer_engine_layers_by_default(te_imports, capsys):
    te_imports(True)
    args = gpu_args()
    assert resolve_layers(args, "cuda") == ("transformer_engine", False)
    assert args.transformer_impl is None  # settled, not written into the flags
    te_imports(False)
    assert resolve_layers(gpu_args(), "cuda")[0] == "local"
    assert capsys.readouterr().out.count("[fixedcode] --transformer-impl local (the default on "
                                         "a GPU: Transformer Engine does not import") == 1
    assert resolve_layers(gpu_args("--transformer-impl", "local"), "cuda")[0] == "local"
    assert capsys.readouterr().out == ""
    te_imports(True)  # TE importable or not, a CPU run keeps the local layers
    assert resolve_layers(gpu_args(), "cpu")[0] == "local"


@pytest.mark.parametrize("device,flags,message", [
    ("cpu", ["--transformer-impl", "transformer_engine"],
     "--transformer-impl transformer_engine needs a GPU"),
    ("cuda", ["--fp8-format", "hybrid"],
     "--fp8-format needs --transformer-impl transformer_engine"),
    ("cuda", ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
     "--sequence-parallel needs --transformer-impl transformer_engine: the local layers' "
     "RMSNorm (torch's) does not support sequence parallelism"),
])
def test_layer_flags_that_cannot_run_are_clear_errors(te_imports, device, flags, message):
    te_imports(False)
    with pytest.raises(SystemExit, match=re.escape(message)):
        resolve_layers(gpu_args(*flags), device)


def test_sequence_parallel_is_turned_off_at_tp1_and_kept_with_te_layers(te_imports, capsys):
    te_imports(False)
    args = gpu_args("--sequence-parallel")
    assert resolve_layers(args, "cuda") == ("local", False)
    assert args.sequence_parallel  # turned off for the run, not in the flags
    assert "warning: --sequence-parallel turned off" in capsys.readouterr().out
    te_imports(True)
    args = gpu_args("--tensor-model-parallel-size", "2", "--sequence-parallel")
    assert resolve_layers(args, "cuda") == ("transformer_engine", True)


def test_the_final_norm_never_comes_from_transformer_engine(cpu_dist, monkeypatch):
    """Where Transformer Engine imports (the NGC image), megatron-core's transformer block
    takes TE's norm as the final norm of any layer spec (``LayerNormImpl``, settled when it
    is imported); TE's norm is CUDA-only. Simulated: ``LayerNormImpl`` is what TE's import
    makes it, a norm that fails when built. The local layers get their own norm."""
    from megatron.core.transformer import transformer_block

    class TENormStub:
        def __new__(cls, *args, **kwargs):
            raise AssertionError("Transformer Engine's norm was built for the local layers")

    monkeypatch.setattr(transformer_block, "LayerNormImpl", TENormStub)
    model = build_gpt(small_args("binary"), SMALL_VOCAB, on_cpu=True)
    norm = model.decoder.final_layernorm
    assert type(norm) is type(model.decoder.layers[0].input_layernorm) is torch.nn.RMSNorm
    ids = torch.randint(0, 500, (2, 16))
    assert torch.isfinite(model(ids, torch.arange(16).expand(2, 16), None)).all()


class Recorder:
    """A model or optimizer that records the metadata its sharded state is asked with."""

    def __init__(self):
        self.metadata = None

    def sharded_state_dict(self, *args, metadata=None, **kwargs):
        self.metadata = metadata
        return {}


@pytest.mark.parametrize("flags,layout", [
    (["--use-distributed-optimizer"], "dp_reshardable"),
    (["--use-distributed-optimizer", "--dist-ckpt-optim-fully-reshardable"],
     "fully_reshardable"),
    ([], None),
])
def test_checkpoints_name_their_optimizer_layout_and_save_in_parallel(
        cpu_dist, monkeypatch, tmp_path, flags, layout):
    """The metadata Megatron-LM passes: the distributed optimizer's layout (not the
    deprecated default fully_sharded_model_space) and the data-parallel group, to the model
    and the optimizer; stored as the checkpoint's content metadata (without the group); the
    save spread over data-parallel ranks."""
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelSaveStrategyWrapper)

    saved = {}
    monkeypatch.setattr(checkpointing.dist_checkpointing, "save",
                        lambda sharded, path, strategy, content_metadata: saved.update(
                            strategy=strategy, content_metadata=content_metadata))
    args = parse_args(TINY_RUN + ["--train-iters", "1", "--save", str(tmp_path), *flags])
    model, optimizer = Recorder(), Recorder()
    scheduler = type("Scheduler", (), {"state_dict": lambda self: {}})()
    checkpointing.save_checkpoint(args, derive(args, 1, 511), model, optimizer, scheduler,
                                  checkpointing.TrainState(), None)
    dp_group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    expected = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    if layout:
        expected["distrib_optim_sharding_type"] = layout
    assert saved["content_metadata"] == expected
    assert model.metadata == optimizer.metadata == {**expected, "dp_cp_group": dp_group}
    assert isinstance(saved["strategy"], FullyParallelSaveStrategyWrapper)
    assert saved["strategy"].parallelization_group is dp_group


def test_distributed_optimizer_saves_and_resumes_without_te_or_apex(cpu_dist, tmp_path):
    """The first GPU run (H200, no TE, no Apex: torch's Adam inside the distributed optimizer)
    saved, then died resuming: megatron-core 0.16.1 builds the loading template from the
    optimizer's per-parameter ``step``, which torch's Adam creates only at its first step.
    At one rank the distributed optimizer runs on CPU too: train a step, save, resume in a new
    model and optimizer, and find the same state."""
    args = parse_args(TINY_RUN + ["--input-interface", "binary", "--bf16", "--train-iters", "1",
                                  "--use-distributed-optimizer", "--save", str(tmp_path)])
    _, derived, resolved = setup_args(args, "cpu")
    _, _, code, resolved = training.resolve_checkpoint(args, derived, resolved)  # fresh
    args = resolved.applied_to(args)
    model, ddp, optimizer, scheduler = build_model_and_optimizer(args, derived, model_provider,
                                                                 code)
    (inner,) = optimizer.chained_optimizers
    assert isinstance(inner, DistributedOptimizer)
    batch = random_batch(args)
    train_step(args, derived.num_microbatches, pretrain_fixedcode.forward_step, itertools.repeat(batch),
               ddp, optimizer, scheduler)
    checkpointing.save_checkpoint(args, derived, model, optimizer, scheduler,
                                  checkpointing.TrainState(iteration=1), code)

    model2, _, optimizer2, scheduler2 = build_model_and_optimizer(args, derived, model_provider,
                                                                  code)
    path, common = checkpointing.load_common(str(tmp_path))
    checkpointing.load_checkpoint(path, common, model2, optimizer2, scheduler2)
    (inner2,) = optimizer2.chained_optimizers
    saved, loaded = inner.optimizer.state_dict(), inner2.optimizer.state_dict()
    assert saved["state"].keys() == loaded["state"].keys() and saved["state"]
    for i, state in saved["state"].items():
        assert state.keys() == loaded["state"][i].keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert state["step"] == 1
        assert all(torch.equal(v, loaded["state"][i][k]) for k, v in state.items()), i
    mains = [[p for g in o.optimizer.param_groups for p in g["params"]] for o in (inner, inner2)]
    assert all(torch.equal(a, b) for a, b in zip(*mains))  # the fp32 main parameters
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))


def test_the_fully_reshardable_layout_is_refused_without_te_or_apex(cpu_dist):
    """megatron-core 0.16.1 cannot load torch's Adam state in that layout (its parameter-state
    copy expects a ``step`` it never reads): refused before training, not at the resume."""
    args = parse_args(TINY_RUN + ["--train-iters", "1", "--use-distributed-optimizer",
                                  "--dist-ckpt-optim-fully-reshardable"])
    with pytest.raises(SystemExit, match="--dist-ckpt-optim-fully-reshardable: neither "
                                         "Transformer Engine nor Apex imports"):
        setup_args(args, "cpu")


def test_dp_reshardable_optimizer_state_refuses_another_tp_size():
    saved_args = vars(parse_args(TINY_RUN + ["--train-iters", "1",
                                             "--tensor-model-parallel-size", "2"]))
    args = parse_args(TINY_RUN + ["--train-iters", "1"])
    # megatron-core keeps a checkpoint's content metadata under this key of the common state
    from megatron.core.dist_checkpointing.serialization import _CONTENT_METADATA_KEY
    for layout, refused in (("dp_reshardable", True), ("fully_reshardable", False)):
        common = {"args": saved_args,
                  _CONTENT_METADATA_KEY: {"distrib_optim_sharding_type": layout}}
        if refused:
            with pytest.raises(SystemExit, match=re.escape(
                    "CKPT holds distributed-optimizer state in the dp_reshardable layout, "
                    "which resumes at another data-parallel size only, but it was saved with "
                    "--tensor-model-parallel-size 2 (now 1)")):
                checkpointing.check_optimizer_resharding(common, args, "CKPT")
        else:
            checkpointing.check_optimizer_resharding(common, args, "CKPT")


@pytest.mark.parametrize("name,fp8,tflops", [
    ("NVIDIA H100 80GB HBM3", False, 989), ("NVIDIA H100 80GB HBM3", True, 1979),
    ("NVIDIA H100 PCIe", False, 756), ("NVIDIA H100 PCIe", True, 1513),
    ("NVIDIA H100 NVL", False, 835), ("NVIDIA H200 NVL", True, 1671),
    ("NVIDIA H200", True, 1979), ("NVIDIA A100-SXM4-80GB", False, 312),
    ("NVIDIA A100-SXM4-80GB", True, None), ("NVIDIA L4", False, None),
])
def test_mfu_divides_by_the_device_and_precision_peak(name, fp8, tflops):
    assert peak_flops(name, fp8) == (None if tflops is None else tflops * 1e12)
