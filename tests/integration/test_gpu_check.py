"""bench/gpu_check.sh on CPU: its plan (the order of the steps, the throughput runs' shape,
limits that fit one short slot), its verdicts (exit status and Traceback) and the summary a
killed run keeps; a rehearsal of every step's real command at a tiny shape from a clean copy
of the tree (the install from a wheel built here), with what comes back; and
bench/gpu_check_report.py's figures from metrics files and a profiler trace."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile

import pytest
from packaging.version import Version

from conftest import REPO
from helpers.imports import run_importing
from megatron_ext.runtime.megatron_compat import installed_release

SCRIPT = REPO / "bench" / "gpu_check.sh"
# One short slot: 15 minutes of device time with the machine's start, a rerun included.
SLOT_LIMITS_S = 420


@pytest.fixture(scope="module")
def report():
    """bench/gpu_check_report.py as a module (bench/ is no package)."""
    spec = importlib.util.spec_from_file_location("gpu_check_report",
                                                  REPO / "bench" / "gpu_check_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu_check(tmp_path, python: str = "python", **env) -> tuple[str, str]:
    """(stdout, summary.md) of a run of the script with OUT=tmp_path (its work folder in
    tmp_path/work)."""
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OUT": str(tmp_path), "PYTHON": python,
                              "GPU_CHECK_WORK": str(tmp_path / "work"),
                              "GPU_CHECK_HAVE_TE": "0", **env})
    assert out.returncode == 0, out.stderr
    return out.stdout, (tmp_path / "gpu_check" / "summary.md").read_text()


def planned(stdout: str) -> list[str]:
    return re.findall(r"^== (\S+) \(limit", stdout, flags=re.M)


def test_the_plan_fits_one_slot_most_valuable_first(tmp_path):
    stdout, summary = gpu_check(tmp_path, GPU_CHECK_DRY_RUN="1")
    assert planned(stdout) == ["install_wheels", "imports", "binary_accum8", "learned_accum8",
                               "binary_accum8_compiled", "sdpa_parity", "recipe_flags",
                               "resume"]
    limits = [int(x) for x in re.findall(r"^== \S+ \(limit (\d+)s\)", stdout, flags=re.M)]
    assert f"limits sum: {sum(limits)} s (budget {SLOT_LIMITS_S} s)" in stdout
    assert sum(limits) <= SLOT_LIMITS_S
    assert "pip install --no-index --no-deps" in stdout and "python -c" in stdout
    big = [line for line in stdout.splitlines() if "--preset smollm2-1.7b" in line]
    assert len(big) == 3 and all("--transformer-impl local" in line for line in big)
    accumulation = "--micro-batch-size 4 --transformer-impl local --input-interface {}" \
                   "{} --global-batch-size 32 --train-iters 5"  # 8 micro-batches of 4
    assert accumulation.format("binary", "") in big[0] and "--torch-compile" not in big[0]
    assert accumulation.format("learned", "") in big[1] and "--torch-compile" not in big[1]
    assert accumulation.format("binary", " --torch-compile-layers") in big[2]  # inductor
    assert f"Budget {SLOT_LIMITS_S} s" in summary and summary.index("| install | DRY") \
        < summary.index("| throughput | DRY") < summary.index("| resume | DRY")
    assert "fixed/learned: (dry run)" in summary and "compiled gain: (dry run)" in summary
    assert "| convert |" not in summary

    stdout, summary = gpu_check(tmp_path, GPU_CHECK_DRY_RUN="1", GPU_CHECK_HAVE_TE="1",
                                GPU_CHECK_STEPS="input_layer te_bf16_fp8 no_accum kernel convert")
    assert planned(stdout) == ["recipe_flags", "resume", "convert", "binary_no_accum",
                               "te_binary_bf16", "te_binary_fp8", "build", "parity",
                               "input_layer"]  # the script's order, not the list's
    convert = next(line for line in stdout.splitlines() if line.startswith("== convert"))
    work = tmp_path / "work"
    assert f"tools/convert_to_hf.py --load {work}/checkpoints --output {work}/hf --validate" \
        in convert  # the recipe_flags checkpoint
    no_accum = next(line for line in stdout.splitlines() if line.startswith("== binary_no"))
    assert "--global-batch-size 4 --train-iters 14" in no_accum
    assert "--profile-step-start 12 --profile-step-end 14" in no_accum  # after the counted 5-12
    stdout, summary = gpu_check(tmp_path, GPU_CHECK_DRY_RUN="1", GPU_CHECK_STEPS="te_bf16_fp8")
    assert "| te_bf16_fp8 | SKIP | Transformer Engine not importable" in summary


def test_a_spent_budget_runs_nothing(tmp_path):
    stdout, summary = gpu_check(tmp_path, GPU_CHECK_DRY_RUN="1", GPU_CHECK_BUDGET_S="20",
                                GPU_CHECK_STEPS="throughput fp16")
    assert planned(stdout) == []
    assert "| throughput | FAIL |" in summary and "| fp16 | FAIL |" in summary


def test_a_failed_import_stops_the_check_at_once(tmp_path):
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable,
                              "GPU_CHECK_WORK": str(tmp_path / "work"),
                              "GPU_CHECK_WHEELS": str(tmp_path / "none"),
                              "GPU_CHECK_IMPORTS": "no_such_module_here"})
    assert out.returncode == 1
    assert "[gpu_check] stopped: an import the steps need fails" in out.stdout
    summary = (tmp_path / "gpu_check" / "summary.md").read_text()
    assert "| install | FAIL | ModuleNotFoundError: No module named 'no_such_module_here'" \
        in summary
    assert "| throughput |" not in summary and "== binary_accum8" not in out.stdout


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


def build_wheel(folder, name: str, version: str) -> None:
    """A pure-Python wheel of one module ``name`` (``__version__ = version``), written here
    as pip's format has it (no index, no build backend)."""
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f'__version__ = "{version}"\n',
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test_gpu_check\n"
                              "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = hashlib.sha256(text.encode()).digest()
        record.append(f"{path},sha256={base64.urlsafe_b64encode(digest).rstrip(b'=').decode()},"
                      f"{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    folder.mkdir()
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


def carried_megatron_core() -> str:
    """The megatron-core release bench/gpu_wheels.txt carries to the GPU image."""
    pins = re.findall(r"^megatron-core==(\S+)$", (REPO / "bench" / "gpu_wheels.txt").read_text(),
                      flags=re.M)
    assert len(pins) == 1, "bench/gpu_wheels.txt pins megatron-core once"
    return pins[0]


def series(release: str) -> tuple:
    return Version(release).release[:2]


CARRIED = carried_megatron_core()


# Once per `make test`, on the leg of the megatron-core series the GPU check installs (the
# image has none): the script's steps are the same on both legs, the release under them is not.
@pytest.mark.skipif(series(installed_release()) != series(CARRIED),
                    reason=f"the GPU check runs megatron-core {CARRIED} "
                           f"(bench/gpu_wheels.txt): its rehearsal runs on that series' leg")
def test_the_rehearsal_runs_every_step_from_a_clean_copy(report, tmp_path, capsys):
    """GPU_CHECK_REHEARSAL=1 from a copy of the tracked tree: the carried wheel installed with
    pip --no-index into the scratch target and imported from there, megatron_ext from the
    copy (PYTHONPATH), every command of the default plan run at the tiny shape on CPU and
    passing; the throughput table, the fixed/learned ratio and the compiled row's gain written
    from the metrics files that come back with summary.md and the trimmed logs, while the
    checkpoints stay in the work folder. (``convert``, asked for by name only, is left out:
    eight processes' imports are most of the test's minute; its command is the one
    test_convert_to_hf.py runs in a process of its own.)"""
    tree = tmp_path / "tree"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    for name in listed:
        if (REPO / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, tree / name)
    build_wheel(tmp_path / "wheels", "fixedcode_rehearsal_wheel", "1.0")
    out, work = tmp_path / "out", tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(["bash", str(tree / "bench" / "gpu_check.sh")], capture_output=True,
                         text=True, timeout=300, env={
                             **env, "OUT": str(out), "GPU_CHECK_WORK": str(work),
                             "GPU_CHECK_REHEARSAL": "1", "PYTHON": sys.executable,
                             "GPU_CHECK_WHEELS": str(tmp_path / "wheels"),
                             "GPU_CHECK_IMPORTS": "fixedcode_rehearsal_wheel"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = (out / "gpu_check" / "summary.md").read_text()
    assert "rehearsal on CPU" in summary
    verdicts = dict(re.findall(r"^\| (\w+) \| (PASS|FAIL|SKIP) \|", summary, flags=re.M))
    assert verdicts == dict.fromkeys(["install", "throughput", "sdpa_parity", "recipe_flags",
                                      "resume"], "PASS"), summary
    logs = (out / "gpu_check" / "logs.md").read_text()
    assert f"fixedcode_rehearsal_wheel 1.0 {work}/site/fixedcode_rehearsal_wheel" in logs
    assert f"{tree}/megatron_ext/__init__.py" in logs
    assert "| 8 micro-batches per step" in logs

    back = [p for p in out.rglob("*") if p.is_file()]
    runs = ["binary_accum8", "learned_accum8", "binary_accum8_compiled"]
    assert sorted(p.name for p in back) == sorted([f"{r}.jsonl" for r in runs]
                                                  + ["logs.md", "summary.md"])
    assert len(back) <= 8 and all(p.stat().st_size <= 16 * 2**20 for p in back)
    assert all(len(p.relative_to(out).parts) <= 3 for p in back)  # two folders deep at most
    assert (work / "checkpoints" / "iter_0000006").is_dir()

    # The table and its two lines are what the report computes from the files that came back.
    metrics = {r: str(out / "gpu_check" / f"{r}.jsonl") for r in runs}
    for name, path in metrics.items():
        report.main(["speed", name, path, "--skip", "2", "--until", "5"])
        row = capsys.readouterr().out.strip()
        assert row in summary.splitlines()
        cells = row.split(" | ")
        assert cells[3:5] == ["n/a", "n/a"] and cells[-1] == "3 |"  # MFU: no CPU peak
    for label, base, other in (("fixed/learned", "learned_accum8", "binary_accum8"),
                               ("compiled gain", "binary_accum8", "binary_accum8_compiled")):
        report.main(["ratio", metrics[base], metrics[other], "--label", label, "--skip", "2",
                     "--until", "5"])
        line = capsys.readouterr().out.strip()
        assert line.startswith(f"{label} ({other} / {base}): tokens/s per GPU ")
        assert line in summary.splitlines()
    assert re.search(r"^compile time \(binary_accum8_compiled, .*\): \[fixedcode\] "
                     r"torch.compile: [\d.]+ s of iteration 1 spent compiling", summary, re.M)


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
    main(["ratio", path, fixed, "--label", "fixed/learned", "--skip", "2", "--until", "5"])
    assert capsys.readouterr().out.strip() == "fixed/learned (f / m): tokens/s per GPU 2.667x; " \
        "MFU 10.0% against 7.5%; peak allocated 50.0 against 52.0 GiB"


def test_the_report_reads_a_metrics_file_without_importing_torch(tmp_path):
    """The check calls the report once per row and line (seven times in the default plan): as
    a user runs it, it reads the metrics file and prints the row without importing torch
    (about 1 s of CPU each, when the metrics reader's config imported the codes with torch)."""
    path = records(tmp_path / "m.jsonl", [(i, 8192, 1000, 100, 0.1, 50) for i in range(1, 6)])
    done, imported = run_importing(["bench/gpu_check_report.py", "speed", "run", path,
                                    "--skip", "2", "--until", "5"], REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "| run | 8,192 | 100.0 | 10.0% | n/a | 50.0 | 51.0 | 3 |"
    assert "megatron_ext.metrics.sinks" in imported and "torch" not in imported


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
