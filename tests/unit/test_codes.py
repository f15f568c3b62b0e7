"""The code schemes and tilings (megatron_ext/codes/schemes.py), checked against plain-Python
definitions (tests/code_reference.py)."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.code_reference import py_bits, py_values
from helpers.codes import new_code
from megatron_ext.codes.schemes import (SCHEMES, TILINGS, FixedCode, bits_of, draw_gf2_affine,
                                        gf2_inverse, gf2_rank, ids_of)

VOCAB = 49152
CASES = [(s, t) for s in SCHEMES for t in TILINGS]


def make(scheme, tiling, seed=11, num_bits=16, hidden=40, vocab=VOCAB, **kw) -> FixedCode:
    return new_code(scheme, num_bits=num_bits, seed=seed, tiling=tiling,
                            vocab_size=vocab, hidden_size=hidden, **kw)


def test_binary_bit_order_is_least_significant_first():
    ids = torch.tensor([0, 1, 2, 5, 1 << 15, 49151])
    got = bits_of(ids, 16).tolist()
    assert got == [py_bits(int(t), 16) for t in ids]
    assert got[1][0] == 1 and sum(got[1]) == 1  # id 1 sets bit 0 only


@pytest.mark.parametrize("scheme,tiling", CASES)
@pytest.mark.parametrize("values,scale", [("pm1", 1.0), ("01", 0.37)])
def test_definition_matches_plain_python(scheme, tiling, values, scale):
    """12 bits at width 40: blocks of 12, 12, 12 and a last one truncated to 4 positions."""
    code = make(scheme, tiling, num_bits=12, vocab=3000, values=values, scale=scale)
    ids = torch.randint(0, 3000, (2, 50), generator=torch.Generator().manual_seed(0))
    expected = [[py_values(code.to_dict(), int(t), 40) for t in row] for row in ids]
    assert torch.equal(code.encode(ids, 40), torch.tensor(expected))


@pytest.mark.parametrize("scheme,tiling", CASES)
def test_every_id_round_trips_and_codes_are_distinct(scheme, tiling):
    code = make(scheme, tiling)
    ids = torch.arange(VOCAB)
    assert len(torch.unique(ids_of(code.code_bits(ids)))) == VOCAB
    assert torch.equal(code.decode(code.encode(ids, 40)), ids)


@pytest.mark.parametrize("scheme,tiling", [c for c in CASES if c != ("binary", "repeat")])
def test_drawn_parts_are_deterministic_in_the_seed_and_differ_across_seeds(scheme, tiling):
    a, b, other = (make(scheme, tiling, seed=seed, num_bits=12, vocab=3000)
                   for seed in (3, 3, 4))
    assert a == b
    assert a != other
    ids = torch.arange(3000)
    assert not torch.equal(a.encode(ids, 40), other.encode(ids, 40))


def test_permuted_uses_the_binary_codes_in_another_order():
    binary, permuted = make("binary", "repeat"), make("permuted", "repeat")
    ids = torch.arange(VOCAB)
    assert torch.equal(permuted.code_bits(ids), binary.code_bits(permuted.table))
    assert (permuted.table != ids).float().mean() > 0.99


@pytest.mark.parametrize("scheme,tiling", CASES)
def test_storage_round_trip_keeps_every_drawn_part(scheme, tiling):
    code = make(scheme, tiling, num_bits=17, values="01", scale=0.5)
    again = FixedCode.from_dict(json.loads(json.dumps(code.to_dict())))
    assert again == code
    ids = torch.randint(0, VOCAB, (500,), generator=torch.Generator().manual_seed(1))
    assert torch.equal(again.encode(ids, 40), code.encode(ids, 40))


@pytest.mark.parametrize("scheme", ["binary", "gf2"])
def test_a_code_stored_before_tilings_and_tables_loads_as_repeat(scheme):
    old = {k: v for k, v in make(scheme, "repeat").to_dict().items()
           if k in ("scheme", "num_bits", "values", "scale", "A", "b")}
    code = FixedCode.from_dict(old)
    assert code.tiling == "repeat" and code.table is None and code.recode_A is None
    assert code == make(scheme, "repeat")


def test_recode_spans_more_dimensions_than_repeat():
    """Over a vocabulary sample the repeated ±1 code spans n+1 dimensions at most (n bits and
    the constant); one recoding per block spans the width."""
    ids = torch.randint(0, VOCAB, (1024,), generator=torch.Generator().manual_seed(2))
    rank = {t: int(torch.linalg.matrix_rank(make("random", t, hidden=128).encode(ids, 128)
                                            .double())) for t in TILINGS}
    assert rank["repeat"] <= 17
    assert rank["recode"] == 128


@pytest.mark.parametrize("tiling", TILINGS)
def test_last_block_is_truncated(tiling):
    """n = 12 at h = 40: positions 36..39 hold bits 0..3 of the fourth block."""
    code = make("gf2", tiling, num_bits=12, vocab=4096)
    ids = torch.arange(4096)
    row = code.row_bits(ids, 40)
    full = code.row_bits(ids, 48) if tiling == "repeat" else None
    assert row.shape == (4096, 40)
    if tiling == "repeat":
        assert torch.equal(row[:, 36:], row[:, :4]) and torch.equal(row, full[:, :40])
    else:
        block = (code.code_bits(ids).float() @ code.recode_A[3].T.float()).long()
        assert torch.equal(row[:, 36:], ((block + code.recode_b[3]) & 1)[:, :4])


def test_gf2_matrix_is_invertible_and_deterministic():
    def draw(seed):
        return draw_gf2_affine(16, torch.Generator().manual_seed(seed))
    (A1, b1), (A2, b2), (A3, _) = draw(3), draw(3), draw(4)
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
        FixedCode(scheme="gf2", num_bits=4, values="pm1", scale=1.0, tiling="repeat", A=A,
                  b=torch.zeros(4, dtype=torch.uint8))


def test_value_mapping_and_scale():
    ids = torch.tensor([5])  # bits 1,0,1,0,...
    pm1 = new_code("binary", num_bits=4, values="pm1", scale=2.0).encode(ids, 4)
    zero_one = new_code("binary", num_bits=4, values="01", scale=2.0).encode(ids, 4)
    assert pm1.tolist() == [[2.0, -2.0, 2.0, -2.0]]
    assert zero_one.tolist() == [[2.0, 0.0, 2.0, 0.0]]


def test_vocab_larger_than_code_is_a_clear_error():
    code = new_code("binary", num_bits=16)
    code.check_vocab(65536)
    with pytest.raises(ValueError, match=r"70000 tokens does not fit a 16-bit code.*65536"):
        code.check_vocab(70000)
    with pytest.raises(ValueError, match=r"70000 tokens does not fit a 16-bit code"):
        new_code("random", num_bits=16, vocab_size=70000)


def test_width_rules_name_the_flags():
    with pytest.raises(ValueError, match=r"--hidden-size 8 is smaller than --code-bits 16"):
        new_code("binary").encode(torch.tensor([1]), 8)
    code = make("binary", "recode", hidden=64)
    code.check_width(49)  # 4 blocks of 16, the last truncated to 1 position
    with pytest.raises(ValueError, match=r"drawn for 4 blocks of 16 bits, but --hidden-size 80 "
                                         r"needs 5"):
        code.check_width(80)
    with pytest.raises(ValueError, match=r"drawn for a vocabulary of 49152 ids, not 50000"):
        make("permuted", "repeat").check_vocab(50000)


TABLE = torch.tensor([2, 0, 1, 3])


@pytest.mark.parametrize("kwargs,match", [
    (dict(scheme="hamming"), "unknown code scheme"),
    (dict(scheme="binary", values="tanh"), "unknown code values"),
    (dict(scheme="binary", tiling="shuffle"), "unknown code tiling"),
    (dict(scheme="binary", scale=0.0), "--code-scale must be positive"),
    (dict(scheme="binary", num_bits=0), "--code-bits must be in"),
    (dict(scheme="binary", num_bits=63), r"--code-bits must be in \[1, 62\]"),
    (dict(scheme="binary", table=TABLE), "a binary code has no per-id table"),
    (dict(scheme="permuted", num_bits=2), "a permuted code needs per-id table"),
    (dict(scheme="permuted", num_bits=2, table=torch.tensor([0, 1, 1, 3])),
     "not a permutation"),
    (dict(scheme="random", num_bits=2, table=torch.tensor([0, 1, 1])), "distinct integers"),
    (dict(scheme="random", num_bits=2, table=torch.tensor([0, 4])), r"in \[0, 2\^2\)"),
    (dict(scheme="binary", num_bits=2, tiling="recode"), "recode tiling code needs its matrix"),
    (dict(scheme="binary", num_bits=2, tiling="recode", recode_A=torch.zeros(1, 2, 2),
          recode_b=torch.zeros(1, 2)), "recode tiling code: A is not invertible"),
    (dict(scheme="binary", num_bits=2, recode_A=torch.eye(2)[None], recode_b=torch.zeros(1, 2)),
     "only a recode tiling code has"),
])
def test_bad_code_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FixedCode(**{"num_bits": 16, "values": "pm1", "scale": 1.0, "tiling": "repeat",
                     **kwargs})


def test_the_code_options_take_their_defaults_from_the_flags_alone():
    """Issue 58: --code-seed defaulted to 1234 at its flag and to 0 in ``FixedCode.create``,
    so a code drawn without the flags differed from a run's. The options have no default in
    the codes; the ``--code-*`` flags' declarations are the only ones."""
    import inspect
    from megatron_ext.codes.schemes import build_code
    from megatron_ext.config.model_config import ModelConfig
    for function, names in ((FixedCode.create, ("num_bits", "values", "scale", "seed", "tiling")),
                            (FixedCode, ("num_bits", "values", "scale", "tiling"))):
        parameters = inspect.signature(function).parameters
        assert [n for n in names if parameters[n].default is not inspect.Parameter.empty] == []
    flags = ModelConfig().replace(input_interface="gf2", hidden_size=40)
    drawn = build_code(flags, VOCAB)
    assert drawn == make("gf2", "repeat", seed=flags.code_seed, num_bits=flags.code_bits)
    assert drawn != make("gf2", "repeat", seed=0, num_bits=flags.code_bits)
