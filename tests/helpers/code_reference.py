"""The fixed codes in plain Python, from a code's stored dict (FixedCode.to_dict): the
independent computation the tests hold megatron_ext.codes.schemes, its kernels and its exports
to."""

from __future__ import annotations


def py_bits(x: int, n: int) -> list[int]:
    """Bit k of x, least significant first, via Python's binary string."""
    return [int(ch) for ch in reversed(format(x, f"0{n}b"))]


def py_affine(A: list, b: list, bits: list[int]) -> list[int]:
    return [(sum(a * x for a, x in zip(row, bits)) + bi) % 2 for row, bi in zip(A, b)]


def py_row(code: dict, t: int, hidden: int) -> list[int]:
    """The tiled bits of id t: blocks of n, position j = bit j mod n of block j div n."""
    n = code["num_bits"]
    x = t if code.get("table") is None else code["table"][t]
    c = py_bits(x, n)
    if code["A"] is not None:
        c = py_affine(code["A"], code["b"], c)
    row = []
    for r in range((hidden + n - 1) // n):
        block = c if code.get("tiling", "repeat") == "repeat" else \
            py_affine(code["recode_A"][r], code["recode_b"][r], c)
        row += block
    return row[:hidden]


def py_values(code: dict, t: int, hidden: int) -> list[float]:
    s = code["scale"]
    low = -s if code["values"] == "pm1" else 0.0
    return [s if bit else low for bit in py_row(code, t, hidden)]
