"""Fixed, parameter-free codes of token ids: the science of the project in pure tensor functions.

Everything else (the Megatron embedding module, the CUDA kernel, the Hugging Face export)
computes exactly what this module defines, and is tested against it. docs/codes.md states the
same definitions for citation. With n = ``num_bits`` (1..62), V the (padded)
vocabulary and h the model width:

* ``bits(x)[k] = (x >> k) & 1`` for k = 0..n-1: **least significant bit first**.
* the code input ``x(t)``: ``t`` for ``binary`` and ``gf2``; ``table[t]`` for ``permuted``
  (``table`` a permutation of ``[0, V)``) and ``random`` (``table`` V distinct integers in
  ``[0, 2^n)``).
* the base code ``c(t)``: ``bits(x(t))``, or for ``gf2`` ``A·bits(t) ⊕ b`` over GF(2), with
  ``A`` an invertible n×n 0/1 matrix and ``b`` an n-vector.
* tiling to width h, in R = ⌈h/n⌉ blocks of n positions: position j holds bit ``j mod n`` of
  block ``r = j div n``; the last block is truncated to its first ``h - (R-1)·n`` bits. Block r
  is ``c(t)`` (``repeat``) or ``A_r·c(t) ⊕ b_r`` (``recode``: one invertible affine map per
  block). h >= n: block 0 is always whole.
* values: bit 1 becomes ``scale`` and bit 0 ``-scale`` (``pm1``), or 1 -> ``scale``
  and 0 -> ``0`` (``01``).

Every random part (A, b; table; the A_r, b_r) is drawn once from ``seed`` by
:meth:`FixedCode.create` and then **stored** (checkpoints, exported configs): a saved model never
depends on redrawing it. A code's options have no defaults here: the ``--code-*`` flags declare
them (``config.model_config``), and :func:`build_code` draws a run's code from them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

# The names are defined in limits.py, without torch; the codes' public module has them too.
from .limits import (ARMS, PAPER_ARMS, SCHEMES, TABLE_SCHEMES, TABLES, TILINGS,  # noqa: F401
                     VALUE_MAPS, check_options, check_vocab_fits)


def num_blocks(num_bits: int, hidden_size: int) -> int:
    """R = ⌈h/n⌉ blocks tile the width h; the last holds ``h - (R-1)·n`` bits."""
    return math.ceil(hidden_size / num_bits)


def bits_of(ids: torch.Tensor, num_bits: int) -> torch.Tensor:
    """Bits of integer ids, least significant first: ``[...] -> [..., num_bits]`` (int64 0/1)."""
    shifts = torch.arange(num_bits, device=ids.device, dtype=torch.int64)
    return (ids.to(torch.int64).unsqueeze(-1) >> shifts) & 1


def ids_of(bits: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`bits_of`: ``[..., n]`` 0/1 -> int64 ids."""
    weights = 1 << torch.arange(bits.shape[-1], device=bits.device, dtype=torch.int64)
    return (bits.to(torch.int64) * weights).sum(-1)


def gf2_affine(bits: torch.Tensor, A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``A·bits ⊕ b`` over GF(2) for each map stacked in A: ``bits [..., n]``, ``A [*S, m, n]``,
    ``b [*S, m]`` -> ``[..., *S, m]`` int64 0/1."""
    *stack, m, n = A.shape
    A = A.to(device=bits.device, dtype=torch.float32).reshape(-1, n)
    # (A·x)_i = sum_k A[i,k] x_k: one float32 matmul of 0/1 values, exact (sums <= 62), mod 2.
    sums = bits.to(torch.float32).reshape(-1, n) @ A.t()
    sums = sums.to(torch.int64).view(*bits.shape[:-1], *stack, m)
    return (sums + b.to(device=bits.device, dtype=torch.int64)) & 1


def _gf2_rows(matrix: torch.Tensor) -> list[int]:
    """The rows of a 0/1 matrix as Python integers (bit k = column k)."""
    weights = 1 << torch.arange(matrix.shape[1], dtype=torch.int64, device="cpu")
    return ((matrix.to(device="cpu", dtype=torch.int64) & 1) * weights).sum(1).tolist()


def gf2_rank(matrix: torch.Tensor) -> int:
    """Rank of a 0/1 matrix over GF(2), by Gaussian elimination on rows packed as integers."""
    rank, rows = 0, _gf2_rows(matrix)
    while rows:
        pivot = rows.pop()
        if pivot:
            rank += 1
            low = pivot & -pivot  # eliminate the pivot's lowest set column from the others
            rows = [r ^ pivot if r & low else r for r in rows]
    return rank


def gf2_inverse(matrix: torch.Tensor) -> torch.Tensor:
    """Inverse of an invertible 0/1 matrix over GF(2) (Gauss-Jordan); raises if singular."""
    n = matrix.shape[0]
    if matrix.shape != (n, n):
        raise ValueError(f"GF(2) inverse needs a square matrix, got shape {tuple(matrix.shape)}")
    # Row i of [matrix | I] as one integer: bits 0..n-1 the matrix, n..2n-1 the identity.
    rows = [r | (1 << (n + i)) for i, r in enumerate(_gf2_rows(matrix))]
    for col in range(n):
        pivot = next((i for i in range(col, n) if rows[i] >> col & 1), None)
        if pivot is None:
            raise ValueError("matrix is singular over GF(2)")
        rows[col], rows[pivot] = rows[pivot], rows[col]
        rows = [r ^ rows[col] if i != col and r >> col & 1 else r for i, r in enumerate(rows)]
    inverse = torch.tensor([r >> n for r in rows], dtype=torch.int64, device="cpu")
    return bits_of(inverse, n).to(torch.uint8)


def draw_gf2_affine(num_bits: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``(A, b)`` from ``gen``: uniform 0/1 matrices, redrawn until invertible over GF(2)
    (about 29% of draws are), then a uniform 0/1 vector ``b``."""
    while True:
        A = torch.randint(0, 2, (num_bits, num_bits), generator=gen, dtype=torch.uint8,
                          device="cpu")
        if gf2_rank(A) == num_bits:
            break
    b = torch.randint(0, 2, (num_bits,), generator=gen, dtype=torch.uint8, device="cpu")
    return A, b


def draw_distinct(count: int, num_bits: int, gen: torch.Generator) -> torch.Tensor:
    """``count`` distinct integers uniform in ``[0, 2^num_bits)``, in draw order: a prefix of a
    random permutation when they fill over a quarter of the range, else uniform draws with
    repeats dropped (each round keeps at least 3/4 of its draws)."""
    space = 1 << num_bits
    if count > space:
        raise ValueError(f"{count} distinct {num_bits}-bit codes do not exist")
    if 4 * count > space:
        return torch.randperm(space, generator=gen, device="cpu")[:count]
    seen: dict[int, None] = {}
    while len(seen) < count:
        for v in torch.randint(0, space, (count - len(seen),), generator=gen,
                               device="cpu").tolist():
            seen.setdefault(v)
    return torch.tensor(list(seen), dtype=torch.int64, device="cpu")


@dataclasses.dataclass(eq=False)
class FixedCode:
    """A fixed code of token ids. Build with :meth:`create`; serialise with :meth:`to_dict`.

    ``A``, ``b``: gf2 only. ``table``: ``[V]`` int64 code inputs, permuted and random only.
    ``recode_A [R, n, n]``, ``recode_b [R, n]``: the per-block maps, ``recode`` tiling only."""

    scheme: str
    num_bits: int
    values: str
    scale: float
    tiling: str
    A: Optional[torch.Tensor] = None
    b: Optional[torch.Tensor] = None
    table: Optional[torch.Tensor] = None
    recode_A: Optional[torch.Tensor] = None
    recode_b: Optional[torch.Tensor] = None

    def __post_init__(self):
        for name, value, choices in (("scheme", self.scheme, SCHEMES),
                                     ("values", self.values, VALUE_MAPS),
                                     ("tiling", self.tiling, TILINGS)):
            if value not in choices:
                raise ValueError(f"unknown code {name} {value!r}; choose from {choices}")
        check_options(self.num_bits, self.scale)
        n = self.num_bits
        self.A, self.b = self._affine("gf2", self.scheme == "gf2", self.A, self.b, (n, n))
        self.recode_A, self.recode_b = self._affine(
            "recode tiling", self.tiling == "recode", self.recode_A, self.recode_b, (-1, n, n))
        if (self.scheme in TABLE_SCHEMES) != (self.table is not None):
            raise ValueError(f"a {self.scheme} code {'needs' if self.table is None else 'has no'} "
                             f"per-id table")
        if self.table is not None:
            self.table = torch.as_tensor(self.table, dtype=torch.int64, device="cpu")
            self._check_table()

    def _affine(self, what: str, needed: bool, A, b, shape: tuple) -> tuple:
        """Validated ``(A, b)`` as uint8 when ``needed`` (every A invertible), else
        ``(None, None)``."""
        if not needed:
            if A is not None or b is not None:
                raise ValueError(f"only a {what} code has the matrices and vectors of {what}")
            return None, None
        if A is None or b is None:
            raise ValueError(f"a {what} code needs its matrix A and vector b")
        A = torch.as_tensor(A, dtype=torch.uint8, device="cpu")
        b = torch.as_tensor(b, dtype=torch.uint8, device="cpu")
        n = self.num_bits
        if (A.dim() != len(shape) or A.shape[-2:] != (n, n) or b.shape != A.shape[:-1]
                or A.numel() == 0):
            raise ValueError(f"{what} code with {n} bits needs A of shape {shape} and b of shape "
                             f"{shape[:-1]} (-1: any); got {tuple(A.shape)} and {tuple(b.shape)}")
        if bool((A > 1).any() | (b > 1).any()):
            raise ValueError(f"{what} code: A and b must hold only 0 and 1")
        if any(gf2_rank(m) != n for m in A.reshape(-1, n, n)):
            raise ValueError(f"{what} code: A is not invertible over GF(2)")
        return A, b

    def _check_table(self) -> None:
        t, n = self.table, self.num_bits
        if t.dim() != 1 or t.numel() == 0:
            raise ValueError(f"the {self.scheme} code's table must be a non-empty list of ids")
        if self.scheme == "permuted":
            if not torch.equal(torch.sort(t).values, torch.arange(len(t), device="cpu")):
                raise ValueError("the permuted code's table is not a permutation of its ids")
        elif bool((t < 0).any() | (t >= 1 << n).any()) or len(torch.unique(t)) != len(t):
            raise ValueError(f"the random code's table must hold distinct integers in "
                             f"[0, 2^{n})")
        self.check_vocab(len(t))

    @classmethod
    def create(cls, scheme: str, *, num_bits: int, values: str, scale: float, seed: int,
               tiling: str, vocab_size: Optional[int] = None,
               hidden_size: Optional[int] = None) -> "FixedCode":
        """A new code, its random parts drawn from one generator seeded with ``seed``: first the
        scheme's (gf2: A then b; permuted: the permutation; random: the table), then the R
        recode maps in block order. Every option is given (a run's are its ``--code-*`` flags:
        :func:`build_code`); ``vocab_size`` is needed by permuted and random, ``hidden_size``
        by the recode tiling."""
        if scheme in TABLE_SCHEMES and vocab_size is None:
            raise ValueError(f"a {scheme} code is drawn for a vocabulary: give vocab_size")
        if tiling == "recode" and hidden_size is None:
            raise ValueError("a recode tiling is drawn for a width: give hidden_size")
        check_options(num_bits, scale, hidden_size)
        if vocab_size is not None:
            check_vocab_fits(vocab_size, num_bits)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        parts = {}
        if scheme == "gf2":
            parts["A"], parts["b"] = draw_gf2_affine(num_bits, gen)
        elif scheme == "permuted":
            parts["table"] = torch.randperm(vocab_size, generator=gen, device="cpu")
        elif scheme == "random":
            parts["table"] = draw_distinct(vocab_size, num_bits, gen)
        if tiling == "recode":
            maps = [draw_gf2_affine(num_bits, gen) for _ in range(num_blocks(num_bits,
                                                                             hidden_size))]
            parts["recode_A"] = torch.stack([A for A, _ in maps])
            parts["recode_b"] = torch.stack([b for _, b in maps])
        return cls(scheme=scheme, num_bits=num_bits, values=values, scale=scale, tiling=tiling,
                   **parts)

    def check_vocab(self, vocab_size: int) -> None:
        """The code serves ids ``[0, vocab_size)``: they fit n bits, and a per-id table covers
        exactly them."""
        check_vocab_fits(vocab_size, self.num_bits)
        if self.table is not None and len(self.table) != vocab_size:
            raise ValueError(f"the {self.scheme} code was drawn for a vocabulary of "
                             f"{len(self.table)} ids, not {vocab_size}")

    def check_width(self, hidden_size: int) -> None:
        """The code tiles ``hidden_size`` positions (see the module docstring)."""
        check_options(self.num_bits, self.scale, hidden_size)
        blocks = num_blocks(self.num_bits, hidden_size)
        if self.recode_A is not None and len(self.recode_A) != blocks:
            raise ValueError(
                f"this recode tiling was drawn for {len(self.recode_A)} blocks of {self.num_bits} "
                f"bits, but --hidden-size {hidden_size} needs {blocks}")

    def code_input(self, ids: torch.Tensor) -> torch.Tensor:
        """``x(t)``: the id itself, or its entry of the per-id table (int64, ids' device)."""
        if self.table is None:
            return ids.to(torch.int64)
        return self.table.to(ids.device)[ids.to(torch.int64)]

    def code_bits(self, ids: torch.Tensor) -> torch.Tensor:
        """The base code ``c(t)``: ``[...] -> [..., n]`` int64 0/1."""
        return self.bits_of_input(self.code_input(ids))

    def bits_of_input(self, x: torch.Tensor) -> torch.Tensor:
        """``c`` as a function of the code input: ``bits(x)``, or ``A·bits(x) ⊕ b`` (gf2)."""
        bits = bits_of(x, self.num_bits)
        return bits if self.A is None else gf2_affine(bits, self.A, self.b)

    def row_bits_of_input(self, x: torch.Tensor, hidden_size: int) -> torch.Tensor:
        """The tiled bits ``[...] -> [..., hidden_size]`` (int64 0/1) of code inputs ``x``."""
        self.check_width(hidden_size)
        c = self.bits_of_input(x)
        blocks = num_blocks(self.num_bits, hidden_size)
        if self.recode_A is None:
            tiled = c.unsqueeze(-2).expand(*c.shape[:-1], blocks, self.num_bits)
        else:  # block r: A_r·c ⊕ b_r
            tiled = gf2_affine(c, self.recode_A, self.recode_b)
        return tiled.reshape(*c.shape[:-1], blocks * self.num_bits)[..., :hidden_size]

    def row_bits(self, ids: torch.Tensor, hidden_size: int) -> torch.Tensor:
        """The tiled bits of token ids: ``[...] -> [..., hidden_size]`` int64 0/1."""
        return self.row_bits_of_input(self.code_input(ids), hidden_size)

    def bit_values(self) -> tuple[float, float]:
        """``(value of bit 0, value of bit 1)``."""
        return (-self.scale if self.values == "pm1" else 0.0), self.scale

    def encode(self, ids: torch.Tensor, hidden_size: int,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The reference fixed-code input: ``[...] -> [..., hidden_size]`` in ``dtype``."""
        low, high = self.bit_values()
        return torch.where(self.row_bits(ids, hidden_size).bool(),
                           torch.tensor(high, dtype=dtype, device=ids.device),
                           torch.tensor(low, dtype=dtype, device=ids.device))

    def row_affine(self, hidden_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every tiled code is affine over GF(2) in ``bits(x)``: ``row = M·bits(x) ⊕ o``.
        Returns ``(M [hidden_size, n], o [hidden_size])`` (int64 0/1), read off the definition
        at ``x = 0`` (``o``) and ``x = 2^k`` (column k of M, XOR o). The kernels compute this
        form."""
        x = torch.cat([torch.zeros(1, dtype=torch.int64, device="cpu"),
                       1 << torch.arange(self.num_bits, dtype=torch.int64, device="cpu")])
        rows = self.row_bits_of_input(x, hidden_size)
        return (rows[1:] ^ rows[0]).t(), rows[0]

    def decode(self, values: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`encode`: ``[..., h] -> [...]`` ids, from block 0 (positions 0..n-1).

        A value decodes to bit 1 when it lies above the midpoint of the two code values; an
        input that no id encodes to decodes to -1 (per-id tables) or to its binary value."""
        low, high = self.bit_values()
        c = (values[..., : self.num_bits] > (low + high) / 2).to(torch.int64)
        for A, b in ((self.recode_A, self.recode_b), (self.A, self.b)):
            if A is not None:  # undo block 0's recoding, then gf2's map
                A0, b0 = (A[0], b[0]) if A.dim() == 3 else (A, b)
                c = gf2_affine(c ^ b0.to(device=c.device, dtype=torch.int64),
                               gf2_inverse(A0), torch.zeros_like(b0))
        x = ids_of(c)
        if self.table is None:
            return x
        order = torch.argsort(self.table).to(x.device)
        inputs = self.table.to(x.device)[order]
        where = torch.searchsorted(inputs, x).clamp(max=len(inputs) - 1)
        return torch.where(inputs[where] == x, order[where], -1)

    def to_dict(self) -> dict:
        """A JSON-able description, stored in checkpoints and exported configs."""
        def listed(t):
            return None if t is None else t.tolist()
        return {
            "scheme": self.scheme,
            "num_bits": self.num_bits,
            "values": self.values,
            "scale": float(self.scale),
            "A": listed(self.A),
            "b": listed(self.b),
            "tiling": self.tiling,
            "table": listed(self.table),
            "recode_A": listed(self.recode_A),
            "recode_b": listed(self.recode_b),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "FixedCode":
        """The code of :meth:`to_dict`; a dict written before tilings and tables existed (binary
        or gf2, repeated) lacks their keys and gets the defaults."""
        return cls(scheme=d["scheme"], num_bits=int(d["num_bits"]), values=d["values"],
                   scale=float(d["scale"]), A=d.get("A"), b=d.get("b"),
                   tiling=d.get("tiling", "repeat"), table=d.get("table"),
                   recode_A=d.get("recode_A"), recode_b=d.get("recode_b"))

    def __eq__(self, other) -> bool:
        return isinstance(other, FixedCode) and self.to_dict() == other.to_dict()

    def describe(self) -> str:
        """One line naming the code, e.g. ``random code, 17 bits, recode tiling, pm1 x 0.02``."""
        return (f"{self.scheme} code, {self.num_bits} bits, {self.tiling} tiling, "
                f"{self.values} x {self.scale:g}")


def build_code(model, padded_vocab_size: int) -> Optional[FixedCode]:
    """A new fixed code drawn from the model's flags (``model``: a ``ModelConfig`` or anything
    with its ``input_interface``, ``code_*`` and ``hidden_size``); ``None`` for the table arms.
    A saved model's code is never redrawn: training resumes with the checkpoint's
    (``checkpoint.resume.resolve_checkpoint``) and passes it to the model provider, as the
    exporters do."""
    if model.input_interface not in SCHEMES:
        return None
    return FixedCode.create(model.input_interface, num_bits=model.code_bits,
                            values=model.code_values, scale=model.code_scale,
                            seed=model.code_seed, tiling=model.code_tiling,
                            vocab_size=padded_vocab_size, hidden_size=model.hidden_size)
