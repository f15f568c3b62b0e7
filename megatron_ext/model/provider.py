"""The model provider: a Megatron-Core GPTModel whose input is a table (``learned``, ``frozen``,
``factorized``) or a fixed code.

Shaped like Megatron-LM's ``model_provider`` in pretrain_gpt.py. Every arm is built the same
way: GPTModel with its standard input table, which a fixed-code arm then replaces by
:class:`FixedCodeEmbedding` (with ``--code-projection``, a trainable map from the code), the
frozen arm stops training, and the factorized arm replaces by a table of rank r
(:mod:`megatron_ext.model.input_tables`). Building the table first keeps the random-number
stream, and so the backbone's initial weights, identical across arms for the same ``--seed``.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

import torch
import torch.nn.functional as F

from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.transformer.enums import AttnBackend
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_config import TransformerConfig

from ..codes.embedding import FixedCodeEmbedding
from ..codes.schemes import FixedCode, build_code
from ..config.model_config import ModelConfig
from ..config.run_config import RunConfig
from ..runtime.device_checks import transformer_engine_imports
from ..runtime.errors import DeviceError
from ..runtime.megatron_compat import mlp_submodules
from .attention import local_core_attention
from .input_tables import factorize, freeze
from .norm_layers import TorchNorm
from .residual import fp32_bias_dropout_add
from .row_linear import RowParallelLinear


def params_dtype(model: ModelConfig) -> torch.dtype:
    return torch.bfloat16 if model.bf16 else torch.float16 if model.fp16 else torch.float32


def pipeline_dtype(model: ModelConfig) -> torch.dtype:
    """The dtype of the activations pipeline stages send each other: the residual stream's.
    Under ``--fp32-residual-connection`` a stage sends fp32 whatever the parameters' dtype
    (megatron-core 0.16.1 sizes the receive buffers from ``pipeline_dtype`` alone: a bf16
    buffer receives half the bytes sent, and gloo aborts)."""
    return torch.float32 if model.fp32_residual_connection else params_dtype(model)


def fused_softmax_available() -> bool:
    """Whether the fused attention-softmax kernels (apex's extensions) import: megatron-core
    imports them only inside the forward pass, so a fusion switched on without them fails
    mid-step instead of falling back."""
    return all(importlib.util.find_spec(name) is not None
               for name in ("scaled_upper_triang_masked_softmax_cuda",
                            "scaled_masked_softmax_cuda"))


def fusions(model: ModelConfig, on_cpu: bool) -> dict:
    """Megatron-Core's fused-kernel switches: on for GPUs as in Megatron-LM, unless a
    ``--no-...-fusion`` flag says otherwise, wherever their kernels import, whatever the
    layers; off on CPU.

    RoPE's fusion is Transformer Engine's kernel (megatron-core's rope_utils imports it
    from TE) and serves local layers as well; the weight-gradient accumulation in the GEMM
    of Megatron's own linears (the local layers' and the output layer, even under TE) is
    apex's extension; the fused softmax serves the local layers' unfused attention (TE's
    attention and SDPA are fused anyway); the fused cross-entropy is
    :func:`cross_entropy_fusion`'s."""
    cross_entropy = dict(cross_entropy_loss_fusion=cross_entropy_fusion(model, on_cpu),
                         cross_entropy_fusion_impl=model.cross_entropy_fusion_impl)
    if on_cpu:
        return dict(bias_activation_fusion=False, apply_rope_fusion=False,
                    gradient_accumulation_fusion=False, masked_softmax_fusion=False,
                    **cross_entropy)
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.tensor_parallel.layers import _grad_accum_fusion_available
    return dict(bias_activation_fusion=model.bias_swiglu_fusion and model.swiglu,
                apply_rope_fusion=(model.rope_fusion
                                   and rope_utils.fused_apply_rotary_pos_emb is not None),
                gradient_accumulation_fusion=(model.gradient_accumulation_fusion
                                              and _grad_accum_fusion_available),
                masked_softmax_fusion=model.masked_softmax_fusion and fused_softmax_available(),
                **cross_entropy)


def cross_entropy_fusion(model: ModelConfig, on_cpu: bool) -> bool:
    """``--cross-entropy-loss-fusion``: by default on a GPU under ``--bf16`` (Megatron-Core's
    native fused cross-entropy is torch.compile'd, which a GPU image runs through Triton),
    off on CPU unless asked. The native implementation returns the logits' gradient in bf16
    whatever their dtype (megatron-core 0.16.1, ``fusions/fused_cross_entropy.py``): equal to
    the unfused loss under --bf16, a rounding of every gradient otherwise, so it is refused
    without --bf16 when the flags are parsed (:meth:`ModelConfig.validate`). TE's
    implementation is refused where TE does not import (megatron-core would fall back to the
    unfused loss in silence)."""
    native = model.cross_entropy_fusion_impl == "native"
    if model.cross_entropy_loss_fusion is None:
        return not on_cpu and (model.bf16 or not native)
    if not model.cross_entropy_loss_fusion:
        return False
    if not native and not transformer_engine_imports():
        raise DeviceError("--cross-entropy-fusion-impl te needs Transformer Engine, which "
                          "does not import; use --cross-entropy-fusion-impl native")
    return True


def transformer_config(config: RunConfig, on_cpu: bool,
                       initialize: bool = True) -> TransformerConfig:
    """Megatron-Core's ``TransformerConfig`` of the run's model and parallel flags."""
    model, parallel = config.model, config.parallel
    dtype = params_dtype(model)
    fp8 = {}
    if model.fp8_format:
        fp8 = dict(fp8=model.fp8_format, fp8_recipe=model.fp8_recipe,
                   fp8_amax_history_len=model.fp8_amax_history_len,
                   fp8_amax_compute_algo=model.fp8_amax_compute_algo)
    return TransformerConfig(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        ffn_hidden_size=model.ffn_hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_query_groups,
        normalization=model.normalization,
        layernorm_epsilon=model.norm_epsilon,
        gated_linear_unit=model.swiglu,
        activation_func=F.silu if model.swiglu else F.gelu,
        add_bias_linear=not model.disable_bias_linear,
        init_method_std=model.init_method_std,
        embedding_init_method_std=model.embedding_init_method_std,
        hidden_dropout=model.hidden_dropout,
        attention_dropout=model.attention_dropout,
        bf16=model.bf16,
        fp16=model.fp16,
        params_dtype=dtype,
        pipeline_dtype=pipeline_dtype(model),
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        sequence_parallel=parallel.sequence_parallel,
        attention_backend=AttnBackend[model.attention_backend],
        use_cpu_initialization=on_cpu,
        perform_initialization=initialize,
        bias_dropout_fusion=False,  # no biases, dropout 0: the residual add stays plain
        persist_layer_norm=False,  # apex only
        fp32_residual_connection=model.fp32_residual_connection,
        **fusions(model, on_cpu),
        recompute_granularity=model.recompute_granularity,
        recompute_method=model.recompute_method,
        recompute_num_layers=model.recompute_num_layers,
        # Pipeline stages free their sent outputs, and the backward pass calls the autograd
        # engine directly, as in Megatron-LM.
        deallocate_pipeline_outputs=True,
        **fp8,
    )


def local_layer_spec(model: ModelConfig):
    """Megatron-Core's local (PyTorch) transformer layer for the chosen normalization, with
    the core attention ``--attention-backend`` selects (:mod:`megatron_ext.model.attention`),
    torch's norms marked for sequence parallelism (:mod:`megatron_ext.model.norm_layers`) and
    row-parallel linears torch.compile traces whole (:mod:`megatron_ext.model.row_linear`)."""
    spec = get_gpt_layer_local_spec(normalization=model.normalization)
    layer = spec.submodules
    for name in ("input_layernorm", "pre_mlp_layernorm"):
        if getattr(layer, name) is WrappedTorchNorm:
            setattr(layer, name, TorchNorm)
    layer.self_attention.submodules.core_attention = local_core_attention(model.attention_backend)
    layer.self_attention.submodules.linear_proj = RowParallelLinear
    mlp_submodules(spec).linear_fc2 = RowParallelLinear
    return spec


def decoder_spec(model: ModelConfig,
                 config: TransformerConfig) -> TransformerBlockSubmodules:
    """This pipeline stage's transformer layers and the decoder's final norm.

    Given a layer spec alone, megatron-core builds the final norm from Transformer Engine
    whenever TE imports (``transformer_block.LayerNormImpl``), whatever the layers are: local
    layers on a machine with TE (the NGC image) then get TE's CUDA-only norm, and every CPU
    forward fails there. So the final norm is chosen with the layers: TE's for TE layers,
    the local layers' own norm otherwise. (megatron-core's ``get_gpt_decoder_block_spec``
    takes apex's LayerNorm for local layers, which refuses RMSNorm.) Under
    ``--fp32-residual-connection`` both residual adds keep the fp32 stream
    (:mod:`megatron_ext.model.residual`)."""
    if model.transformer_impl == "transformer_engine":
        if not transformer_engine_imports():
            raise DeviceError("--transformer-impl transformer_engine needs Transformer "
                              "Engine: pip install '.[gpu]' (or use the NGC container)")
        from megatron.core.extensions.transformer_engine import TENorm
        layer, final_norm = get_gpt_layer_with_transformer_engine_spec(), TENorm
    else:
        layer = local_layer_spec(model)
        final_norm = layer.submodules.input_layernorm
    if model.fp32_residual_connection:
        layer.submodules.self_attn_bda = layer.submodules.mlp_bda = fp32_bias_dropout_add
    return TransformerBlockSubmodules(
        layer_specs=[layer] * get_num_layers_to_build(config),
        layer_norm=final_norm)


def model_provider(config: RunConfig, padded_vocab_size: int, pre_process: bool = True,
                   post_process: bool = True, on_cpu: bool = False,
                   code: Optional[FixedCode] = None, initialize: bool = True) -> GPTModel:
    """Build the GPTModel of one pipeline stage for the arm ``--input-interface`` of the run's
    ``config`` (its model and parallel flags, as the run applies them).

    ``padded_vocab_size``: the tokenizer's, padded (derived.Derived; a checkpoint's saved
    arguments hold it under the same name). ``code``: the fixed code, resolved once by the
    caller (a checkpoint's saved code, or one drawn from the flags); omitted for a fixed arm,
    a new one is drawn (:func:`~megatron_ext.codes.schemes.build_code`). ``initialize`` False:
    the weights are left unset, for a caller that loads them all (a checkpoint's reader), as
    Megatron-LM's ``--no-initialization`` (only the fixed code's map and the factorised
    table's projection are still drawn).
    """
    model_flags = config.model
    transformer = transformer_config(config, on_cpu, initialize)
    if code is None:
        code = build_code(model_flags, padded_vocab_size)
    if code is not None:
        # Fail before building anything large.
        code.check_vocab(padded_vocab_size)
        code.check_width(model_flags.hidden_size)
    model = GPTModel(
        config=transformer,
        transformer_layer_spec=decoder_spec(model_flags, transformer),
        vocab_size=padded_vocab_size,
        max_sequence_length=model_flags.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=not model_flags.untie_embeddings_and_output_weights,
        position_embedding_type=model_flags.position_embedding_type,
        rotary_base=model_flags.rotary_base,
    )
    # The one difference between the arms: a fixed-code arm's input is the code, not a table;
    # the frozen and factorized arms' is another table.
    if not pre_process:
        return model
    if code is not None:
        model.embedding = FixedCodeEmbedding(
            config=transformer,
            vocab_size=padded_vocab_size,
            max_sequence_length=model_flags.max_position_embeddings,
            position_embedding_type=model_flags.position_embedding_type,
            code=code,
            impl=model_flags.fixed_code_impl,
            projection=model_flags.code_projection,
        )
    elif model_flags.input_interface == "frozen":
        freeze(model)
    elif model_flags.input_interface == "factorized":
        factorize(model, transformer, padded_vocab_size, model_flags.input_table_rank)
    return model
