"""Selects the implementation of the fixed-code forward: the PyTorch reference (CPU, and any
device) or a fused CUDA kernel (GPU), both computing :func:`megatron_ext.codes.tiled_code`."""

from __future__ import annotations

import torch

from .codes import FixedCode, tiled_code


def fixed_code_forward(code: FixedCode, ids: torch.Tensor, A: torch.Tensor, b: torch.Tensor,
                       hidden_size: int, dtype: torch.dtype) -> torch.Tensor:
    """``ids [...]`` -> tiled code ``[..., hidden_size]`` in ``dtype``; A and b on ids' device."""
    return tiled_code(ids, code.num_bits, hidden_size, code.values, code.scale, dtype, A, b)
