"""The code schemes (megatron_ext/codes.py), checked against plain-Python definitions."""

from __future__ import annotations

import pytest
import torch

from megatron_ext.codes import FixedCode, bits_of, draw_gf2_affine, gf2_inverse, gf2_rank

VOCAB = 49152


def py_bits(t: int, n: int) -> list[int]:
    """Bit k of t, least significant first, via Python's binary string."""
    return [int(c) for c in reversed(format(t, f"0{n}b"))]


def py_gf2(t: int, A: list, b: list) -> list[int]:
    x = py_bits(t, len(b))
    return [(sum(A[i][k] * x[k] for k in range(len(b))) + b[i]) % 2 for i in range(len(b))]


def test_binary_bit_order_is_least_significant_first():
    ids = torch.tensor([0, 1, 2, 5, 1 << 15, 49151])
    got = bits_of(ids, 16).tolist()
    assert got == [py_bits(int(t), 16) for t in ids]
    assert got[1][0] == 1 and sum(got[1]) == 1  # id 1 sets bit 0 only


def test_gf2_matches_affine_definition():
    code = FixedCode.create("gf2", seed=7)
    A, b = code.A.tolist(), code.b.tolist()
    ids = torch.randint(0, VOCAB, (300,), generator=torch.Generator().manual_seed(0))
    assert code.code_bits(ids).tolist() == [py_gf2(int(t), A, b) for t in ids]


def test_gf2_matrix_is_invertible_and_deterministic():
    A1, b1 = draw_gf2_affine(16, seed=3)
    A2, b2 = draw_gf2_affine(16, seed=3)
    A3, _ = draw_gf2_affine(16, seed=4)
    assert torch.equal(A1, A2) and torch.equal(b1, b2)
    assert not torch.equal(A1, A3)
    assert gf2_rank(A1) == 16
    product = (A1.long() @ gf2_inverse(A1).long()) % 2
    assert torch.equal(product, torch.eye(16, dtype=torch.long))


def test_gf2_rank_detects_singular_matrix():
    A = torch.eye(4, dtype=torch.uint8)
    A[3] = A[0] ^ A[1]  # row 3 is the sum of rows 0 and 1
    assert gf2_rank(A) == 3
    with pytest.raises(ValueError, match="singular"):
        gf2_inverse(A)
    with pytest.raises(ValueError, match="not invertible"):
        FixedCode(scheme="gf2", num_bits=4, A=A, b=torch.zeros(4, dtype=torch.uint8))


@pytest.mark.parametrize("scheme", ["binary", "gf2"])
@pytest.mark.parametrize("values,scale", [("pm1", 1.0), ("01", 0.5)])
def test_every_id_round_trips_and_codes_are_distinct(scheme, values, scale):
    code = FixedCode.create(scheme, values=values, scale=scale, seed=11)
    ids = torch.arange(VOCAB)
    encoded = code.encode(ids, 64)
    assert torch.equal(code.decode(encoded), ids)
    assert torch.unique(code.code_bits(ids), dim=0).shape[0] == VOCAB


def test_value_mapping_and_scale():
    ids = torch.tensor([5])  # bits 1,0,1,0,...
    pm1 = FixedCode.create("binary", num_bits=4, values="pm1", scale=2.0).encode(ids, 4)
    zero_one = FixedCode.create("binary", num_bits=4, values="01", scale=2.0).encode(ids, 4)
    assert pm1.tolist() == [[2.0, -2.0, 2.0, -2.0]]
    assert zero_one.tolist() == [[2.0, 0.0, 2.0, 0.0]]


def test_tiling_repeats_the_code_to_the_width():
    code = FixedCode.create("gf2", num_bits=16, seed=5)
    ids = torch.tensor([[123, 40000]])
    tiled = code.encode(ids, 2048)
    assert tiled.shape == (1, 2, 2048)
    base = tiled[..., :16]
    for j in range(0, 2048, 16):
        assert torch.equal(tiled[..., j:j + 16], base)


def test_vocab_larger_than_code_is_a_clear_error():
    code = FixedCode.create("binary", num_bits=16)
    code.check_vocab(65536)
    with pytest.raises(ValueError, match=r"70000 tokens does not fit a 16-bit code.*65536"):
        code.check_vocab(70000)


def test_width_not_multiple_of_bits_is_a_clear_error():
    with pytest.raises(ValueError, match=r"--hidden-size 100 is not a multiple of --code-bits 16"):
        FixedCode.create("binary").encode(torch.tensor([1]), 100)


def test_serialisation_keeps_A_and_b():
    code = FixedCode.create("gf2", seed=99)
    again = FixedCode.from_dict(code.to_dict())
    assert again == code
    assert torch.equal(again.A, code.A) and torch.equal(again.b, code.b)
    ids = torch.arange(1000)
    assert torch.equal(again.encode(ids, 32), code.encode(ids, 32))


@pytest.mark.parametrize("kwargs,match", [
    (dict(scheme="hamming"), "unknown code scheme"),
    (dict(scheme="binary", values="tanh"), "unknown code values"),
    (dict(scheme="binary", scale=0.0), "--code-scale must be positive"),
    (dict(scheme="binary", num_bits=0), "--code-bits must be in"),
])
def test_bad_code_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FixedCode(**kwargs)
