"""The arms beside the learned table and the fixed codes (issue 31): the frozen random table,
the factorised table (--input-table-rank) and the trainable map over a fixed code
(--code-projection); their parameter counts, their forwards at known initialisations, the
input table's optimizer groups, and the refusals. Nothing here trains
(tests/integration/test_input_arms.py trains, resumes and exports them)."""

from __future__ import annotations

import re

import pytest
import torch

from conftest import TINY_RUN
from helpers.codes import new_code
from megatron_ext.codes.embedding import FixedCodeEmbedding, tiling_matrix
from megatron_ext.model.param_count import count_arms
from megatron_ext.codes.schemes import build_code
from megatron_ext.model.provider import model_provider
from megatron_ext.runtime.errors import FixedcodeError
from megatron_ext.runtime.initialize import set_seed
from megatron_ext.checkpoint.resume import resolve_checkpoint
from megatron_ext.train.setup import check_machine_and_tokenizer
from pretrain_fixedcode import parse_args

SHAPE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
         "--ffn-hidden-size", "128", "--seq-length", "32", "--vocab-size", "500"]
V, H, N = 512, 64, 16  # 500 padded to a multiple of 128; --hidden-size; --code-bits


def build(cpu_dist, *flags: str, seed: int = 1234):
    """The model of the TINY_RUN shape with ``flags``, its generators seeded as a run's."""
    args = parse_args(TINY_RUN + ["--train-iters", "1", *flags])
    set_seed(seed)
    return model_provider(args, V, on_cpu=True, code=build_code(args.model, V)), args


def test_trainable_input_parameters_are_counted_exactly(cpu_dist):
    """Against a hand count: the frozen table and the codes 0, the map n x h, the
    factorised table V x r + r x h; backbone and head the same in every arm."""
    from megatron_ext.config.arguments import parse_model_config
    config = parse_model_config(SHAPE, "count")[0]
    counts = count_arms(config, ["learned", "frozen", "binary", "map:binary@--code-projection",
                               "r8:factorized@--input-table-rank=8",
                               "full:factorized@--input-table-rank=64"])
    assert {arm: c["input"] for arm, c in counts.items()} == {
        "learned": V * H, "frozen": 0, "binary": 0, "map": N * H, "r8": V * 8 + 8 * H,
        "full": V * H + H * H}
    backbone = 2 * (4 * H * H + 3 * H * 128 + 2 * H) + H
    for arm, c in counts.items():
        assert (c["backbone"], c["head"]) == (backbone, V * H), arm
        assert c["total"] == c["input"] + backbone + V * H, arm


def test_the_frozen_table_is_the_learned_arms_initial_table_without_gradients(cpu_dist):
    learned, _ = build(cpu_dist, "--input-interface", "learned")
    frozen, _ = build(cpu_dist, "--input-interface", "frozen")
    table = frozen.embedding.word_embeddings.weight
    assert not table.requires_grad
    assert torch.equal(table, learned.embedding.word_embeddings.weight)
    assert table.std().item() == pytest.approx(0.02, rel=0.05)  # --init-method-std's scale
    for (name, a), (_, b) in zip(learned.named_parameters(), frozen.named_parameters()):
        assert torch.equal(a, b), name  # the same backbone and head for one --seed
    wider, _ = build(cpu_dist, "--input-interface", "frozen",
                     "--embedding-init-method-std", "0.5")
    assert wider.embedding.word_embeddings.weight.std().item() == pytest.approx(0.5, rel=0.05)


def test_a_full_rank_factorised_table_holds_any_table(cpu_dist):
    """Initialised from a learned table's SVD (rank = width), the factorised arm's input is
    that table's; from the table itself and the identity, bit for bit. Its default
    initialisation starts at the learned table's RMS."""
    learned, _ = build(cpu_dist, "--input-interface", "learned")
    factorized, _ = build(cpu_dist, "--input-interface", "factorized",
                          "--input-table-rank", str(H))
    ids = torch.randint(0, V, (2, 32), generator=torch.Generator().manual_seed(0))
    table = learned.embedding.word_embeddings.weight.detach()
    factors = factorized.embedding.word_embeddings
    product = factors.table.weight @ factors.projection.t()
    assert product.pow(2).mean().sqrt().item() == pytest.approx(0.02, rel=0.1)
    reference = learned.embedding(ids, None)
    u, s, vt = torch.linalg.svd(table.double(), full_matrices=False)
    with torch.no_grad():
        factors.table.weight.copy_(u * s)
        factors.projection.copy_(vt.t())
    assert torch.allclose(factorized.embedding(ids, None), reference, rtol=0, atol=1e-7)
    with torch.no_grad():
        factors.table.weight.copy_(table)
        factors.projection.copy_(torch.eye(H))
    assert torch.equal(factorized.embedding(ids, None), reference)


@pytest.mark.parametrize("scheme", ["binary", "gf2", "random"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_code_projection_starts_as_the_tiling(cpu_dist, scheme, dtype):
    """The map initialised to the tiling matrix gives the fixed arm's forward exactly; after
    a change of the map, it no longer does (the map is what the input computes)."""
    from megatron_ext.model.provider import transformer_config
    args = parse_args(TINY_RUN + ["--train-iters", "1", "--input-interface", scheme,
                                  "--code-bits", "10"] + (["--bf16"] if dtype != torch.float32
                                                          else []))
    config = transformer_config(args, on_cpu=True)
    code = new_code(scheme, num_bits=10, seed=3, vocab_size=V)
    ids = torch.randint(0, V, (2, 32), generator=torch.Generator().manual_seed(1))
    tiled = FixedCodeEmbedding(config, V, 32, code=code, impl="torch")
    mapped = FixedCodeEmbedding(config, V, 32, code=code, impl="torch", projection=True)
    assert [p.shape for p in tiled.parameters()] == []
    assert [p.shape for p in mapped.parameters()] == [torch.Size([H, 10])]
    assert torch.equal(mapped.projection.weight, tiling_matrix(10, H).to(dtype))
    assert torch.equal(mapped(ids), tiled(ids)) and mapped(ids).dtype == dtype
    with torch.no_grad():
        mapped.projection.weight[3] *= 2
    assert not torch.equal(mapped(ids), tiled(ids))


def built_for_training(*flags):
    """``(model, ddp, optimizer)`` as a run of ``flags`` builds them."""
    from megatron_ext.train.setup import build_model_and_optimizer
    args = parse_args(TINY_RUN + ["--train-iters", "2", "--min-lr", "1e-4", *flags])
    _, settled, derived = check_machine_and_tokenizer(args, "cpu")
    resume = resolve_checkpoint(settled, derived)
    model, ddp, optimizer, _ = build_model_and_optimizer(
        resume.config, derived,
        lambda *a, **k: model_provider(*a, on_cpu=True, **k), resume.code)
    return model, ddp, optimizer


@pytest.mark.parametrize("flags, fixed", [
    (["--input-interface", "frozen"], ["embedding.word_embeddings.weight"]),
    (["--input-interface", "binary", "--code-projection"], []),
    (["--input-interface", "factorized", "--input-table-rank", "4"], [])])
def test_no_gradient_or_optimizer_state_is_allocated_for_what_is_fixed(cpu_dist, flags, fixed):
    """DDP gives a gradient buffer (``main_grad``) and the optimizer a slot to every trained
    parameter, and to none of the fixed table."""
    model, _, optimizer = built_for_training(*flags)
    optimized = {id(p) for g in optimizer.param_groups for p in g["params"]}
    names = [n for n, _ in model.named_parameters()]
    assert all(name in names for name in fixed)
    for name, param in model.named_parameters():
        trained = name not in fixed
        assert (param.requires_grad, hasattr(param, "main_grad"), id(param) in optimized) == \
            (trained, trained, trained), name
        assert param.grad is None


def optimizer_groups(cpu_dist, *flags):
    """``{parameter name: (max_lr, min_lr, weight decay)}`` of the run's optimizer."""
    model, _, optimizer = built_for_training(*flags)
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: (g["max_lr"], g["min_lr"], g["weight_decay"])
            for g in optimizer.param_groups for p in g["params"]}


@pytest.mark.parametrize("arm", [["--input-interface", "learned"],
                                 ["--input-interface", "factorized", "--input-table-rank", "8"]])
def test_the_input_table_has_its_own_learning_rate_and_weight_decay(cpu_dist, arm):
    groups = optimizer_groups(cpu_dist, *arm, "--input-table-lr-mult", "0.25",
                              "--input-table-weight-decay", "0.01")
    table = {n: g for n, g in groups.items() if n.startswith("embedding.")}
    assert len(table) == (1 if "learned" in arm else 2)
    for name, group in table.items():
        assert group == (3e-3 * 0.25, 1e-4 * 0.25, 0.01), name
    assert groups["output_layer.weight"] == (3e-3, 1e-4, 0.1)  # the head keeps the recipe's
    assert groups["decoder.layers.0.mlp.linear_fc1.weight"] == (3e-3, 1e-4, 0.1)
    assert groups["decoder.final_layernorm.weight"][2] == 0.0  # Megatron's: no decay on 1-D


@pytest.mark.parametrize("flags, message", [
    (["--input-interface", "factorized", "--input-table-rank", "65"],
     "--input-table-rank 65 is outside [1, --hidden-size 64]"),
    (["--input-interface", "factorized", "--input-table-rank", "48", "--vocab-size", "20",
      "--make-vocab-size-divisible-by", "8"],
     "--input-table-rank 48 is above the padded vocabulary of 24 tokens"),
    (["--input-interface", "factorized"], "--input-interface factorized needs --input-table-rank"),
    (["--input-interface", "learned", "--input-table-rank", "8"],
     "--input-table-rank applies to --input-interface factorized only, not learned"),
    (["--input-interface", "learned", "--code-projection"],
     "--code-projection maps a fixed code to the width: it needs a fixed-code "
     "--input-interface (binary, gf2, permuted, random), not learned"),
    (["--input-interface", "binary", "--code-projection", "--code-tiling", "recode"],
     "--code-projection maps the n-bit code to the width in place of the tiling: drop "
     "--code-tiling recode"),
    (["--input-interface", "frozen", "--no-untie-embeddings-and-output-weights"],
     "--input-interface frozen has no input table to tie to the output head (tied, the head "
     "would train it)"),
    (["--input-interface", "learned", "--input-table-lr-mult", "-0.5"],
     "--input-table-lr-mult -0.5 is below 0"),
    (["--input-interface", "learned", "--input-table-weight-decay", "-1"],
     "--input-table-weight-decay -1.0 is below 0"),
    (["--input-interface", "frozen", "--input-table-lr-mult", "0.5"],
     "--input-table-lr-mult: --input-interface frozen has no trained input table"),
    (["--input-interface", "binary", "--code-projection", "--input-table-weight-decay", "0"],
     "--input-table-weight-decay: --input-interface binary has no input table: with "
     "--code-projection it trains a 16 x 64 projection of its fixed code"),
    (["--input-interface", "gf2", "--code-projection", "--input-table-lr-mult", "0.1"],
     "--input-table-lr-mult: --input-interface gf2 has no input table: with --code-projection "
     "it trains a 16 x 64 projection of its fixed code, at the schedule's learning rate and "
     "weight decay (learned and factorized train a table)"),
    (["--input-interface", "learned", "--input-table-lr-mult", "2",
      "--no-untie-embeddings-and-output-weights"],
     "--input-table-lr-mult: the input table is tied to the output head"),
    (["--input-interface", "binary", "--embedding-init-method-std", "0.1"],
     "--embedding-init-method-std: --input-interface binary has no input table"),
])
def test_bad_arm_flags_are_clear_errors_naming_the_flag(cpu_dist, flags, message):
    with pytest.raises(FixedcodeError, match=re.escape(message)):
        args = parse_args(TINY_RUN + flags + ["--train-iters", "2"])
        resolve_checkpoint(*check_machine_and_tokenizer(args, "cpu")[1:])


def test_param_report_refuses_an_arm_spec_that_training_refuses(cpu_dist):
    from megatron_ext.config.arguments import parse_model_config
    args = parse_model_config(SHAPE, "count")[0]
    with pytest.raises(FixedcodeError, match=re.escape("--input-table-rank 128 is outside")):
        count_arms(args, ["factorized@--input-table-rank=128"])
    with pytest.raises(FixedcodeError, match=re.escape("arm 'binary@--no-such-flag'")):
        count_arms(args, ["binary@--no-such-flag"])


def test_a_fresh_hugging_face_model_with_a_code_projection_starts_as_the_tiling():
    """What the probes' random initialisation of an exported map arm builds."""
    from megatron_ext.hf.configuration_fixedcode import FixedCodeLlamaConfig
    from megatron_ext.hf.modeling_fixedcode import FixedCodeLlamaForCausalLM
    code = new_code("binary", num_bits=10)
    config = FixedCodeLlamaConfig(fixed_code=code.to_dict(), code_projection=True,
                                  hidden_size=H, intermediate_size=128, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=4, vocab_size=V,
                                  tie_word_embeddings=False)
    torch.manual_seed(0)
    model = FixedCodeLlamaForCausalLM(config)
    assert torch.equal(model.model.embed_tokens.projection.weight, tiling_matrix(10, H))
    ids = torch.arange(V).view(1, -1)
    assert torch.equal(model.model.embed_tokens(ids), code.encode(ids, H))
