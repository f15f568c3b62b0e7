"""Core attention of the local (PyTorch) layers on torch's ``scaled_dot_product_attention``.

Megatron-Core 0.16.1's local layer spec computes attention with ``DotProductAttention``: a
batched matmul, the full ``s x s`` score matrix materialised and a softmax over it. Its only
fused attention for training is Transformer Engine's. :class:`SDPAttention` takes the same
constructor and forward arguments and returns the same ``[sq, b, hp]`` context, through
torch's fused kernels (flash / memory-efficient / cuDNN on a GPU; flash or math on a CPU):
causal without a mask tensor, grouped-query attention without copying keys and values, no
parameters (checkpoints of either are the same).
:func:`megatron_ext.model.provider.local_layer_spec` puts it in the local layers when
``--attention-backend`` (``TransformerConfig.attention_backend``) is ``auto`` or ``flash``
(:func:`local_core_attention`).

On a GPU the kernels are pinned (:func:`sdpa_kernels`): the math kernel, which materialises
the score matrix like the unfused path, is never chosen silently; an input no fused kernel
accepts is an error that says why.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide, get_tensor_model_parallel_group_if_none

from ..config.model_config import attention_backend_refusal
from ..runtime.errors import FlagError

# The fused SDPA kernels a GPU may run for each backend that selects SDPA on local layers.
GPU_KERNELS = {
    "auto": (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
             SDPBackend.EFFICIENT_ATTENTION),
    "flash": (SDPBackend.FLASH_ATTENTION,),
}


def local_core_attention(backend: str) -> type:
    """The core attention of the local layers for ``--attention-backend``: SDPA for
    ``auto`` and ``flash``, Megatron-Core's ``DotProductAttention`` for ``unfused`` and
    ``local``. ``fused`` (cuDNN's fused attention) is Transformer Engine's backend."""
    refusal = attention_backend_refusal("local", backend)
    if refusal:
        raise FlagError(refusal)
    return SDPAttention if backend in GPU_KERNELS else DotProductAttention


def sdpa_kernels(backend: str, device_type: str) -> Optional[tuple]:
    """The SDPA kernels allowed for ``backend`` on ``device_type``; ``None`` (torch's
    choice) on a CPU, where there is no fused kernel to fall back from."""
    return GPU_KERNELS[backend] if device_type == "cuda" else None


class SDPAttention(MegatronModule):
    """Drop-in for ``DotProductAttention``: ``query [sq, b, np, hn]``, ``key``/``value``
    ``[sk, b, ng, hn]`` -> ``[sq, b, np * hn]`` (this rank's heads).

    ``apply_query_key_layer_scaling`` divides Megatron's scores by the layer number and its
    softmax multiplies them back, in fp32, to keep fp16 scores in range: the probabilities
    are those of ``softmax_scale`` alone, which is what SDPA computes (its kernels accumulate
    in fp32), so the flag changes nothing here. Attention dropout runs inside Megatron's
    model-parallel RNG stream, as in ``DotProductAttention``."""

    def __init__(self, config: TransformerConfig, layer_number: int,
                 attn_mask_type: AttnMaskType, attention_type: str,
                 attention_dropout: Optional[float] = None,
                 softmax_scale: Optional[float] = None, cp_comm_type: Optional[str] = None,
                 pg_collection=None):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPAttention: context parallelism needs Transformer Engine")
        if config.window_size is not None or config.softmax_type != "vanilla":
            raise ValueError("SDPAttention: sliding windows and softmax offsets are "
                             "DotProductAttention's (--attention-backend unfused)")
        tp_group = pg_collection.tp if pg_collection is not None else \
            get_tensor_model_parallel_group_if_none(None)
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.backend = config.attention_backend.name
        head_dim = divide(config.kv_channels * config.num_attention_heads,
                          config.num_attention_heads)
        self.heads = divide(config.num_attention_heads, tp_group.size())
        self.groups = divide(config.num_query_groups, tp_group.size())
        self.softmax_scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
        self.dropout_p = config.attention_dropout if attention_dropout is None \
            else attention_dropout

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: Optional[torch.Tensor], attn_mask_type=None,
                attention_bias=None, packed_seq_params=None) -> torch.Tensor:
        """``attention_mask``: Megatron's (True where masked), or ``None``: causal from the
        layer's mask type, with no mask tensor."""
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SDPAttention: packed sequences and attention biases need "
                             "Transformer Engine")
        causal = attention_mask is None and self.attn_mask_type == AttnMaskType.causal
        if causal and query.shape[0] != key.shape[0]:
            raise ValueError("SDPAttention: a causal mask needs as many queries as keys")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, hn]
        dropout = self.dropout_p if self.training else 0.0
        rng = (tensor_parallel.get_cuda_rng_tracker().fork()
               if dropout and not self.config.sequence_parallel else contextlib.nullcontext())
        kernels = sdpa_kernels(self.backend, query.device.type)
        with rng, (sdpa_kernel(list(kernels)) if kernels else contextlib.nullcontext()):
            context = F.scaled_dot_product_attention(
                q, k, v, attn_mask=None if attention_mask is None else ~attention_mask,
                dropout_p=dropout, is_causal=causal, scale=self.softmax_scale,
                enable_gqa=self.heads != self.groups)
        sq, b = query.shape[:2]
        return context.permute(2, 0, 1, 3).reshape(sq, b, -1)

