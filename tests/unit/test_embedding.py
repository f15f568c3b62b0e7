"""FixedCodeEmbedding inside Megatron-Core's GPTModel, on CPU (one process)."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_ext.config.arguments import parse_model_config
from helpers.code_reference import py_values
from megatron_ext.codes.schemes import SCHEMES, FixedCode
from megatron_ext.codes.embedding import FixedCodeEmbedding
from megatron_ext.model.provider import fusions, model_provider, transformer_config
from megatron_ext.runtime.errors import FlagError
from helpers.small_model import SMALL, SMALL_VOCAB, VOCAB, small_args
from helpers.codes import new_code



def reference_embedding(code: FixedCode, ids: torch.Tensor, hidden: int) -> torch.Tensor:
    """Plain Python: ids [b, s] -> [s, b, h] from the code's definition."""
    d = code.to_dict()
    return torch.tensor([[py_values(d, int(t), hidden) for t in column] for column in ids.t()])


def embedding_config(**kw) -> TransformerConfig:
    base = dict(num_layers=1, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True,
                hidden_dropout=0.0)
    return TransformerConfig(**{**base, **kw})


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("tiling,num_bits,dtype", [("repeat", 16, torch.float32),
                                                   ("recode", 12, torch.bfloat16)])
def test_embedding_equals_reference(cpu_dist, scheme, tiling, num_bits, dtype):
    """Every scheme and tiling; 12 bits tile 64 positions as 5 blocks and 4 truncated."""
    code = new_code(scheme, num_bits=num_bits, tiling=tiling, vocab_size=VOCAB,
                            hidden_size=64, values="01" if dtype == torch.float32 else "pm1",
                            scale=0.5, seed=2)
    config = embedding_config(params_dtype=dtype, bf16=dtype == torch.bfloat16)
    emb = FixedCodeEmbedding(config, VOCAB, 16, "rope", code=code)
    ids = torch.randint(0, VOCAB, (3, 7))
    out = emb(ids, None)
    assert out.shape == (7, 3, 64) and out.dtype == dtype
    assert torch.equal(out.float(), reference_embedding(code, ids, 64))
    assert sum(p.numel() for p in emb.parameters()) == 0
    assert not any(k.startswith("code") for k in emb.state_dict())  # the code is no weight


def test_sequence_parallel_ranks_compute_their_own_slices(cpu_dist):
    """Under SP each TP rank returns exactly its slice of the full [s, b, h] output."""
    code = new_code("random", seed=4, tiling="recode", vocab_size=VOCAB, hidden_size=64)
    ids = torch.randint(0, VOCAB, (2, 8))
    full = FixedCodeEmbedding(embedding_config(), VOCAB, 8, code=code)(ids, None)

    class FakeTPGroup:
        def __init__(self, rank):
            self._rank = rank

        def size(self):
            return 2

        def rank(self):
            return self._rank

    sp_config = embedding_config(tensor_model_parallel_size=2, sequence_parallel=True)
    parts = [FixedCodeEmbedding(sp_config, VOCAB, 8, code=code, tp_group=FakeTPGroup(r))(ids, None)
             for r in range(2)]
    assert parts[0].shape == (4, 2, 64)
    assert torch.equal(torch.cat(parts, dim=0), full)


def test_embedding_dropout_as_in_megatron(cpu_dist):
    code = new_code("binary")
    emb = FixedCodeEmbedding(embedding_config(hidden_dropout=0.5), VOCAB, 8, code=code)
    ids = torch.randint(0, VOCAB, (4, 8))
    emb.eval()
    clean = emb(ids, None)
    emb.train()
    dropped = emb(ids, None)
    kept = dropped != 0
    assert 0.3 < kept.float().mean() < 0.7
    assert torch.allclose(dropped[kept], clean[kept] * 2)


@pytest.mark.parametrize("bad", [-1, VOCAB])
def test_out_of_range_ids_are_a_clear_error(cpu_dist, bad):
    emb = FixedCodeEmbedding(embedding_config(), VOCAB, 8, code=new_code("binary"))
    ids = torch.tensor([[1, 2, bad]])
    with pytest.raises(ValueError, match=rf"token id {bad} is outside the vocabulary \[0, {VOCAB}\)"):
        emb(ids, None)


def test_learned_positions_are_refused(cpu_dist):
    with pytest.raises(ValueError, match="learned_absolute"):
        FixedCodeEmbedding(embedding_config(), VOCAB, 8, "learned_absolute",
                           code=new_code("binary"))


def test_fixed_code_with_tied_weights_is_a_clear_error():
    with pytest.raises(FlagError, match="no input table to tie"):
        parse_model_config(SMALL + ["--input-interface", "gf2",
                                  "--no-untie-embeddings-and-output-weights"], "test")


def test_vocab_too_large_for_code_bits_is_refused(cpu_dist):
    args = small_args("binary", "--code-bits", "8")
    with pytest.raises(ValueError, match=r"512 tokens does not fit a 8-bit code \(at most 2\^8 = 256\)"):
        model_provider(args, SMALL_VOCAB, on_cpu=True)


@pytest.mark.parametrize("flags,message", [
    (["--input-interface", "random", "--code-bits", "63"],
     "--code-bits must be in [1, 62], got 63"),
    (["--input-interface", "gf2", "--hidden-size", "12", "--num-attention-heads", "4"],
     "--hidden-size 12 is smaller than --code-bits 16"),
    (["--input-interface", "permuted", "--code-scale", "0"], "--code-scale must be positive"),
    (["--code-tiling", "recode"],
     "--code-tiling recode needs a fixed-code --input-interface, not learned"),
])
def test_bad_code_flags_are_clear_errors(flags, message):
    with pytest.raises(FlagError, match=re.escape(message)):
        parse_model_config(SMALL + flags, "test")


ARMS = [("learned",), ("binary",), ("gf2",), ("permuted",),
        ("random", "--code-tiling", "recode", "--code-bits", "13")]


@pytest.mark.parametrize("arm", ARMS, ids=lambda a: "-".join(a))
def test_gptmodel_forward_backward_and_optimizer(cpu_dist, arm):
    """All arms train through GPTModel + DDP + Megatron's optimizer; a fixed-code input has
    no parameters, receives no gradient and holds no optimizer state."""
    torch.manual_seed(0)
    model = model_provider(small_args(*arm), SMALL_VOCAB, on_cpu=True)
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
    opt = get_megatron_optimizer(OptimizerConfig(lr=1e-3, clip_grad=1.0), [ddp])
    ids = torch.randint(0, VOCAB, (2, 16))
    pos = torch.arange(16).expand(2, 16)
    before = copy.deepcopy(model.state_dict())
    loss = ddp(ids, pos, None, labels=ids).mean()
    loss.backward()
    ddp.finish_grad_sync()
    updated, grad_norm, _ = opt.step()
    assert updated and grad_norm > 0
    emb_params = list(model.embedding.parameters())
    state_params = {id(p) for g in opt.param_groups for p in g["params"]}
    if arm == ("learned",):
        assert len(emb_params) == 1
    else:
        assert emb_params == [] and isinstance(model.embedding, FixedCodeEmbedding)
        assert not any(k.startswith("embedding.") for k in model.state_dict())
    # Every trainable model parameter is in the optimizer, and nothing else is.
    assert len(state_params) == sum(1 for p in model.parameters() if p.requires_grad)
    changed = [k for k, v in model.state_dict().items()
               if isinstance(v, torch.Tensor) and not torch.equal(v, before[k])]
    assert any(k.startswith("decoder.") for k in changed)
    assert any(k.startswith("output_layer.") for k in changed)


@pytest.mark.parametrize("flags,message", [
    (["--recompute-granularity", "full"],
     "--recompute-granularity full needs --recompute-method {uniform,block} and "
     "--recompute-num-layers"),
    (["--recompute-granularity", "full", "--recompute-method", "block",
      "--recompute-num-layers", "3"], "--recompute-num-layers 3 is outside [1, --num-layers 2]"),
    (["--recompute-granularity", "selective", "--recompute-num-layers", "1"],
     "--recompute-method and --recompute-num-layers apply to --recompute-granularity full only"),
])
def test_bad_recompute_flags_are_clear_errors(flags, message):
    with pytest.raises(FlagError, match=re.escape(message)):
        small_args("binary", *flags)


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_fp8_flags_reach_the_transformer_config(recipe):
    args = small_args("binary", "--transformer-impl", "transformer_engine", "--bf16",
                      "--fp8-format", "hybrid", "--fp8-recipe", recipe,
                      "--fp8-amax-history-len", "16", "--fp8-amax-compute-algo", "most_recent")
    config = transformer_config(args, on_cpu=True)
    assert (config.fp8, config.fp8_recipe) == ("hybrid", recipe)
    assert (config.fp8_amax_history_len, config.fp8_amax_compute_algo) == (16, "most_recent")
    assert transformer_config(small_args("binary"), on_cpu=True).fp8 is None


def test_fused_kernels_on_gpus_as_in_megatron_lm(monkeypatch):
    """GPUs get Megatron-LM's fused SwiGLU, TE's fused RoPE (where TE imports), fused
    weight-gradient accumulation (where apex's extension imports) and the fused attention
    softmax (where its kernels import), for TE and local layers alike, and the native fused
    cross-entropy under --bf16; --no-...-fusion turns each off; CPU runs use none unless
    asked."""
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.tensor_parallel import layers
    from megatron_ext.model import provider
    te = ("--transformer-impl", "transformer_engine")
    local = ("--transformer-impl", "local")
    unfused_loss = dict(cross_entropy_loss_fusion=False, cross_entropy_fusion_impl="native")
    for flags in ((), ("--bf16",)):
        assert fusions(small_args("binary", *te, *flags).model, on_cpu=True) == dict(
            bias_activation_fusion=False, apply_rope_fusion=False,
            gradient_accumulation_fusion=False, masked_softmax_fusion=False, **unfused_loss)
    assert fusions(small_args("binary", "--bf16", "--cross-entropy-loss-fusion").model,
                   on_cpu=True)["cross_entropy_loss_fusion"]
    assert fusions(small_args("binary", "--bf16").model, on_cpu=False)["cross_entropy_loss_fusion"]
    assert not fusions(small_args("binary", "--bf16", "--no-cross-entropy-loss-fusion").model,
                       on_cpu=False)["cross_entropy_loss_fusion"]
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", True)
    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", lambda *a, **k: None)
    monkeypatch.setattr(provider, "fused_softmax_available", lambda: True)
    for layer_flags in (te, local):
        assert fusions(small_args("binary", *layer_flags).model, on_cpu=False) == dict(
            bias_activation_fusion=True, apply_rope_fusion=True,
            gradient_accumulation_fusion=True, masked_softmax_fusion=True, **unfused_loss)
    assert fusions(small_args("binary", *local, "--no-bias-swiglu-fusion", "--no-rope-fusion",
                              "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion").model,
                   on_cpu=False) == dict(
        bias_activation_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        masked_softmax_fusion=False, **unfused_loss)
    assert not fusions(small_args("binary", "--no-swiglu").model, on_cpu=False)["bias_activation_fusion"]
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", False)
    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", None)
    monkeypatch.setattr(provider, "fused_softmax_available", lambda: False)
    assert fusions(small_args("binary", *local).model, on_cpu=False) == dict(
        bias_activation_fusion=True, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        masked_softmax_fusion=False, **unfused_loss)


def test_backbone_init_is_identical_across_arms(cpu_dist):
    """Same --seed, same backbone and head weights in every arm: a fair comparison."""
    weights = {}
    for arm in ("learned", *SCHEMES):
        torch.manual_seed(0)
        sd = model_provider(small_args(arm, "--code-tiling", "recode")
                            if arm != "learned" else small_args(arm), SMALL_VOCAB,
                            on_cpu=True).state_dict()
        weights[arm] = {k: v for k, v in sd.items()
                        if not k.startswith("embedding.") and isinstance(v, torch.Tensor)}
    for arm in SCHEMES:
        assert weights[arm].keys() == weights["learned"].keys()
        assert all(torch.equal(weights[arm][k], weights["learned"][k]) for k in weights[arm])
