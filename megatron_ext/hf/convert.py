"""Megatron GPTModel weights and their run's model config -> a Hugging Face Llama, or a fixed-code
Llama.

The table arms become a stock ``LlamaForCausalLM``: the learned and frozen tables as they are,
the factorised one as its product ``T·P`` (V x h, computed in fp64); the fixed-code arms
(every scheme and tiling) become
:class:`~megatron_ext.hf.modeling_fixedcode.FixedCodeLlamaForCausalLM` (``trust_remote_code``)
with the code in ``config.json`` and no input table (with ``--code-projection``, the map as
``model.embed_tokens.projection.weight``), or, asked for a table (``--as-table``), a stock
``LlamaForCausalLM`` whose ``embed_tokens.weight`` is the code of every id
(:func:`code_table`). Every stock export's ``config.json`` says what its table is under
:data:`RECORD_KEY` (:func:`input_record`). Weight mapping, from the TP=1 local-spec
state dict (L layers, h hidden, f FFN, q heads, g query groups, d = h/q):

===============================================  =============================================
Megatron                                         Hugging Face Llama
===============================================  =============================================
embedding.word_embeddings.weight [V, h]          model.embed_tokens.weight (learned, frozen)
embedding.word_embeddings.table.weight [V, r]    model.embed_tokens.weight = table @ projection.T
  and .projection [h, r]                           (factorized)
embedding.projection.weight [h, n]               model.embed_tokens.projection.weight (a code's
                                                   --code-projection; as a table: code @ map.T)
(a fixed code, as a table)                       model.embed_tokens.weight = the code of each id
decoder.layers.i.input_layernorm.weight          model.layers.i.input_layernorm.weight
decoder.layers.i.self_attention.linear_qkv       q_proj / k_proj / v_proj: viewed as
  .weight [g·(q/g+2)·d, h]                         [g, q/g+2, d, h]; per group q/g query heads,
                                                   then one key, then one value head
decoder.layers.i.self_attention.linear_proj      model.layers.i.self_attn.o_proj.weight
decoder.layers.i.pre_mlp_layernorm.weight        model.layers.i.post_attention_layernorm.weight
decoder.layers.i.mlp.linear_fc1.weight [2f, h]   gate_proj = rows [0, f), up_proj = rows [f, 2f)
decoder.layers.i.mlp.linear_fc2.weight           model.layers.i.mlp.down_proj.weight
decoder.final_layernorm.weight                   model.norm.weight
output_layer.weight [V, h]                       lm_head.weight (tied: embed_tokens.weight)
===============================================  =============================================

V is the padded vocabulary (``padded_vocab_size``), kept so that logits match Megatron's.
RoPE needs no permutation: Megatron's default (non-interleaved) rotary rotates halves like
HF's ``rotate_half``; ``rotary_base`` becomes ``rope_theta``. RMSNorm: ``norm_epsilon`` ->
``rms_norm_eps``. Anything else (LayerNorm, GELU MLP, linear biases, non-RoPE positions, an
unknown weight) is refused by :func:`check_mappable` / :func:`hf_state_dict`.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from ..codes.schemes import ARMS, SCHEMES, FixedCode
from ..config.model_config import ModelConfig
from ..runtime.errors import ConversionError
from ..runtime.files import read_json, write_text
from .configuration_fixedcode import FixedCodeLlamaConfig
from .modeling_fixedcode import FixedCodeLlamaForCausalLM

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# The key of a stock export's config.json that says what its input table is (input_record):
# transformers keeps a key its config class does not define through save and load, and
# ignores it.
RECORD_KEY = "fixedcode"


def check_mappable(model: ModelConfig, fixed_code: Optional[dict], source: str) -> None:
    """Refuse, with every reason, a checkpoint whose model (its run's ``model`` config) has
    no Llama equivalent."""
    reasons = []
    if model.input_interface not in ARMS:
        reasons.append(f"--input-interface {model.input_interface}: not one of {ARMS}")
    elif model.input_interface in SCHEMES and not fixed_code:
        reasons.append(f"a {model.input_interface} checkpoint without its saved fixed_code: "
                       f"the code is unknown")
    if model.normalization != "RMSNorm":
        reasons.append(f"--normalization {model.normalization}: Llama has RMSNorm only")
    if not model.swiglu:
        reasons.append("--no-swiglu: Llama's MLP is SwiGLU")
    if not model.disable_bias_linear:
        reasons.append("--no-disable-bias-linear: this exporter maps bias-free linears only")
    if model.position_embedding_type != "rope":
        reasons.append(f"--position-embedding-type {model.position_embedding_type}: Llama "
                       f"applies RoPE")
    if reasons:
        raise ConversionError(f"cannot convert {source} to Hugging Face Llama:\n  - "
                              + "\n  - ".join(reasons))


def input_record(model: ModelConfig, fixed_code: Optional[dict]) -> dict:
    """What a stock export's input table is, for its ``config.json`` (:data:`RECORD_KEY`):
    the arm, whether the table was trained, and for a fixed code its one-line description,
    ``code_projection`` and the code itself (``FixedCode.to_dict``: everything drawn for it)."""
    arm = model.input_interface
    if arm not in SCHEMES:
        trained = {"learned": "trained", "frozen": "fixed, never trained (Megatron's initial "
                   "draw of the learned table)", "factorized": f"trained at rank "
                   f"{model.input_table_rank}: the product T·P of the trained factors"}[arm]
        return {"arm": arm, "input_table": trained}
    code = FixedCode.from_dict(fixed_code)
    table = ("the fixed code (never trained) times the trained --code-projection map (h x n)"
             if model.code_projection else "fixed, never trained")
    return {"arm": arm, "code": code.describe(), "input_table": table,
            "code_projection": bool(model.code_projection), "fixed_code": code.to_dict()}


def code_table(code: FixedCode, vocab_size: int, hidden_size: int, dtype: torch.dtype,
               projection: Optional[torch.Tensor] = None, chunk: int = 4096) -> torch.Tensor:
    """The fixed code's input of every id as one table ``[vocab_size, hidden_size]`` in
    ``dtype`` (``--as-table``): row t is ``code.encode(t)`` in ``dtype`` (what the Megatron
    model computes in that dtype), or with ``projection`` (``[h, n]``, the trained map) the
    n-bit code times it in fp32, as the model computes it, then cast. Filled ``chunk`` ids at
    a time: no second full-size copy."""
    table = torch.empty(vocab_size, hidden_size, dtype=dtype)
    for start in range(0, vocab_size, chunk):
        ids = torch.arange(start, min(start + chunk, vocab_size))
        if projection is None:
            table[start:start + len(ids)] = code.encode(ids, hidden_size, dtype)
        else:
            bits = code.encode(ids, code.num_bits, torch.float32)
            table[start:start + len(ids)] = torch.nn.functional.linear(
                bits, projection.to(torch.float32)).to(dtype)
    return table


def hf_state_dict(state: dict, model: ModelConfig, padded_vocab_size: int, dtype: torch.dtype,
                  table_code: Optional[FixedCode] = None) -> dict:
    """The HF Llama state dict of a TP=1 Megatron GPTModel state dict (see the module table) of
    the run's ``model`` config with its ``padded_vocab_size``;
    with ``table_code`` (the model's fixed code), the code as the input table
    (:func:`code_table`). ``state`` is consumed: each tensor is taken out as it is mapped, so
    that, where nothing else holds the Megatron tensors (the export's case), each is freed
    once its Hugging Face counterparts exist, and no second copy of the weights is ever held.
    Every tensor returned owns its storage (the gate and up halves of fc1 are copied apart;
    safetensors refuses tensors that share one)."""
    for key in [k for k in state if k.endswith("._extra_state")]:
        del state[key]

    def take(key, as_dtype=dtype):
        if key not in state:
            raise ConversionError(f"the checkpoint has no weight {key}")
        return state.pop(key).detach().to(as_dtype)

    h, q = model.hidden_size, model.num_attention_heads
    g, d = model.num_query_groups or q, model.hidden_size // model.num_attention_heads
    out = {}
    if model.input_interface in ("learned", "frozen"):
        out["model.embed_tokens.weight"] = take("embedding.word_embeddings.weight")
    elif model.input_interface == "factorized":
        table = take("embedding.word_embeddings.table.weight", torch.float64)
        projection = take("embedding.word_embeddings.projection", torch.float64)
        out["model.embed_tokens.weight"] = (table @ projection.t()).to(dtype)
    elif table_code is not None:
        projection = (take("embedding.projection.weight", torch.float32)
                      if model.code_projection else None)
        out["model.embed_tokens.weight"] = code_table(
            table_code, padded_vocab_size, model.hidden_size, dtype, projection)
    elif model.code_projection:
        out["model.embed_tokens.projection.weight"] = take("embedding.projection.weight")
    for i in range(model.num_layers):
        m, o = f"decoder.layers.{i}.", f"model.layers.{i}."
        out[o + "input_layernorm.weight"] = take(m + "input_layernorm.weight")
        qkv = take(m + "self_attention.linear_qkv.weight").view(g, q // g + 2, d, h)
        out[o + "self_attn.q_proj.weight"] = qkv[:, : q // g].reshape(q * d, h)
        out[o + "self_attn.k_proj.weight"] = qkv[:, q // g].reshape(g * d, h)
        out[o + "self_attn.v_proj.weight"] = qkv[:, q // g + 1].reshape(g * d, h)
        out[o + "self_attn.o_proj.weight"] = take(m + "self_attention.linear_proj.weight")
        out[o + "post_attention_layernorm.weight"] = take(m + "pre_mlp_layernorm.weight")
        gate, up = take(m + "mlp.linear_fc1.weight").chunk(2, dim=0)
        out[o + "mlp.gate_proj.weight"], out[o + "mlp.up_proj.weight"] = gate.clone(), up.clone()
        del gate, up
        out[o + "mlp.down_proj.weight"] = take(m + "mlp.linear_fc2.weight")
    out["model.norm.weight"] = take("decoder.final_layernorm.weight")
    if model.untie_embeddings_and_output_weights:
        out["lm_head.weight"] = take("output_layer.weight")
    else:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    if state:
        raise ConversionError(f"cannot map the checkpoint's weights {sorted(state)} to Llama")
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(model: ModelConfig, padded_vocab_size: int, fixed_code: Optional[dict],
              dtype: torch.dtype, token_ids: dict, as_table: bool = False) -> LlamaConfig:
    """The HF config of the checkpoint's model (its run's ``model`` config, its
    ``padded_vocab_size``; ``token_ids``: ``bos_token_id``, ``eos_token_id`` and
    ``pad_token_id``, the exported tokenizer's): Llama's, plus the code for a fixed-code arm
    exported as code; a stock Llama's says what its table is (:func:`input_record`)."""
    shape = dict(
        vocab_size=padded_vocab_size,
        hidden_size=model.hidden_size,
        intermediate_size=model.ffn_hidden_size,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_query_groups or model.num_attention_heads,
        head_dim=model.hidden_size // model.num_attention_heads,
        hidden_act="silu",
        max_position_embeddings=model.max_position_embeddings,
        rms_norm_eps=model.norm_epsilon,
        rope_parameters={"rope_type": "default", "rope_theta": float(model.rotary_base)},
        attention_bias=False,
        mlp_bias=False,
        initializer_range=model.init_method_std,
        **token_ids,
        dtype=dtype,
    )
    if model.input_interface not in SCHEMES or as_table:
        return LlamaConfig(tie_word_embeddings=not model.untie_embeddings_and_output_weights,
                           architectures=["LlamaForCausalLM"],
                           **{RECORD_KEY: input_record(model, fixed_code)}, **shape)
    return FixedCodeLlamaConfig(fixed_code=fixed_code, code_projection=model.code_projection,
                                tie_word_embeddings=False,
                                architectures=["FixedCodeLlamaForCausalLM"], **shape)


def build_hf_model(config: LlamaConfig, state: dict, device: str = "meta") -> LlamaForCausalLM:
    """The HF model of ``config`` holding ``state`` (its tensors, not copies), in eval mode,
    built on ``meta`` (to be saved: no weight is allocated twice, but non-persistent buffers
    such as RoPE's frequencies stay unmaterialised) or on ``cpu`` (to be run)."""
    cls = FixedCodeLlamaForCausalLM if isinstance(config, FixedCodeLlamaConfig) \
        else LlamaForCausalLM
    with torch.device(device):
        model = cls(config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def save_hf_model(config: LlamaConfig, state: dict, output: str) -> None:
    """Write ``config.json``, safetensors and ``generation_config.json`` (the config's BOS,
    EOS and PAD: EOD ends a generation), plus the custom code files for a fixed-code arm; a stock Llama's config also
    in the keys of transformers 4 (:func:`add_transformers4_keys`)."""
    if isinstance(config, FixedCodeLlamaConfig):
        FixedCodeLlamaConfig.register_for_auto_class()
        FixedCodeLlamaForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    model = build_hf_model(config, state)
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id,
                                               eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    model.save_pretrained(output)
    if not isinstance(config, FixedCodeLlamaConfig):
        add_transformers4_keys(os.path.join(output, "config.json"))


def add_transformers4_keys(path: str) -> None:
    """Add to a stock Llama's ``config.json`` the keys a reader built on transformers 4 reads
    where transformers 5 writes ``rope_parameters`` and ``dtype``: ``rope_theta`` (without
    it, such a reader takes RoPE's base as 10,000 in silence: vLLM bundling transformers 4,
    vllm-project/vllm#42624, llama.cpp's converter before December 2025) and
    ``torch_dtype``. transformers 5 reads them as the same values, without a word."""
    config = read_json(path)
    config.setdefault("rope_theta", config["rope_parameters"]["rope_theta"])
    config.setdefault("torch_dtype", config["dtype"])
    write_text(path, json.dumps(config, indent=2, sort_keys=True) + "\n")
