"""bench/gpu_check.sh's logic on CPU: its plan (the order of the steps, the throughput runs'
shape, the budget), its verdicts (exit status and Traceback) and the summary a killed run
keeps; and bench/gpu_check_report.py's figures from metrics files and a profiler trace."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import stat
import subprocess

import pytest

from conftest import REPO

SCRIPT = REPO / "bench" / "gpu_check.sh"


@pytest.fixture(scope="module")
def report():
    """bench/gpu_check_report.py as a module (bench/ is no package)."""
    spec = importlib.util.spec_from_file_location("gpu_check_report",
                                                  REPO / "bench" / "gpu_check_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu_check(tmp_path, python: str = "python", **env) -> tuple[str, str]:
    """(stdout, summary.md) of a run of the script with OUT=tmp_path."""
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OUT": str(tmp_path), "PYTHON": python,
                              "GPU_CHECK_HAVE_TE": "0", **env})
    assert out.returncode == 0, out.stderr
    return out.stdout, (tmp_path / "gpu_check" / "summary.md").read_text()


def planned(stdout: str) -> list[str]:
    return re.findall(r"^== (\S+) \(limit", stdout, flags=re.M)


def test_the_plan_puts_never_run_steps_first_and_measures_steady_state(tmp_path):
    stdout, summary = gpu_check(tmp_path, GPU_CHECK_DRY_RUN="1", GPU_CHECK_HAVE_TE="1")
    assert planned(stdout) == [
        "te_binary_bf16", "te_binary_fp8", "sdpa_parity", "local_sdpa_binary", "local_sdpa_learned",
        "local_unfused_binary", "recipe_flags", "resume", "convert", "build", "parity",
        "kernel_in_training", "fp16", "input_layer"]
    big = [line for line in stdout.splitlines() if "--preset smollm2-1.7b" in line]
    assert len(big) == 5
    for line in big:
        assert "--micro-batch-size 4 --global-batch-size 4 --train-iters 14" in line
    assert "--fp8-format hybrid" in big[1] and "--attention-backend unfused" in big[4]
    assert "--profile-step-start 12 --profile-step-end 14" in big[2]  # after the counted 5-12
    assert "Budget 540 s" in summary and summary.index("| te_bf16_fp8 | DRY") \
        < summary.index("| input_layer | DRY")

    stdout, summary = gpu_check(tmp_path, GPU_CHECK_DRY_RUN="1", GPU_CHECK_SKIP_PASSED="1")
    assert planned(stdout) == ["sdpa_parity", "local_sdpa_binary", "local_sdpa_learned",
                               "local_unfused_binary", "recipe_flags", "resume", "convert"]
    assert "| te_bf16_fp8 | SKIP | Transformer Engine not importable" in summary


def test_a_spent_budget_runs_nothing(tmp_path):
    stdout, summary = gpu_check(tmp_path, GPU_CHECK_DRY_RUN="1", GPU_CHECK_BUDGET_S="20",
                                GPU_CHECK_STEPS="local_attention fp16")
    assert planned(stdout) == []
    assert "| local_attention | FAIL |" in summary and "| fp16 | FAIL |" in summary


@pytest.mark.parametrize("output,status,verdict,detail", [
    ("iteration 1\nTraceback (most recent call last):\nRuntimeError: CUDA error: boom", 0,
     "FAIL", "RuntimeError: CUDA error: boom"),
    ("error: --fp8-recipe mxfp8 needs a GPU of sm 10.0\nNCCL warning at exit", 1, "FAIL",
     "error: --fp8-recipe mxfp8 needs a GPU of sm 10.0"),
    ("iteration 10, loss 6.9", 0, "PASS", "iteration 10, loss 6.9"),
])
def test_exit_status_and_tracebacks_decide_a_verdict(tmp_path, output, status, verdict, detail):
    """A stand-in interpreter prints ``output`` and exits ``status``: a Traceback fails a
    step that exited 0, the detail is the error line rather than the last line, and the
    summary holds the row once the step is over."""
    fake = tmp_path / "python"
    lines = output.replace("\n", "' '")  # one printf argument per line
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' '{lines}'"
                    f"\nexit {status}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out"
    stdout, summary = gpu_check(out, str(fake), GPU_CHECK_STEPS="kernel_in_training")
    row = next(line for line in summary.splitlines() if line.startswith("| kernel_in_training"))
    assert row.split(" | ")[1] == verdict
    assert detail in row


def records(path, steps):
    """A metrics file of ``steps``: (iteration, tokens/s, step ms, TFLOP/s, MFU, GiB)."""
    with open(path, "w") as f:
        for it, tps, ms, tflops, mfu, gib in steps:
            f.write(json.dumps({"kind": "train", "iteration": it, "lm loss": 10 - it / 10,
                                "tokens-per-second": tps, "step-time-ms": ms,
                                "tflops-per-gpu": tflops, "mfu": mfu, "memory-gib": gib,
                                "memory-reserved-gib": gib + 1}) + "\n")
    return str(path)


def test_throughput_is_total_tokens_over_total_steady_time(report, tmp_path, capsys):
    main, steady, throughput = report.main, report.steady, report.throughput
    # 2 warm-up steps (slow), 3 steady: 8192 tokens each in 1 s, 1 s and 2 s; a profiled one.
    path = records(tmp_path / "m.jsonl", [
        (1, 100, 81920, 0.1, 0.0001, 5), (2, 1000, 8192, 1, 0.001, 5),
        (3, 8192, 1000, 100, 0.10, 50), (4, 8192, 1000, 100, 0.10, 51),
        (5, 4096, 2000, 50, 0.05, 52), (6, 10, 819200, 1, 0.001, 99)])
    t = throughput(steady(path, skip=2, until=5), gpus=1)
    assert t["tokens_per_s_per_gpu"] == pytest.approx(3 * 8192 / 4)  # not the mean 6827
    assert t["tflops"] == pytest.approx((100 + 100 + 100) / 4)
    assert t["mfu"] == pytest.approx(0.3 / 4) and t["iterations"] == 3
    assert (t["allocated"], t["reserved"]) == (52, 53)
    assert throughput(steady(path, 2, 5), gpus=2)["tokens_per_s_per_gpu"] \
        == pytest.approx(3 * 8192 / 8)
    with pytest.raises(SystemExit, match="2 iterations after the first 3"):
        steady(path, skip=3, until=5)
    main(["speed", "run", path, "--skip", "2", "--until", "5"])
    assert capsys.readouterr().out.strip() \
        == "| run | 6,144 | 75.0 | 7.5% | n/a | 52.0 | 53.0 | 3 |"
    fixed = records(tmp_path / "f.jsonl", [(i, 2 * 8192, 500, 1, 0.1, 50) for i in range(1, 6)])
    main(["ratio", path, fixed, "--skip", "2", "--until", "5"])
    assert capsys.readouterr().out.startswith("fixed/learned tokens/s 2.667;")


def test_fp8_must_stay_within_one_percent_of_bf16_at_every_iteration(report, tmp_path):
    main = report.main
    bf16 = tmp_path / "bf16.jsonl"
    bf16.write_text("".join(json.dumps({"kind": "train", "iteration": i, "lm loss": 10.0}) + "\n"
                            for i in range(1, 13)))
    for worst, status in ((0.009, 0), (0.011, 1)):
        fp8 = tmp_path / "fp8.jsonl"
        fp8.write_text("".join(json.dumps({"kind": "train", "iteration": i, "lm loss": 10.0 * (
            1 + (worst if i == 7 else 0.001))}) + "\n" for i in range(1, 13)))
        assert main(["compare", str(bf16), str(fp8)]) == status


def test_the_profile_is_summed_by_kernel_category(report, tmp_path, capsys):
    main = report.main
    trace = tmp_path / "prof" / "rank0.1.pt.trace.json"
    trace.parent.mkdir()
    trace.write_text(json.dumps({"traceEvents": [
        {"cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16", "dur": 6000},
        {"cat": "kernel", "name": "pytorch_flash::flash_fwd_kernel", "dur": 3000},
        {"cat": "kernel", "name": "vectorized_elementwise_kernel", "dur": 1000},
        {"cat": "cpu_op", "name": "aten::mm", "dur": 99999}]}))
    assert main(["profile", str(tmp_path / "prof")]) == 0
    assert capsys.readouterr().out.splitlines()[2:] == [
        "| GEMM | 6.0 | 60.0% |", "| attention | 3.0 | 30.0% |",
        "| elementwise and other | 1.0 | 10.0% |"]
