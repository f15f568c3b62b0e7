"""The residual add of the transformer layers under ``--fp32-residual-connection``.

Megatron-Core 0.16.1 honours ``fp32_residual_connection`` only in its input embedding: its
bias-dropout-add casts the residual to the layer output's dtype (fusions/fused_bias_dropout.py),
so under ``--bf16`` the stream is bf16 again after the first layer. :func:`fp32_bias_dropout_add`
adds in the residual's dtype instead, and :func:`megatron_ext.model.provider.decoder_spec` puts it
in both adds of every layer when the flag is on: the stream stays fp32 end to end, the layers still
compute in bf16 (:class:`megatron_ext.model.norm_layers.TorchNorm` hands them bf16).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def fp32_bias_dropout_add(training: bool, fused: bool = False):
    """Same signature as megatron-core's ``get_bias_dropout_add``: returns
    ``f((x, bias), residual, prob) = residual + dropout(x + bias)`` in the residual's dtype."""
    def bias_dropout_add(x_with_bias: tuple[torch.Tensor, Optional[torch.Tensor]],
                         residual: torch.Tensor, prob: float) -> torch.Tensor:
        x, bias = x_with_bias
        if bias is not None:
            x = x + bias
        return residual + F.dropout(x, p=prob, training=training).to(residual.dtype)
    return bias_dropout_add
