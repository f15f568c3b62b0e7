"""The levers toward a higher MFU without Transformer Engine, each against its reference on
CPU: torch's fused AdamW (``--torch-adam-fused``) against its for-each update, also through
the distributed optimizer, interrupted and resumed; Megatron-Core's native fused
cross-entropy (``--cross-entropy-loss-fusion``) against the unfused loss under --bf16. The
fused cross-entropy's functions are torch.compile'd by megatron-core; compiling them on
CPU takes over a minute here, so these runs execute them eagerly (dynamo disabled): the
arithmetic is the one compiled on a GPU, the compilation itself is the GPU check's.

torch.compile of each layer (``--torch-compile-layers``) runs on CPU with the ``aot_eager``
backend: dynamo's capture of each layer as one graph and AOTAutograd's forward and backward
graphs are the ones inductor gets on a GPU, but the kernels are torch's own (inductor's C++
compile took 28 s here for the tiny model); inductor's Triton kernels are the GPU-only
test's and the GPU check's."""

from __future__ import annotations

import re

import pytest
import torch

from conftest import TINY_RUN, run_pretrain, step_losses
from megatron_ext.runtime.megatron_compat import mlp_submodules

STEPS = 6
ARM = ["--input-interface", "binary", "--train-iters", str(STEPS)]


def grad_norms(run) -> dict[int, float]:
    return {r["iteration"]: r["grad-norm"] for r in run.metrics if r["kind"] == "train"}


@pytest.mark.integration
def test_fused_adamw_equals_the_for_each_update_and_resumes(tmp_path, monkeypatch):
    import torch
    calls = []
    fused_update = torch._fused_adamw_
    monkeypatch.setattr(torch, "_fused_adamw_", lambda *a, **k: calls.append(1)
                        or fused_update(*a, **k))
    reference = run_pretrain(TINY_RUN + ARM + ["--torch-adam-fused", "off"])
    assert "fused kernel" not in reference.stdout and not calls
    fused = run_pretrain(TINY_RUN + ARM + ["--torch-adam-fused", "on"])
    assert len(calls) >= STEPS  # the fused kernel made the updates
    assert "[fixedcode] optimizer: torch's AdamW with its fused kernel" in fused.stdout
    want = step_losses(reference)
    assert sorted(want) == list(range(1, STEPS + 1)) and want[STEPS] < want[1]
    for it, loss in step_losses(fused).items():
        assert loss == pytest.approx(want[it], abs=1e-5), it
    ckpt = ["--save", tmp_path / "ckpt", "--load", tmp_path / "ckpt", "--torch-adam-fused", "on",
            "--use-distributed-optimizer"]
    first = run_pretrain(TINY_RUN + ARM + ckpt + ["--exit-interval", "3"])
    resumed = run_pretrain(TINY_RUN + ARM + ckpt)
    assert "at iteration 3" in resumed.stdout
    got = {**step_losses(first), **step_losses(resumed)}
    assert sorted(got) == sorted(want)
    for it, loss in got.items():
        assert loss == pytest.approx(want[it], abs=1e-5), it
    # auto: the fused kernel on a GPU only
    assert "fused kernel" not in run_pretrain(TINY_RUN + ARM[:2] + ["--train-iters", "1"]).stdout


@pytest.mark.integration
def test_native_fused_cross_entropy_equals_the_unfused_loss_in_bf16(monkeypatch):
    from megatron.core.models.common.language_module import language_module
    # dynamo's own patch: monkeypatch's undo deleted the option (torch's config module answers
    # through __getattr__), and every later torch.compile in this process failed
    with torch._dynamo.config.patch(disable=True):
        calls = []
        fused_loss = language_module.fused_vocab_parallel_cross_entropy
        monkeypatch.setattr(language_module, "fused_vocab_parallel_cross_entropy",
                            lambda *a: calls.append(1) or fused_loss(*a))
        run = TINY_RUN + ARM + ["--bf16"]
        unfused = run_pretrain(run)
        assert not calls  # off on CPU by default
        fused = run_pretrain(run + ["--cross-entropy-loss-fusion"])
        assert len(calls) == 2 * STEPS  # TINY_RUN: 2 micro-batches of 2 per global batch of 4
        assert step_losses(fused) == pytest.approx(step_losses(unfused), abs=1e-6)
        assert grad_norms(fused) == pytest.approx(grad_norms(unfused), rel=1e-5)
        assert step_losses(unfused)[STEPS] < step_losses(unfused)[1]


@pytest.mark.integration
def test_the_gpus_fused_swiglu_compiles_into_the_layers_one_graph(cpu_dist, fresh_dynamo,
                                                                  monkeypatch):
    """On a GPU without TE or apex the one fusion in a local layer is megatron-core's fused
    SwiGLU (an autograd.Function over torch.compile'd kernels; RoPE's fusion needs TE, the
    gradient accumulation's and the softmax's apex). Switched on here on CPU: the layer calls
    it, equals the unfused layer, and compiled (fullgraph) is still one graph whose forward
    and gradients equal the unfused eager layer's."""
    from megatron.core.transformer import mlp
    from megatron_ext.model import provider
    from megatron_ext.train.compile_layers import compile_layers
    torch.manual_seed(0)
    plain, inputs = tiny_layers()
    cpu_fusions = provider.fusions
    monkeypatch.setattr(provider, "fusions", lambda args, on_cpu: {
        **cpu_fusions(args, on_cpu), "bias_activation_fusion": True})
    torch.manual_seed(0)
    fused, _ = tiny_layers()
    calls = []
    fused_swiglu = mlp.bias_swiglu_impl
    monkeypatch.setattr(mlp, "bias_swiglu_impl",
                        lambda *a, **k: calls.append(1) or fused_swiglu(*a, **k))
    hidden = torch.randn(32, 2, 64)

    def forward_backward(model):
        x = hidden.clone().requires_grad_()
        for layer in model.decoder.layers:
            x, _ = layer(x, **inputs)
        x.square().sum().backward()
        return x.detach(), [p.grad for p in model.decoder.layers.parameters()]

    want, want_grads = forward_backward(plain)
    assert not calls
    got, _ = forward_backward(fused)
    assert calls and torch.allclose(got, want, atol=1e-6)
    monkeypatch.setattr(mlp, "bias_swiglu_impl", fused_swiglu)  # the count guards the graph
    fused.zero_grad(set_to_none=True)
    counters = torch._dynamo.utils.counters
    before = counters["stats"]["unique_graphs"]  # the fused kernels' own, compiled eagerly
    assert compile_layers(fused, "aot_eager") == 2
    got, grads = forward_backward(fused)
    assert counters["stats"]["unique_graphs"] - before == 1 and not counters["graph_break"]
    assert torch.allclose(got, want, atol=1e-6)
    assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(grads, want_grads))


@pytest.mark.integration
@pytest.mark.parametrize("flags,message", [
    (["--cross-entropy-loss-fusion"], "needs --bf16: megatron-core 0.16.1's native fused "
                                      "cross-entropy rounds the logits' gradient to bf16"),
    (["--cross-entropy-loss-fusion", "--bf16", "--cross-entropy-fusion-impl", "te"],
     "--cross-entropy-fusion-impl te needs Transformer Engine"),
])
def test_a_fusion_that_cannot_apply_is_refused(flags, message):
    run = run_pretrain(TINY_RUN + ARM + flags, check=False)
    assert run.returncode != 0 and message in run.stderr + run.stdout


COMPILED = ["--torch-compile-layers", "--torch-compile-backend", "aot_eager"]


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and counters emptied before and after (runs share this process)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


@pytest.mark.integration
def test_compiled_layers_train_as_eager_ones(fresh_dynamo):
    """20 steps in bf16: the compiled run's losses and gradient norms equal the eager run's
    (aot_eager runs the same kernels: 1e-6, the metrics file's rounding); the compile time is
    logged for iteration 1, and no later step compiles. Two graphs for the two layers: layer
    1's input (the fixed code) needs no gradient, layer 2's does."""
    run = TINY_RUN + ["--input-interface", "binary", "--train-iters", "20", "--bf16"]
    eager = run_pretrain(run)
    compiled = run_pretrain(run + COMPILED)
    assert "torch.compile" not in eager.stdout
    assert "torch.compile (aot_eager) of each transformer layer: 2 layers" in compiled.stdout
    spent = re.findall(r"torch\.compile: ([\d.]+) s of (.+) spent compiling \((\d+) graphs",
                       compiled.stdout)
    assert [(phase, graphs) for _, phase, graphs in spent] == [("iteration 1", "2")]
    assert float(spent[0][0]) > 0
    want = step_losses(eager)
    assert sorted(want) == list(range(1, 21)) and want[20] < want[1]
    assert step_losses(compiled) == pytest.approx(want, abs=1e-6)
    assert grad_norms(compiled) == pytest.approx(grad_norms(eager), rel=1e-6)


def tiny_layers(*flags: str, linear=None) -> tuple[torch.nn.Module, dict]:
    """A tiny learned-arm model built with the local spec (its row-parallel linears replaced
    by ``linear`` if given), and the keywords of its layers' inputs."""
    from megatron.core import tensor_parallel
    from megatron_ext.model import provider
    import pretrain_fixedcode
    args = pretrain_fixedcode.parse_args(TINY_RUN + ["--device", "cpu", "--train-iters", "1",
                                                     *flags])
    spec = provider.local_layer_spec(args.model)
    if linear is not None:
        spec.submodules.self_attention.submodules.linear_proj = linear
        mlp_submodules(spec).linear_fc2 = linear
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(provider, "local_layer_spec", lambda _: spec)
        model = provider.model_provider(args, 512, on_cpu=True)
    return model, dict(attention_mask=None,
                       rotary_pos_emb=model.rotary_pos_emb(args.model.seq_length))


@pytest.mark.integration
def test_each_local_layer_is_one_graph_and_the_layers_share_it(cpu_dist, fresh_dynamo):
    """Three compiled layers (fullgraph: a break would raise) run a forward pass as one
    graph, the same for all three: one graph per layer would exhaust dynamo's cache (8
    entries per code object; the 1.7B shape has 24 layers) and run the later layers eagerly
    in silence. The control: megatron-core 0.16.1's own RowParallelLinear breaks the graph
    (at its warnings.warn), so this test fails if a break comes back, from megatron-core or
    torch."""
    from megatron.core.tensor_parallel.layers import RowParallelLinear
    from megatron_ext.train.compile_layers import compile_layers
    model, inputs = tiny_layers("--num-layers", "3")
    assert compile_layers(model, "aot_eager") == 3
    hidden = torch.randn(32, 2, 64, requires_grad=True)
    for layer in model.decoder.layers:
        hidden, _ = layer(hidden, **inputs)
    counters = torch._dynamo.utils.counters
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    model, inputs = tiny_layers(linear=RowParallelLinear)
    stock = torch._dynamo.explain(model.decoder.layers[0])(hidden.detach(), **inputs)
    assert stock.graph_break_count > 0
    assert any("warn" in b.reason for b in stock.break_reasons)


@pytest.mark.integration
@pytest.mark.parametrize("flags,message", [
    (["--recompute-granularity", "selective"], "with --recompute-granularity selective: "
                                               "megatron-core's checkpoint of core attention"),
    (["--attention-backend", "unfused"], "with --attention-backend unfused: megatron-core's "
                                         "DotProductAttention did not trace on CPU"),
    (["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"],
     "with --overlap-param-gather: the DDP's forward pre-hooks wait"),
])
def test_torch_compile_is_refused_where_a_layer_does_not_compile_whole(flags, message):
    run = run_pretrain(TINY_RUN + ARM + COMPILED + flags, check=False)
    assert run.returncode != 0 and "--torch-compile-layers " + message in run.stderr + run.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_inductor_compiled_layers_train_as_eager_ones_in_bf16(tmp_path):
    """On a GPU, inductor compiles each layer into Triton kernels (written to its cache) and
    10 bf16 steps give the eager losses within 2e-2 (bf16's rounding, reordered by the
    fusions), in a process of its own (run_pretrain on a GPU machine)."""
    run = TINY_RUN + ["--input-interface", "binary", "--train-iters", "10", "--bf16",
                      "--device", "cuda"]
    eager = run_pretrain(run)
    compiled = run_pretrain(run + ["--torch-compile-layers"],
                            env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert "torch.compile: " in compiled.stdout
    kernels = [p for p in (tmp_path / "inductor").rglob("*.py") if "@triton.jit" in p.read_text()]
    assert kernels
    want = step_losses(eager)
    assert want[10] < want[1]
    assert step_losses(compiled) == pytest.approx(want, abs=2e-2)
