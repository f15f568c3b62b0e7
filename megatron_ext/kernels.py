"""Selects the implementation of the fixed-code forward: the PyTorch reference (CPU, and any
device) or a fused CUDA kernel (GPU), both computing :func:`megatron_ext.codes.tiled_code`.

``impl`` (``--fixed-code-impl``): ``auto`` uses the kernel when the ids are on a GPU and the
extension builds, else PyTorch; ``torch`` always PyTorch; ``cuda`` the kernel or an error.
"""

from __future__ import annotations

import torch

from . import cuda_extension
from .codes import FixedCode, tiled_code

IMPLS = ("auto", "torch", "cuda")


def affine_masks(code: FixedCode) -> tuple[list[int], int]:
    """The code as ``c = A·bits ⊕ b`` over GF(2), packed for the kernel: the n columns of A
    and b, each an n-bit mask (bit i = row i). The binary code is ``A = I, b = 0``."""
    n = code.num_bits
    if code.A is None:
        return [1 << k for k in range(n)], 0
    rows = 1 << torch.arange(n, dtype=torch.int64)
    columns = (code.A.to(torch.int64) * rows.unsqueeze(1)).sum(0)
    return columns.tolist(), int((code.b.to(torch.int64) * rows).sum())


def _use_kernel(ids: torch.Tensor, impl: str) -> bool:
    if impl not in IMPLS:
        raise ValueError(f"unknown fixed-code implementation {impl!r}; choose from {IMPLS}")
    if impl == "torch":
        return False
    if impl == "auto":
        return ids.is_cuda and cuda_extension.available()
    if not ids.is_cuda:
        raise RuntimeError(
            f"--fixed-code-impl cuda needs the token ids on a GPU, but they are on {ids.device} "
            f"(torch.cuda.is_available() = {torch.cuda.is_available()}); use auto or torch")
    cuda_extension.load()  # raises, saying why, when the extension cannot be built
    return True


def fixed_code_forward(code: FixedCode, ids: torch.Tensor, A: torch.Tensor, b: torch.Tensor,
                       hidden_size: int, dtype: torch.dtype, impl: str = "auto") -> torch.Tensor:
    """``ids [...]`` -> tiled code ``[..., hidden_size]`` in ``dtype``; A and b on ids' device
    (the PyTorch path reads them; the kernel takes ``code``'s own A and b, packed)."""
    if not _use_kernel(ids, impl):
        return tiled_code(ids, code.num_bits, hidden_size, code.values, code.scale, dtype, A, b)
    columns, offset = affine_masks(code)
    low = -code.scale if code.values == "pm1" else 0.0
    return cuda_extension.load().tiled_code(ids.long(), hidden_size, code.num_bits, columns,
                                            offset, low, code.scale, dtype)
