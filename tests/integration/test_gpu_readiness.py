"""What a first GPU run depends on, tested on CPU where the mechanism runs there (issue #17):
mixed precision through megatron-core's own optimizer (fp16 loss scaling, bf16 main
parameters), the skip policy for non-finite steps, the layers and sequence parallelism a GPU
gets by default, the decoder's final norm, the distributed-optimizer checkpoint layout and the
MFU peaks. Training runs here are in process (the ``cpu_dist`` fixture's process group)."""

from __future__ import annotations

import itertools
import math
import os
import re
import subprocess
import sys

import pytest
import torch

from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params
from megatron.core.transformer.module import Float16Module

from conftest import REPO, TINY_RUN
from megatron_ext.checkpoint import compatibility, loading, saving
from megatron_ext.checkpoint.layout import TrainState
from megatron_ext.checkpoint.resume import resolve_checkpoint
from megatron_ext.train import setup as training_setup
from megatron_ext.hf.megatron_checkpoint import load_model, read_checkpoint
from megatron_ext.config.derived import derive
from megatron_ext.config.run_config import RunConfig
from megatron_ext.runtime.device_checks import fp8_refusal, te_pin_refusal
from megatron_ext.metrics.sinks import read_metrics
from megatron_ext.metrics.flops import flops_per_token, peak_flops
from megatron_ext.model.provider import model_provider as build_gpt
from megatron_ext.train.step import NonFiniteLossError, train_step
from megatron_ext.train.setup import (build_model_and_optimizer, check_machine_and_tokenizer,
                                      resolve_layers)
from megatron_ext.train.loop import pretrain
from megatron_ext.runtime.errors import CheckpointError, DeviceError, FixedcodeError, FlagError
import pretrain_fixedcode  # noqa: E402
from pretrain_fixedcode import datasets_provider, model_provider, parse_args
from helpers.small_model import SMALL_VOCAB, small_args

NAN = float("nan")


def poisoned_at(args, iterations, poison):
    """A callable for the once-per-micro-batch calls of training (forward steps, gradient
    hooks) of a one-rank run: ``poison(x)`` during ``iterations``, ``x`` otherwise."""
    training = args.training
    calls, per_step = itertools.count(), training.global_batch_size // training.micro_batch_size
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
    b, s = args.training.micro_batch_size, args.model.seq_length
    tokens = torch.randint(0, args.data.vocab_size, (b, s + 1))
    return {"tokens": tokens[:, :-1], "labels": tokens[:, 1:],
            "loss_mask": torch.ones(b, s), "position_ids": torch.arange(s).expand(b, -1)}


def test_bf16_wraps_the_model_and_keeps_fp32_main_parameters(cpu_dist):
    """As Megatron-LM: every parameter in bf16 (the local layers' norms included), the
    optimizer's fp32 main copies, one update through them."""
    args = parse_args(TINY_RUN + ["--input-interface", "gf2", "--bf16", "--train-iters", "1"])
    _, args, derived = check_machine_and_tokenizer(args, "cpu")
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
        path, saved, code, _ = read_checkpoint(str(ckpt), iteration)
        if iteration == 3:  # as saved before these flags existed: loads all the same
            newer = ("attention_backend", "fp32_residual_connection",
                     "cross_entropy_loss_fusion", "cross_entropy_fusion_impl")
            saved = saved._replace(config=RunConfig.from_record(
                {k: v for k, v in saved.config.record().items() if k not in newer}))
        weights[iteration] = dict(load_model(path, saved, code).named_parameters())
        assert all(torch.isfinite(w).all() for w in weights[iteration].values())
    assert all(torch.equal(weights[3][k], weights[4][k]) for k in weights[3])  # skipped
    assert not torch.equal(weights[4]["output_layer.weight"], weights[6]["output_layer.weight"])


@pytest.fixture
def te_imports(monkeypatch):
    """``te_imports(True/False)``: whether Transformer Engine 'imports' for resolve_layers;
    the 'GPU' is a Hopper (sm 9.0) launched with CUDA_DEVICE_MAX_CONNECTIONS=1."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    return lambda imports: monkeypatch.setattr(training_setup, "transformer_engine_imports",
                                               lambda: imports)


def gpu_args(*flags):
    return parse_args(TINY_RUN + ["--train-iters", "1", *flags])


def test_a_gpu_gets_transformer_engine_layers_by_default(te_imports, capsys):
    te_imports(True)
    args = gpu_args()
    assert resolve_layers(args, "cuda") == ("transformer_engine", False)
    assert args.model.transformer_impl is None  # settled, not written into the flags
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
    ("cpu", ["--attention-backend", "fused"],
     "--attention-backend fused selects Transformer Engine's fused (cuDNN) attention, which "
     "needs --transformer-impl transformer_engine"),
    ("cuda", ["--transformer-impl", "transformer_engine", "--attention-backend", "local"],
     "--attention-backend local is Megatron-Core's attention of the local layers"),
])
def test_layer_flags_that_cannot_run_are_clear_errors(te_imports, device, flags, message):
    te_imports(False)
    with pytest.raises(FixedcodeError, match=re.escape(message)):
        resolve_layers(gpu_args(*flags), device)


def test_te_layers_refuse_the_fp32_residual_stream(te_imports):
    """TE's fused norm + linear would receive the fp32 stream of --fp32-residual-connection
    (a dtype assert on the GPU): refused at start-up naming both flags, whether TE's layers
    are asked for or the GPU's default; local layers take the flag."""
    te_imports(True)
    for flags in (["--transformer-impl", "transformer_engine"], []):
        with pytest.raises(FlagError, match="--fp32-residual-connection with "
                                            "--transformer-impl transformer_engine"):
            resolve_layers(gpu_args("--bf16", "--fp32-residual-connection", *flags), "cuda")
    assert resolve_layers(gpu_args("--bf16", "--fp32-residual-connection",
                                   "--transformer-impl", "local"), "cuda")[0] == "local"


def test_sequence_parallel_is_turned_off_at_tp1_and_kept_at_tp2(te_imports, capsys):
    te_imports(False)
    args = gpu_args("--sequence-parallel")
    assert resolve_layers(args, "cuda") == ("local", False)
    assert args.parallel.sequence_parallel  # turned off for the run, not in the flags
    assert "warning: --sequence-parallel turned off" in capsys.readouterr().out
    for te in (True, False):
        te_imports(te)
        args = gpu_args("--tensor-model-parallel-size", "2", "--sequence-parallel")
        assert resolve_layers(args, "cuda") == ("transformer_engine" if te else "local", True)


@pytest.mark.parametrize("flags", [
    [], ["--transformer-impl", "local"], ["--transformer-impl", "transformer_engine"],
    ["--sequence-parallel"], ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
    ["--bf16", "--fp32-residual-connection", "--transformer-impl", "local"],
    ["--bf16", "--fp32-residual-connection"],
    ["--transformer-impl", "local", "--fp8-format", "hybrid"]])
def test_the_plan_settles_the_layers_the_run_settles(te_imports, flags):
    """Issue 58: tools/plan.py plans a GPU run (Transformer Engine importing) with the
    layers and sequence parallelism the run settles at start-up for the same flags, and
    refuses what the run refuses, with its message."""
    from megatron_ext.launch import plan
    te_imports(True)
    try:
        run = resolve_layers(gpu_args(*flags), "cuda")
    except FlagError as error:
        run = f"refused: {error}"
    try:
        planned = plan.gpu_layers(plan.run_config(TINY_RUN + ["--train-iters", "1", *flags]))
    except FlagError as error:
        planned = f"refused: {error}"
    assert planned == run
    refused = flags[-1:] == ["hybrid"] or flags == ["--bf16", "--fp32-residual-connection"]
    assert str(run).startswith("refused: ") == refused, run


def test_tensor_parallelism_on_a_gpu_needs_one_cuda_connection(te_imports, monkeypatch):
    te_imports(False)
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS")
    resolve_layers(gpu_args(), "cuda")  # TP=1: no requirement
    for flags in (["--tensor-model-parallel-size", "2"],
                  ["--tensor-model-parallel-size", "2", "--sequence-parallel"]):
        with pytest.raises(DeviceError, match="needs CUDA_DEVICE_MAX_CONNECTIONS=1"):
            resolve_layers(gpu_args(*flags), "cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (10, 0))
    resolve_layers(gpu_args("--tensor-model-parallel-size", "2"), "cuda")  # Blackwell: none


@pytest.mark.parametrize("recipe,capability,te,refusal", [
    ("delayed", (9, 0), "2.8.0", None), ("delayed", (8, 9), "1.13.0", None),
    ("delayed", (8, 0), "2.8.0", "--fp8-recipe delayed needs a GPU of sm 8.9 or newer; this "
                                  "one is sm 8.0"),
    ("delayed", (9, 0), None, "--fp8-recipe delayed needs Transformer Engine >= 1.0; none "
                              "imports"),
    ("tensorwise", (9, 0), "2.1.0", "--fp8-recipe tensorwise needs Transformer Engine >= "
                                    "2.2.0.dev0; found 2.1.0"),
    ("tensorwise", (9, 0), "2.2.0", None),
    ("blockwise", (9, 0), "2.3.0", None),
    ("blockwise", (10, 0), "2.8.0", "--fp8-recipe blockwise needs a GPU of Hopper (sm 9.0); "
                                    "this one is sm 10.0"),
    ("blockwise", (9, 0), "2.2.1", "--fp8-recipe blockwise needs Transformer Engine >= "
                                   "2.3.0.dev0; found 2.2.1"),
    ("mxfp8", (9, 0), "2.8.0", "--fp8-recipe mxfp8 needs a GPU of sm 10.0 or newer; this one "
                               "is sm 9.0"),
    ("mxfp8", (10, 0), "2.1.0", None),
])
def test_fp8_recipes_a_device_or_te_cannot_run_are_refused(recipe, capability, te, refusal):
    assert fp8_refusal(recipe, capability, te) == refusal


def test_fp8_is_refused_at_start_up(te_imports, monkeypatch):
    te_imports(True)
    monkeypatch.setattr(training_setup, "transformer_engine_version", lambda: "2.8.0")
    resolve_layers(gpu_args("--fp8-format", "hybrid", "--fp8-recipe", "blockwise"), "cuda")
    with pytest.raises(DeviceError, match="--fp8-recipe mxfp8 needs a GPU of sm 10.0"):
        resolve_layers(gpu_args("--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"), "cuda")


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

    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest

    saved = {}

    def save(sharded, path, strategy, content_metadata, async_sharded_save):
        saved.update(strategy=strategy, content_metadata=content_metadata)
        return AsyncRequest(None, (), [])

    monkeypatch.setattr(saving.dist_checkpointing, "save", save)
    args = parse_args(TINY_RUN + ["--train-iters", "1", "--save", str(tmp_path), *flags])
    model, optimizer = Recorder(), Recorder()
    scheduler = type("Scheduler", (), {"state_dict": lambda self: {}})()
    saving.start_save(args, derive(args, 1, 511), model, optimizer, scheduler,
                      TrainState(), None)
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
    _, settled, derived = check_machine_and_tokenizer(args, "cpu")
    resume = resolve_checkpoint(settled, derived)  # fresh
    code, args = resume.code, resume.config
    model, ddp, optimizer, scheduler = build_model_and_optimizer(args, derived, model_provider,
                                                                 code)
    (inner,) = optimizer.chained_optimizers
    assert isinstance(inner, DistributedOptimizer)
    batch = random_batch(args)
    train_step(args, derived.num_microbatches, pretrain_fixedcode.forward_step,
               itertools.repeat(batch), ddp, optimizer, scheduler)
    saving.save_checkpoint(args, derived, model, optimizer, scheduler,
                           TrainState(iteration=1), code)

    model2, _, optimizer2, scheduler2 = build_model_and_optimizer(args, derived, model_provider,
                                                                  code)
    path, common = loading.load_common(str(tmp_path))
    loading.load_checkpoint(path, common, model2, optimizer2, scheduler2)
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
    with pytest.raises(FlagError, match="--dist-ckpt-optim-fully-reshardable: neither "
                                         "Transformer Engine nor Apex imports"):
        check_machine_and_tokenizer(args, "cpu")


def test_dp_reshardable_optimizer_state_refuses_another_tp_size():
    saved_args = parse_args(TINY_RUN + ["--train-iters", "1",
                                        "--tensor-model-parallel-size", "2"]).record()
    args = parse_args(TINY_RUN + ["--train-iters", "1"])
    # megatron-core keeps a checkpoint's content metadata under this key of the common state
    from megatron.core.dist_checkpointing.serialization import _CONTENT_METADATA_KEY
    for layout, refused in (("dp_reshardable", True), ("fully_reshardable", False)):
        common = {"args": saved_args,
                  _CONTENT_METADATA_KEY: {"distrib_optim_sharding_type": layout}}
        if refused:
            with pytest.raises(CheckpointError, match=re.escape(
                    "CKPT holds distributed-optimizer state in the dp_reshardable layout, "
                    "which resumes at another data-parallel size only, but it was saved with "
                    "--tensor-model-parallel-size 2 (now 1)")):
                compatibility.check_optimizer_resharding(common, args.parallel, "CKPT")
        else:
            compatibility.check_optimizer_resharding(common, args.parallel, "CKPT")


@pytest.mark.parametrize("name,fp8,tflops", [
    ("NVIDIA H100 80GB HBM3", False, 989), ("NVIDIA H100 80GB HBM3", True, 1979),
    ("NVIDIA H100 PCIe", False, 756), ("NVIDIA H100 PCIe", True, 1513),
    ("NVIDIA H100 NVL", False, 835), ("NVIDIA H200 NVL", True, 1671),
    ("NVIDIA H200", True, 1979), ("NVIDIA A100-SXM4-80GB", False, 312),
    ("NVIDIA A100-SXM4-80GB", True, None), ("NVIDIA L4", False, None),
])
def test_mfu_divides_by_the_device_and_precision_peak(name, fp8, tflops):
    assert peak_flops(name, fp8) == (None if tflops is None else tflops * 1e12)


@pytest.mark.parametrize("flags", [[], ["--num-query-groups", "2"], ["--no-swiglu"]],
                         ids=["mha", "gqa", "gelu"])
def test_model_flops_are_megatron_lms_count(cpu_dist, flags):
    """Megatron-LM 0.16.1 counts 6 FLOPs per token per weight of every GEMM (the output
    logits included, no input embedding) plus, per layer, the causal half of the attention
    scores and of their product with the values: 2 x 3 x 2 x hidden x sequence / 2. The
    weights are counted here from the built model; the formula counts them from the shape."""
    args = parse_args(TINY_RUN + ["--train-iters", "1", *flags])
    model = build_gpt(args, 512, on_cpu=True)
    gemm_weights = sum(p.numel() for name, p in model.named_parameters()
                       if p.dim() == 2 and not name.startswith("embedding."))
    model_flags = args.model
    attention = 6 * model_flags.num_layers * model_flags.hidden_size * model_flags.seq_length
    assert flops_per_token(model_flags, 512) == 6 * gemm_weights + attention


def test_the_loss_is_all_reduced_once_per_step(cpu_dist, monkeypatch):
    """Four micro-batches, one all-reduce of the reported loss over the data-parallel group
    (Megatron-LM's count), and the step's loss is the mean over all of them."""
    from megatron.core import parallel_state
    args = parse_args(TINY_RUN + ["--train-iters", "1", "--global-batch-size", "8"])
    _, args, derived = check_machine_and_tokenizer(args, "cpu")
    assert derived.num_microbatches == 4
    _, ddp, optimizer, scheduler = build_model_and_optimizer(args, derived, model_provider)
    batches = [random_batch(args) for _ in range(4)]
    reduced = []
    all_reduce = torch.distributed.all_reduce

    def counting(tensor, *a, group=None, **k):
        if group is parallel_state.get_data_parallel_group():
            reduced.append(tensor.clone())
        return all_reduce(tensor, *a, group=group, **k)

    monkeypatch.setattr(torch.distributed, "all_reduce", counting)
    step = train_step(args, 4, pretrain_fixedcode.forward_step, iter(batches), ddp, optimizer,
                      scheduler)
    assert len(reduced) == 1 and \
        reduced[0][1] == 4 * args.training.micro_batch_size * args.model.seq_length
    assert step.loss == pytest.approx((reduced[0][0] / reduced[0][1]).item())


def test_manual_gc_collects_at_megatron_lms_points(cpu_dist, monkeypatch, tmp_path):
    """--manual-gc: the collector off while training, a collection at the start, every
    --manual-gc-interval steps and around each validation and the test evaluation at the
    end; back on at the end."""
    import gc
    collected, enabled = [], []
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(gc.isenabled()))
    args = parse_args(TINY_RUN + ["--train-iters", "4", "--manual-gc", "--manual-gc-interval",
                                  "2", "--eval-interval", "2", "--eval-iters", "1",
                                  "--metrics-file", str(tmp_path / "m.jsonl")])

    def forward_step(data_iterator, model):
        enabled.append(gc.isenabled())
        return pretrain_fixedcode.forward_step(data_iterator, model)

    pretrain(args, model_provider, forward_step, datasets_provider)
    assert len(collected) == 1 + 2 + 2 * 2 + 2 and not any(collected)
    assert enabled and not any(enabled) and gc.isenabled()


@pytest.mark.parametrize("arm", ["learned", "binary"])
def test_fp32_residual_connection_keeps_the_stream_in_fp32(cpu_dist, arm):
    """--bf16 --fp32-residual-connection: bf16 weights and GEMMs, the residual stream between
    the layers in fp32 (from the input on, table or code), a step trains through it.
    megatron-core 0.16.1's own residual add would cast the stream back to bf16 after the
    first layer."""
    args = parse_args(TINY_RUN + ["--input-interface", arm, "--bf16", "--train-iters", "1",
                                  "--fp32-residual-connection"])
    _, args, derived = check_machine_and_tokenizer(args, "cpu")
    model, ddp, optimizer, scheduler = build_model_and_optimizer(args, derived, model_provider)
    seen = {}
    layer = model.decoder.layers[0]

    def record(name):
        def hook(module, inputs, output):
            seen.setdefault(name, (output[0] if isinstance(output, tuple) else output).dtype)
        return hook

    for name, module in (("stream", layer), ("norm", layer.input_layernorm),
                         ("qkv", layer.self_attention.linear_qkv)):
        module.register_forward_hook(record(name))
    step = train_step(args, derived.num_microbatches, pretrain_fixedcode.forward_step,
                      itertools.repeat(random_batch(args)), ddp, optimizer, scheduler)
    assert seen == {"stream": torch.float32, "norm": torch.bfloat16, "qkv": torch.bfloat16}
    assert step.skip is None and math.isfinite(step.loss)
    assert layer.self_attention.linear_qkv.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("version,refusal", [
    ("2.9.0", None), ("2.11.0+3d4a4e6", None), ("2.10.0.dev0+abc", None),
    ("2.7.0+4e7d7c1", "Transformer Engine 2.7.0+4e7d7c1 is outside the [gpu] extra's pin"),
    ("2.15.0", "Transformer Engine 2.15.0 is outside the [gpu] extra's pin"),
    (None, "Transformer Engine does not import"),
])
def test_the_image_build_refuses_a_transformer_engine_outside_the_pin(version, refusal):
    """Against the installed package's own [gpu] requirement (pyproject.toml)."""
    import importlib.metadata
    got = te_pin_refusal(version, importlib.metadata.requires("fixedcode"))
    assert got == refusal if refusal is None else refusal in got


def test_the_process_group_is_destroyed_when_training_ends(tmp_path):
    """Left to the interpreter's exit, NCCL warns, and on the first GPU run its warning became
    the log's last line, hiding the error. The entry point destroys the group itself."""
    code = ("import sys, torch, pretrain_fixedcode as p; p.main(sys.argv[1:]); "
            "print('initialized after main:', torch.distributed.is_initialized())")
    run = subprocess.run([sys.executable, "-c", code, *TINY_RUN, "--train-iters", "1",
                          "--metrics-file", str(tmp_path / "m.jsonl")], capture_output=True,
                         text=True, timeout=300, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "initialized after main: False" in run.stdout


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_mfu_is_over_the_bf16_peak_for_bf16_and_fp8_runs(cpu_dist, monkeypatch, tmp_path,
                                                         capsys, fp8):
    """On an H100 (simulated), a bf16 and an FP8 run both divide by the dense bf16 peak, so
    that their MFU compare; the FP8 run shows its MFU of the FP8 peak beside it."""
    from megatron_ext.metrics.logger import IntervalSkips, MetricsLogger
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 4 * 2**30)
    flags = ["--bf16", "--train-iters", "1", "--metrics-file", str(tmp_path / "m.jsonl")]
    args = parse_args(TINY_RUN + flags)
    derived = derive(args, 1, 512)
    model = build_gpt(args, derived.padded_vocab_size, on_cpu=True)  # TE's layers need a GPU
    config = args.replace(fp8_format="hybrid" if fp8 else None)
    logger = MetricsLogger(config.logging, config.model, derived, model, True, 0, None,
                           device="cuda", save=None, record={})
    logger.step(1, 5.0, 1.0, 1e-3, step_time=0.5, skipped=False,
                skipped_total=0, skips=IntervalSkips())
    logger.close()
    (record,) = read_metrics(str(tmp_path / "m.jsonl"))
    flops = flops_per_token(args.model, derived.padded_vocab_size) * record["tokens-per-second"]
    assert record["tflops-per-gpu"] == pytest.approx(flops / 1e12)
    assert record["mfu"] == pytest.approx(flops / 989e12)
    assert (record["memory-gib"], record["memory-reserved-gib"]) == (3, 4)
    line = capsys.readouterr().out
    assert "MFU against the dense bf16 peak of NVIDIA H100 80GB HBM3: 989 TFLOP/s" in line
    if fp8:
        assert record["mfu-fp8-peak"] == pytest.approx(flops / 1979e12)
        assert "(FP8 peak 1,979, shown beside it)" in line and "MFU of FP8 peak:" in line
    else:
        assert "mfu-fp8-peak" not in record and "FP8" not in line
