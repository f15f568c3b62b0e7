"""Fixed, parameter-free codes of token ids: the science of the project in pure tensor functions.

Everything else (the Megatron embedding module, the CUDA kernel, the Hugging Face export)
computes exactly what this module defines, and is tested against it.

Definitions (n = ``num_bits``, default 16):

* ``bits(t)[k] = (t >> k) & 1`` for k = 0..n-1: **least significant bit first**.
* ``binary``: ``c(t) = bits(t)``.
* ``gf2``: ``c(t) = A·bits(t) ⊕ b`` over GF(2), with ``A`` an invertible n×n 0/1 matrix and
  ``b`` an n-vector, both drawn from ``code_seed`` (see :func:`draw_gf2_affine`) and then
  stored explicitly (checkpoints, exported configs), so the code never depends on
  regenerating them.
* values: bit ``c`` becomes ``scale·(2c-1)`` (``pm1``, default) or ``scale·c`` (``01``).
* tiling to width h: output position j holds code bit ``j mod n``, i.e. the n-vector
  repeated h/n times; h must be a multiple of n.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

SCHEMES = ("binary", "gf2")
VALUE_MAPS = ("pm1", "01")


def bits_of(ids: torch.Tensor, num_bits: int) -> torch.Tensor:
    """Bits of integer ids, least significant first: ``[...] -> [..., num_bits]`` (int64 0/1)."""
    shifts = torch.arange(num_bits, device=ids.device, dtype=torch.int64)
    return (ids.to(torch.int64).unsqueeze(-1) >> shifts) & 1


def ids_of(bits: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`bits_of`: ``[..., n]`` 0/1 -> int64 ids."""
    weights = 1 << torch.arange(bits.shape[-1], device=bits.device, dtype=torch.int64)
    return (bits.to(torch.int64) * weights).sum(-1)


def code_bits(ids: torch.Tensor, num_bits: int, A: Optional[torch.Tensor] = None,
              b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Code bits ``[...] -> [..., n]`` (int64 0/1): ``bits(id)``, or ``A·bits(id) ⊕ b`` when
    ``A`` and ``b`` are given."""
    bits = bits_of(ids, num_bits)
    if A is None or A.numel() == 0:
        return bits
    A = A.to(device=ids.device, dtype=torch.int64)
    b = b.to(device=ids.device, dtype=torch.int64)
    # (A·x)_i = sum_k A[i,k] x_k; integer sums stay exact, then reduce mod 2.
    return ((bits.unsqueeze(-2) * A).sum(-1) + b) & 1


def tiled_code(ids: torch.Tensor, num_bits: int, hidden_size: int, values: str, scale: float,
               dtype: torch.dtype, A: Optional[torch.Tensor] = None,
               b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The reference fixed-code input: ``[...] -> [..., hidden_size]`` in ``dtype``."""
    c = code_bits(ids, num_bits, A, b).to(dtype)
    if values == "pm1":
        c = 2 * c - 1
    return (c * scale).repeat(*([1] * ids.dim()), hidden_size // num_bits)


def gf2_rank(matrix: torch.Tensor) -> int:
    """Rank of a 0/1 matrix over GF(2), by Gaussian elimination."""
    m = matrix.to(device="cpu", dtype=torch.uint8).clone() & 1
    rows, cols = m.shape
    rank = 0
    for col in range(cols):
        pivots = torch.nonzero(m[rank:, col], as_tuple=False)
        if pivots.numel() == 0:
            continue
        pivot = rank + int(pivots[0])
        m[[rank, pivot]] = m[[pivot, rank]]
        others = torch.nonzero(m[:, col], as_tuple=False).flatten()
        others = others[others != rank]
        m[others] ^= m[rank]
        rank += 1
        if rank == rows:
            break
    return rank


def gf2_inverse(matrix: torch.Tensor) -> torch.Tensor:
    """Inverse of an invertible 0/1 matrix over GF(2) (Gauss-Jordan); raises if singular."""
    n = matrix.shape[0]
    if matrix.shape != (n, n):
        raise ValueError(f"GF(2) inverse needs a square matrix, got shape {tuple(matrix.shape)}")
    aug = torch.cat([matrix.to(device="cpu", dtype=torch.uint8) & 1,
                     torch.eye(n, dtype=torch.uint8, device="cpu")], dim=1)
    for col in range(n):
        pivots = torch.nonzero(aug[col:, col], as_tuple=False)
        if pivots.numel() == 0:
            raise ValueError("matrix is singular over GF(2)")
        pivot = col + int(pivots[0])
        aug[[col, pivot]] = aug[[pivot, col]]
        others = torch.nonzero(aug[:, col], as_tuple=False).flatten()
        others = others[others != col]
        aug[others] ^= aug[col]
    return aug[:, n:].clone()


def draw_gf2_affine(num_bits: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``(A, b)`` deterministically from ``seed``: uniform 0/1 matrices, redrawn until
    invertible over GF(2) (about 29% of draws are), and a uniform 0/1 vector ``b``."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    while True:
        A = torch.randint(0, 2, (num_bits, num_bits), generator=gen, dtype=torch.uint8,
                          device="cpu")
        if gf2_rank(A) == num_bits:
            break
    b = torch.randint(0, 2, (num_bits,), generator=gen, dtype=torch.uint8, device="cpu")
    return A, b


@dataclasses.dataclass
class FixedCode:
    """A fixed code of token ids. Build with :meth:`create`; serialise with :meth:`to_dict`."""

    scheme: str
    num_bits: int = 16
    values: str = "pm1"
    scale: float = 1.0
    A: Optional[torch.Tensor] = None  # [n, n] uint8, gf2 only
    b: Optional[torch.Tensor] = None  # [n] uint8, gf2 only

    def __post_init__(self):
        if self.scheme not in SCHEMES:
            raise ValueError(f"unknown code scheme {self.scheme!r}; choose from {SCHEMES}")
        if self.values not in VALUE_MAPS:
            raise ValueError(f"unknown code values {self.values!r}; choose from {VALUE_MAPS}")
        if not 1 <= self.num_bits <= 62:
            raise ValueError(f"--code-bits must be in [1, 62], got {self.num_bits}")
        if not self.scale > 0:
            raise ValueError(f"--code-scale must be positive, got {self.scale}")
        if self.scheme == "gf2":
            if self.A is None or self.b is None:
                raise ValueError("a gf2 code needs its matrix A and vector b")
            self.A = torch.as_tensor(self.A, dtype=torch.uint8, device="cpu")
            self.b = torch.as_tensor(self.b, dtype=torch.uint8, device="cpu")
            n = self.num_bits
            if self.A.shape != (n, n) or self.b.shape != (n,):
                raise ValueError(
                    f"gf2 code with {n} bits needs A of shape ({n}, {n}) and b of shape ({n},); "
                    f"got {tuple(self.A.shape)} and {tuple(self.b.shape)}")
            if bool(((self.A > 1).any() | (self.b > 1).any())):
                raise ValueError("gf2 code: A and b must hold only 0 and 1")
            if gf2_rank(self.A) != n:
                raise ValueError("gf2 code: A is not invertible over GF(2)")
        elif self.A is not None or self.b is not None:
            raise ValueError("a binary code has no A or b")

    @classmethod
    def create(cls, scheme: str, num_bits: int = 16, values: str = "pm1", scale: float = 1.0,
               seed: int = 0) -> "FixedCode":
        """A new code; for ``gf2``, ``A`` and ``b`` are drawn from ``seed``."""
        A = b = None
        if scheme == "gf2":
            A, b = draw_gf2_affine(num_bits, seed)
        return cls(scheme=scheme, num_bits=num_bits, values=values, scale=scale, A=A, b=b)

    def check_vocab(self, vocab_size: int) -> None:
        """Every id in ``[0, vocab_size)`` must have its own code: ``vocab_size <= 2**num_bits``."""
        if vocab_size > 2 ** self.num_bits:
            raise ValueError(
                f"vocabulary of {vocab_size} tokens does not fit a {self.num_bits}-bit code "
                f"(at most 2^{self.num_bits} = {2 ** self.num_bits}); raise --code-bits to at least "
                f"{max(vocab_size - 1, 1).bit_length()}")

    def check_width(self, hidden_size: int) -> None:
        if hidden_size % self.num_bits:
            raise ValueError(
                f"--hidden-size {hidden_size} is not a multiple of --code-bits {self.num_bits}: "
                f"the {self.num_bits}-bit code is tiled (repeated) to the model width")

    def code_bits(self, ids: torch.Tensor) -> torch.Tensor:
        """The n code bits of each id: ``[...] -> [..., n]`` int64 0/1."""
        return code_bits(ids, self.num_bits, self.A, self.b)

    def encode(self, ids: torch.Tensor, hidden_size: int,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The tiled code: ``[...] -> [..., hidden_size]``, position j holds bit ``j mod n``."""
        self.check_width(hidden_size)
        return tiled_code(ids, self.num_bits, hidden_size, self.values, self.scale, dtype,
                          self.A, self.b)

    def decode(self, values: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`encode`: ``[..., k·n] -> [...]`` ids (k >= 1).

        Reads the first n positions; a value decodes to bit 1 when it lies above the midpoint
        of the two code values."""
        threshold = 0.0 if self.values == "pm1" else self.scale / 2
        c = (values[..., : self.num_bits] > threshold).to(torch.int64)
        if self.scheme == "gf2":
            A_inv = gf2_inverse(self.A).to(device=values.device, dtype=torch.int64)
            c = ((c ^ self.b.to(device=values.device, dtype=torch.int64)).unsqueeze(-2)
                 * A_inv).sum(-1) & 1
        return ids_of(c)

    def to_dict(self) -> dict:
        """A JSON-able description, stored in checkpoints and exported configs."""
        return {
            "scheme": self.scheme,
            "num_bits": self.num_bits,
            "values": self.values,
            "scale": float(self.scale),
            "A": None if self.A is None else self.A.tolist(),
            "b": None if self.b is None else self.b.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "FixedCode":
        return cls(scheme=d["scheme"], num_bits=int(d["num_bits"]), values=d["values"],
                   scale=float(d["scale"]), A=d.get("A"), b=d.get("b"))

    def __eq__(self, other) -> bool:
        return isinstance(other, FixedCode) and self.to_dict() == other.to_dict()
