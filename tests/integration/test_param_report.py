"""tools/param_report.py counts trainable parameters from instantiated modules."""

from __future__ import annotations

import contextlib
import io
import re

import pytest


def run_report(*flags: str) -> str:
    """What ``tools/param_report.py FLAGS`` prints, run in this process."""
    from tools import param_report
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        param_report.main(list(flags))
    return out.getvalue()


def test_reference_shape_counts():
    out = run_report("--preset", "smollm2-1.7b", "--json")
    import json
    counts = json.loads(out)
    assert counts["binary"]["total"] == 1_711_376_384
    assert counts["gf2"]["total"] == 1_711_376_384
    assert counts["learned"]["total"] == 1_812_039_680
    assert counts["learned"]["total"] - counts["binary"]["total"] == 100_663_296
    assert counts["binary"]["input"] == 0
    assert counts["learned"]["input"] == 100_663_296
    assert counts["binary"]["head"] == 100_663_296


def test_small_shape_matches_independent_formula():
    L, d, ffn, V = 3, 64, 160, 1000
    out = run_report("--num-layers", str(L), "--hidden-size", str(d), "--num-attention-heads",
                     "4", "--ffn-hidden-size", str(ffn), "--seq-length", "32",
                     "--vocab-size", str(V), "--json")
    import json
    counts = json.loads(out)
    padded = 1024  # 1000 rounded up to a multiple of 128
    # Per layer: QKV + output projection, SwiGLU (two up + one down), two RMSNorm weights.
    backbone = L * (4 * d * d + 3 * d * ffn + 2 * d) + d
    assert counts["binary"] == {"input": 0, "backbone": backbone, "head": padded * d,
                                "total": backbone + padded * d}
    assert counts["learned"]["total"] == backbone + 2 * padded * d


def test_table_output_shows_the_difference():
    out = run_report("--preset", "smollm2-1.7b", "--arms", "learned", "binary")
    assert "1,711,376,384" in out and "1,812,039,680" in out
    assert "learned - binary: 100,663,296 parameters" in out
    assert "input RMS" in out and "matching --code-scale" in out
    binary = next(line for line in out.splitlines() if line.startswith("binary "))
    assert binary.split()[-2:] == ["1", "0.02"]  # a pm1 code's RMS is its scale


SMALL = ["--num-layers", "2", "--hidden-size", "40", "--num-attention-heads", "4",
         "--seq-length", "32", "--vocab-size", "500"]


def test_input_rms_and_the_matching_code_scale():
    """Learned: N(0, std). Binary 01 over ids 0..511 (the padded vocabulary) at width 40
    (blocks of bits 0-15, 0-15, 0-7): bits 0-8 are one half the time, bits 9-15 never, so
    13 of 40 positions on average: RMS sqrt(13/40) at --code-scale 1."""
    from megatron_ext.config.arguments import parse_model_config
    from megatron_ext.model.param_count import input_rms
    args = parse_model_config(SMALL + ["--code-values", "01", "--init-method-std", "0.01"],
                              "t")[0]
    rms = input_rms(args, ["learned", "binary", "permuted"])
    assert rms["learned"] == (0.01, None)
    for arm in ("binary", "permuted"):  # the same set of codes
        assert abs(rms[arm][0] - (13 / 40) ** 0.5) < 1e-9
        assert abs(rms[arm][1] - 0.01 / (13 / 40) ** 0.5) < 1e-9
    pm1 = parse_model_config(SMALL + ["--code-scale", "0.5"], "t")[0]
    assert input_rms(pm1, ["random"])["random"] == (0.5, 0.02)


def test_show_code_prints_the_rows_of_the_configured_code(capsys):
    from helpers.code_reference import py_row
    from helpers.codes import new_code
    from tools.param_report import main
    flags = ["--input-interface", "random", "--code-tiling", "recode", "--code-bits", "12",
             "--code-seed", "7"]
    main(SMALL + flags + ["--show-code", "3"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# random code, 12 bits, recode tiling, pm1 x 1; vocabulary 512")
    code = new_code("random", num_bits=12, tiling="recode", seed=7, vocab_size=512,
                            hidden_size=40)
    assert len(lines) == 5
    for t, line in enumerate(lines[2:]):
        ident, x, bar, *blocks = line.split()
        assert (int(ident), int(x), bar) == (t, int(code.table[t]), "|")
        assert [len(b) for b in blocks] == [12, 12, 12, 4]  # the last block truncated
        assert "".join(blocks) == "".join(map(str, py_row(code.to_dict(), t, 40)))


@pytest.mark.parametrize("extra", [[], ["--show-code", "2"]])
def test_a_padded_vocabulary_too_large_for_the_code_is_an_error_line(extra):
    """The issue's case: 1,000 tokens fit --code-bits 10, but padded to a multiple of 300
    they are 1,200 ids: refused with the training's error, not a ValueError traceback."""
    from tools.param_report import main
    flags = ["--num-layers", "2", "--hidden-size", "40", "--num-attention-heads", "4",
             "--seq-length", "32", "--vocab-size", "1000", "--code-bits", "10",
             "--make-vocab-size-divisible-by", "300", "--arms", "learned", "binary"]
    with pytest.raises(SystemExit, match=re.escape(
            "error: vocabulary of 1200 tokens (the tokenizer's 1000, padded by "
            "--make-vocab-size-divisible-by) does not fit a 10-bit code")):
        main(flags + extra)


def test_reference_shape_counts_of_the_trainable_input_arms():
    """The issue's figures at the paper's shape: the map 16 x 2048, rank r V x r + r x h."""
    import json
    counts = json.loads(run_report(
        "--preset", "smollm2-1.7b", "--json", "--arms", "binary", "frozen",
        "map:binary@--code-projection", "r16:factorized@--input-table-rank=16",
        "r512:factorized@--input-table-rank=512"))
    assert counts["frozen"]["input"] == 0 and counts["map"]["input"] == 32_768
    assert counts["r16"]["input"] == 49152 * 16 + 16 * 2048
    assert counts["r512"]["input"] == 49152 * 512 + 512 * 2048
    for arm in counts:
        assert counts[arm]["total"] - counts[arm]["input"] == counts["binary"]["total"], arm


def test_the_state_bytes_bench_prints_every_arm_at_the_reference_shape(monkeypatch):
    """bench/bench_state_bytes.py (the training-state table of bench/RESULTS.md), run in this
    process: a row per arm with its trainable parameters and 18 bytes each (it once failed
    on a name that an arm's merge had removed, and no test ran it)."""
    import importlib.util
    import sys
    from conftest import REPO
    spec = importlib.util.spec_from_file_location("bench_state_bytes",
                                                  REPO / "bench" / "bench_state_bytes.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(sys, "argv", ["bench_state_bytes.py"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench.main()
    rows = dict(re.findall(r"^\| (\w+) \| ([\d,]+) \|", out.getvalue(), flags=re.M))
    assert rows == {"learned": "1,812,039,680", **dict.fromkeys(
        ["frozen", "binary", "gf2", "permuted", "random"], "1,711,376,384")}
    assert "| binary | 1,711,376,384 | 3.19 | 6.38 | 19.13 | 28.69 | 1.69 | 5.6 |" \
        in out.getvalue()


@pytest.mark.parametrize("mlp, ffn", [("--no-swiglu", 4 * 128), ("--swiglu", 320)])
def test_an_arm_that_widens_the_model_gets_the_ffn_size_of_its_width(mlp, ffn):
    """Issue 58: ``w:learned@--hidden-size=128`` over a width-40 shape is counted as the run
    with --hidden-size 128 starts, --ffn-hidden-size 4 x 128 (with --swiglu 2/3 of that, to
    a multiple of 64), not the shape's 4 x 40 carried over."""
    import json
    counts = json.loads(run_report(*SMALL, mlp, "--json", "--arms",
                                   "w:learned@--hidden-size=128"))
    wide = json.loads(run_report(*SMALL, mlp, "--hidden-size", "128", "--json",
                                 "--arms", "learned"))
    assert counts["w"] == wide["learned"]
    L, d, V = 2, 128, 512
    up = 2 if mlp == "--swiglu" else 1
    assert counts["w"]["backbone"] == L * (4 * d * d + (up + 1) * d * ffn + 2 * d) + d
