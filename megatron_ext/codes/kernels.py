"""The fast fixed-code forward, for every scheme and tiling: a PyTorch path (CPU, and any
device) and a fused CUDA kernel (GPU), both equal to
:meth:`megatron_ext.codes.schemes.FixedCode.encode`.

Both compute the same form. Every tiled code is affine over GF(2) in the bits of the code input
``x(t)`` (:meth:`~megatron_ext.codes.schemes.FixedCode.row_affine`), so the row's bits, packed eight
positions to a byte (position j: byte j div 8, bit j mod 8), are the XOR of one row per byte of
x from :func:`lookup_tables`: ``row(t) = XOR_c lookup[c, (x >> 8c) & 255]``. Then each bit
becomes the low or the high value. ``x(t)`` is the id, or its entry of the code's per-id table.

``impl`` (``--fixed-code-impl``): ``auto`` uses the kernel when the ids are on a GPU and the
extension builds, else PyTorch; ``torch`` always PyTorch; ``cuda`` the kernel or an error.
"""

from __future__ import annotations

import numpy as np
import torch

from ..runtime.errors import DeviceError, FlagError
from . import cuda_extension
from .schemes import FixedCode

IMPLS = ("auto", "torch", "cuda")
CPU_CHUNK_BYTES = 1 << 20  # output written per step on CPU: stays in cache while it is built


def lookup_tables(code: FixedCode, hidden_size: int) -> torch.Tensor:
    """``[⌈n/8⌉, 256, W]`` uint8, W = ⌈hidden/32⌉·4 (whole 32-bit words): row v of table c
    is the packed row bits contributed by byte c of x being v; table 0 also holds the
    offset."""
    M, o = code.row_affine(hidden_size)
    width = -(-hidden_size // 32) * 4

    def packed(bits: torch.Tensor) -> torch.Tensor:  # [..., hidden] 0/1 -> [..., width] bytes
        padded = torch.zeros(*bits.shape[:-1], width * 8, dtype=torch.int64, device="cpu")
        padded[..., :hidden_size] = bits
        weights = 1 << torch.arange(8, dtype=torch.int64, device="cpu")
        return (padded.view(*bits.shape[:-1], width, 8) * weights).sum(-1).to(torch.uint8)

    columns = packed(M.t())  # [n, width]
    tables = torch.zeros(-(-code.num_bits // 8), 256, width, dtype=torch.uint8, device="cpu")
    for k in range(code.num_bits):
        c, i = divmod(k, 8)  # rows with bit i set: the rows without it, XOR column k
        tables[c, 1 << i: 2 << i] = tables[c, : 1 << i] ^ columns[k]
    tables[0] ^= packed(o)
    return tables


def packed_rows(x: torch.Tensor, lookup: torch.Tensor) -> torch.Tensor:
    """``x [T]`` int64 code inputs -> ``[T, W]`` uint8 packed row bits."""
    rows = lookup[0].index_select(0, x & 255)
    for c in range(1, lookup.shape[0]):
        rows ^= lookup[c].index_select(0, (x >> (8 * c)) & 255)
    return rows


def _bit_patterns(low: float, high: float, dtype: torch.dtype) -> tuple[int, int]:
    """``(pattern of low, pattern of low XOR pattern of high)``, as signed integers of the
    dtype's width: a value is ``low_pattern ^ (bit * diff_pattern)``."""
    as_int = {2: torch.int16, 4: torch.int32}[dtype.itemsize]
    values = torch.tensor([low, high], dtype=dtype, device="cpu")
    low_bits, high_bits = values.view(as_int).tolist()
    return low_bits, low_bits ^ high_bits


def _expand_cpu(x: torch.Tensor, lookup: torch.Tensor, hidden_size: int, dtype: torch.dtype,
                low: float, high: float) -> torch.Tensor:
    """The PyTorch path on CPU: the packed rows of all tokens, then the values written into
    the output a chunk of tokens at a time (numpy's unpackbits, then one multiply and one XOR
    on the values' bit patterns), so that each step's intermediates stay in cache."""
    out = torch.empty(len(x), hidden_size, dtype=dtype, device="cpu")
    as_int = {2: np.int16, 4: np.int32}[dtype.itemsize]
    patterns = out.view({2: torch.int16, 4: torch.int32}[dtype.itemsize]).numpy()
    low_bits, diff_bits = (as_int(v) for v in _bit_patterns(low, high, dtype))
    rows = packed_rows(x, lookup).numpy()
    step = max(1, CPU_CHUNK_BYTES // (hidden_size * dtype.itemsize))
    for start in range(0, len(x), step):
        bits = np.unpackbits(rows[start:start + step], axis=-1, count=hidden_size,
                             bitorder="little")
        chunk = patterns[start:start + step]
        np.multiply(bits, diff_bits, out=chunk, dtype=as_int)
        np.bitwise_xor(chunk, low_bits, out=chunk)
    return out


def _expand(x: torch.Tensor, lookup: torch.Tensor, hidden_size: int, dtype: torch.dtype,
            low: float, high: float) -> torch.Tensor:
    """The PyTorch path on any other device."""
    shifts = torch.arange(8, dtype=torch.uint8, device=x.device)
    bits = (packed_rows(x, lookup).unsqueeze(-1) >> shifts) & 1
    bits = bits.flatten(-2)[:, :hidden_size].bool()
    return torch.where(bits, torch.tensor(high, dtype=dtype, device=x.device),
                       torch.tensor(low, dtype=dtype, device=x.device))


def _use_kernel(ids: torch.Tensor, impl: str) -> bool:
    if impl not in IMPLS:
        raise FlagError(f"unknown fixed-code implementation {impl!r}; choose from {IMPLS}")
    if impl == "torch":
        return False
    if impl == "auto":
        return ids.is_cuda and cuda_extension.available()
    if not ids.is_cuda:
        raise DeviceError(
            f"--fixed-code-impl cuda needs the token ids on a GPU, but they are on {ids.device} "
            f"(torch.cuda.is_available() = {torch.cuda.is_available()}); use auto or torch")
    cuda_extension.load()  # raises, saying why, when the extension cannot be built
    return True


def fixed_code_forward(code: FixedCode, ids: torch.Tensor, table: torch.Tensor,
                       lookup: torch.Tensor, hidden_size: int, dtype: torch.dtype,
                       impl: str = "auto") -> torch.Tensor:
    """``ids [...]`` -> the tiled code ``[..., hidden_size]`` in ``dtype``. ``table`` (the code's
    per-id table, or empty) and ``lookup`` (:func:`lookup_tables` of the code at this width)
    on ids' device, as :class:`~megatron_ext.codes.embedding.FixedCodeEmbedding` holds them."""
    low, high = code.bit_values()
    if _use_kernel(ids, impl):
        return cuda_extension.load().tiled_code(ids.long(), table, lookup, hidden_size, low,
                                                high, dtype)
    flat = ids.reshape(-1).long()
    x = table[flat] if table.numel() else flat
    expand = _expand_cpu if x.device.type == "cpu" else _expand
    return expand(x, lookup, hidden_size, dtype, low, high).view(*ids.shape, hidden_size)
