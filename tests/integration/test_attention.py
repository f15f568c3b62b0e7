"""megatron_ext.model.attention: the SDPA core attention of the local layers equals Megatron-Core's
DotProductAttention (outputs and q/k/v gradients, MHA and GQA, fp32), trains each arm to
the same losses, draws its dropout from Megatron's RNG tracker, and on a GPU is pinned to
fused kernels. ``--attention-backend`` chooses it as Megatron-LM's flag does."""

from __future__ import annotations

import os

import pytest
import torch
from torch.nn.attention import SDPBackend

from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnBackend, AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from conftest import TINY_RUN
from megatron_ext.config.model_config import ATTENTION_BACKENDS
from megatron_ext.model.attention import SDPAttention, local_core_attention, sdpa_kernels
from megatron_ext.metrics.sinks import read_metrics
from megatron_ext.metrics.flops import flops_per_token
from megatron_ext.model.provider import model_provider as build_gpt
from megatron_ext.train.loop import pretrain
from megatron_ext.runtime.errors import FlagError
from pretrain_fixedcode import datasets_provider, forward_step, model_provider, parse_args
from helpers.tp_parity_worker import ARMS

NVTE = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")


@pytest.fixture
def nvte_env(monkeypatch):
    """GPTModel sets TE's backend variables from ``attention_backend`` and refuses to change
    them; built here with several backends, they are unset around each test."""
    for name in NVTE:
        monkeypatch.delenv(name, raising=False)


def config(groups: int, dropout: float = 0.0, **kw) -> TransformerConfig:
    return TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4,
                             num_query_groups=groups, attention_dropout=dropout,
                             use_cpu_initialization=True, **kw)


def qkv(groups: int, seq: int = 32, batch: int = 2):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(seq, batch, heads, 16, generator=g, requires_grad=True)
            for heads in (4, groups, groups)]


@pytest.mark.parametrize("groups", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("layer_scaling", [False, True])
def test_sdpa_equals_dot_product_attention(cpu_dist, groups, layer_scaling):
    cfg = config(groups, apply_query_key_layer_scaling=layer_scaling)
    results = []
    for cls in (DotProductAttention, SDPAttention):
        q, k, v = qkv(groups)
        out = cls(cfg, 3, AttnMaskType.causal, "self")(q, k, v, None)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        results.append((out, *torch.autograd.grad((out * weights).sum(), (q, k, v))))
    assert results[0][0].shape == (32, 2, 64)
    for name, want, got in zip(("output", "dq", "dk", "dv"), *results):
        assert (got - want).abs().max() <= 1e-5, name
        assert want.abs().max() > 0.1, name  # not two zeros


def test_causal_and_explicit_masks_agree(cpu_dist):
    """A Megatron mask (True = masked) gives what the causal flag gives."""
    q, k, v = qkv(4)
    attention = SDPAttention(config(4), 1, AttnMaskType.causal, "self")
    masked = torch.triu(torch.ones(32, 32, dtype=torch.bool), diagonal=1)
    torch.testing.assert_close(attention(q, k, v, masked), attention(q, k, v, None))
    assert not torch.allclose(attention(q, k, v, torch.zeros_like(masked)),
                              attention(q, k, v, None))


def test_dropout_draws_from_megatrons_rng_tracker(cpu_dist):
    q, k, v = qkv(4)
    attention = SDPAttention(config(4, dropout=0.5), 1, AttnMaskType.causal, "self").train()

    def dropped(seed):
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
        default = torch.get_rng_state()
        out = attention(q, k, v, None)
        assert torch.equal(torch.get_rng_state(), default)  # the tracker's stream, not torch's
        return out

    assert torch.equal(dropped(5), dropped(5))
    assert not torch.equal(dropped(5), dropped(6))
    assert not torch.equal(dropped(5), attention.eval()(q, k, v, None))


def test_attention_backend_choices():
    assert set(ATTENTION_BACKENDS) == {b.name for b in AttnBackend}
    assert local_core_attention("auto") is local_core_attention("flash") is SDPAttention
    assert local_core_attention("unfused") is local_core_attention("local") is DotProductAttention
    with pytest.raises(FlagError, match="--attention-backend fused selects Transformer Engine"):
        local_core_attention("fused")
    assert sdpa_kernels("flash", "cuda") == (SDPBackend.FLASH_ATTENTION,)
    assert SDPBackend.MATH not in sdpa_kernels("auto", "cuda")
    assert sdpa_kernels("auto", "cpu") is None


def losses(path) -> dict:
    return {r["iteration"]: r["lm loss"] for r in read_metrics(str(path)) if r["kind"] == "train"}


def test_every_arm_trains_to_the_same_losses_with_sdpa_and_unfused(cpu_dist, nvte_env, tmp_path):
    """10 steps of each arm; the log's TFLOP/s per device are the model's FLOPs per token
    (Megatron-LM's count) times its tokens per second."""
    for arm, flags in ARMS.items():
        runs = {}
        for backend in ("auto", "unfused"):
            args = parse_args(TINY_RUN + ["--train-iters", "10", "--attention-backend", backend,
                                          "--metrics-file", str(tmp_path / f"{arm}-{backend}"),
                                          *flags])
            model = build_gpt(args, 512, on_cpu=True)
            assert isinstance(model.decoder.layers[0].self_attention.core_attention,
                              local_core_attention(backend))
            assert model.config.attention_backend == AttnBackend[backend]
            pretrain(args, model_provider, forward_step, datasets_provider)
            runs[backend] = losses(tmp_path / f"{arm}-{backend}")
            for r in read_metrics(str(tmp_path / f"{arm}-{backend}")):  # the logged TFLOP/s
                assert r["tflops-per-gpu"] == pytest.approx(
                    flops_per_token(args.model, 512) * r["tokens-per-second"] / 1e12), arm
            for name in NVTE:  # each model sets them for its backend
                os.environ.pop(name, None)
        assert sorted(runs["auto"]) == list(range(1, 11)), arm
        assert runs["auto"][10] < runs["auto"][1], arm
        assert runs["auto"] == pytest.approx(runs["unfused"], abs=1e-4), arm


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("backend", ["auto", "flash"])
@pytest.mark.parametrize("groups", [4, 2])
def test_gpu_sdpa_runs_a_fused_kernel_in_bf16_and_equals_the_unfused_path(backend, groups):
    """On a GPU the pinned kernels run (the math kernel is not allowed), in bf16, and give
    DotProductAttention's output to bf16 precision. Run alone (bench/gpu_check.sh does):
    a process whose other tests run Megatron-Core on CPU cannot also run it on the GPU."""
    from megatron_ext.runtime import cpu_backend
    from megatron_ext.runtime.initialize import initialize_distributed
    if cpu_backend._ENABLED:
        pytest.skip("this process runs Megatron-Core on CPU; run this test on its own")
    initialize_distributed("cuda", 1, 1)
    cfg = config(groups, bf16=True, params_dtype=torch.bfloat16,
                 attention_backend=AttnBackend[backend])
    q, k, v = (t.detach().cuda().bfloat16().requires_grad_() for t in qkv(groups, seq=256))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = SDPAttention(cfg, 1, AttnMaskType.causal, "self")(q, k, v, None)
        out.float().sum().backward()
    kernels = " ".join(e.name.lower() for e in prof.events())
    assert "flash" in kernels or "fmha" in kernels or "efficient" in kernels or "cudnn" in kernels
    want = DotProductAttention(cfg, 1, AttnMaskType.causal, "self")(q, k, v, None)
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
