"""The figures bench/gpu_check.sh reports, computed from the runs' metrics files and traces.

Each subcommand prints one line (a verdict detail or a table row) and exits 1 when what it
checked failed::

    python bench/gpu_check_report.py final RUN.jsonl         # last iteration and loss
    python bench/gpu_check_report.py fp16 RUN.jsonl          # loss-scaler skips
    python bench/gpu_check_report.py compare BF16.jsonl FP8.jsonl
    python bench/gpu_check_report.py speed NAME RUN.jsonl --skip 4 --until 14
    python bench/gpu_check_report.py ratio BASE.jsonl OTHER.jsonl --label "fixed/learned"
    python bench/gpu_check_report.py profile TRACE_DIR

Throughput (``speed``) is total tokens over total steady time: the iterations after
``--skip`` up to ``--until`` (the profiled ones come after it), each weighted by its time,
per GPU; TFLOP/s and MFU likewise, as the training log computes them (Megatron-LM's FLOP
count, dense bf16 peak). ``ratio`` compares two runs' throughput (OTHER over BASE: the fixed
arm over the learned one, the compiled run over the eager one), MFU and peak memory.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_ext.metrics.sinks import read_metrics  # noqa: E402

# Per-iteration relative loss difference FP8 may show against bf16 (the target).
FP8_LOSS_TOLERANCE = 0.01
# GPU kernel categories of the profile summary, by kernel name (first match wins).
KERNEL_CATEGORIES = (
    ("attention", r"flash|fmha|attn|attention|sdpa|cudnn|softmax"),
    ("communication", r"nccl"),
    ("GEMM", r"gemm|cutlass|xmma|nvjet|matmul|cublas"),
    ("norm", r"norm"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("memory copy/set", r"memcpy|memset|copy"),
    ("elementwise and other", r"."),
)


def train_records(path: str) -> dict[int, dict]:
    return {r["iteration"]: r for r in read_metrics(path) if r["kind"] == "train"}


def steady(path: str, skip: int, until: int) -> list[dict]:
    """The records of iterations ``skip`` < i <= ``until``; an error if fewer than 3."""
    records = [r for i, r in sorted(train_records(path).items()) if skip < i <= until]
    if len(records) < 3:
        raise SystemExit(f"error: {path}: {len(records)} iterations after the first {skip} "
                         f"(up to {until}); at least 3 are needed")
    return records


def throughput(records: list[dict], gpus: int) -> dict:
    """Tokens/s per GPU (total tokens over total time), time-weighted TFLOP/s per GPU and
    MFU, and the peak memory, of these records (one per iteration)."""
    seconds = [r["step-time-ms"] / 1000 for r in records]
    total = sum(seconds)

    def weighted(key):
        if not all(key in r for r in records):
            return None
        return sum(r[key] * s for r, s in zip(records, seconds)) / total

    tokens = sum(r["tokens-per-second"] * s for r, s in zip(records, seconds))
    return {"tokens_per_s_per_gpu": tokens / total / gpus, "tflops": weighted("tflops-per-gpu"),
            "mfu": weighted("mfu"), "mfu_fp8": weighted("mfu-fp8-peak"),
            "allocated": max(r["memory-gib"] for r in records),
            "reserved": max((r.get("memory-reserved-gib") or 0.0) for r in records) or None,
            "iterations": len(records), "seconds": total}


def percent(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def gib(x) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def profile_summary(trace_dir: str) -> list[tuple[str, float]]:
    """``[(category, GPU kernel milliseconds)]`` of the PyTorch profiler traces in
    ``trace_dir``, largest first."""
    traces = glob.glob(os.path.join(trace_dir, "**", "*.pt.trace.json"), recursive=True)
    if not traces:
        raise SystemExit(f"error: no *.pt.trace.json under {trace_dir}")
    totals = defaultdict(float)
    for trace in traces:
        with open(trace) as f:
            events = json.load(f).get("traceEvents", [])
        for event in events:
            if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in event:
                name = event.get("name", "").lower()
                category = next(c for c, pattern in KERNEL_CATEGORIES if re.search(pattern, name))
                totals[category] += event["dur"] / 1000
    return sorted(totals.items(), key=lambda item: -item[1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["final", "fp16", "compare", "speed", "ratio",
                                         "profile"], help="what to report")
    parser.add_argument("paths", nargs="+", help="metrics files (speed: NAME first; "
                                                 "profile: the trace directory)")
    parser.add_argument("--skip", type=int, default=4, help="warm-up iterations dropped")
    parser.add_argument("--until", type=int, default=10**9, help="last iteration counted")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs of the run")
    parser.add_argument("--label", default="ratio", help="ratio: the line's name")
    a = parser.parse_args(argv)
    if a.kind == "profile":
        summary = profile_summary(a.paths[0])
        if not summary:
            print(f"no GPU kernel in the traces of {a.paths[0]} (a CPU run)")
            return 0
        total = sum(ms for _, ms in summary)
        print("| kernel category | ms | share |")
        print("|---|---:|---:|")
        for category, ms in summary:
            print(f"| {category} | {ms:,.1f} | {100 * ms / total:.1f}% |")
        return 0
    if a.kind == "speed":
        name, path = a.paths
        t = throughput(steady(path, a.skip, a.until), a.gpus)
        print(f"| {name} | {t['tokens_per_s_per_gpu']:,.0f} | "
              f"{'n/a' if t['tflops'] is None else format(t['tflops'], '.1f')} | "
              f"{percent(t['mfu'])} | {percent(t['mfu_fp8'])} | {gib(t['allocated'])} | "
              f"{gib(t['reserved'])} | {t['iterations']} |")
        return 0
    if a.kind == "ratio":
        base, other = (throughput(steady(p, a.skip, a.until), a.gpus) for p in a.paths)
        names = [os.path.splitext(os.path.basename(p))[0] for p in a.paths]
        ratio = other["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"]
        print(f"{a.label} ({names[1]} / {names[0]}): tokens/s per GPU {ratio:.3f}x; MFU "
              f"{percent(other['mfu'])} against {percent(base['mfu'])}; peak allocated "
              f"{gib(other['allocated'])} against {gib(base['allocated'])} GiB")
        return 0
    runs = [train_records(p) for p in a.paths]
    last = runs[0][max(runs[0])]
    loss = last.get("lm loss", math.nan)
    if a.kind == "final":
        print(f"iteration {last['iteration']}, loss {loss:.4f}")
        return int(not math.isfinite(loss))
    if a.kind == "fp16":
        print(f"iteration {last['iteration']}, {last['overflow-skipped-iterations']} overflow "
              f"skips, loss scale {last['loss-scale']:g}, {last['skipped-iterations']} "
              f"non-finite, loss {loss:.4f}")
        return int(not math.isfinite(loss) or last["skipped-iterations"] > 0)
    bf16, fp8 = runs  # compare
    common = sorted(set(bf16) & set(fp8))
    diffs = [abs(fp8[i]["lm loss"] - bf16[i]["lm loss"]) / bf16[i]["lm loss"] for i in common]
    worst = max(diffs) if diffs else math.inf
    print(f"{len(common)} iterations: FP8 loss within {100 * worst:.2f}% of bf16 at every one "
          f"(mean {100 * statistics.mean(diffs) if diffs else math.nan:.2f}%; target "
          f"{100 * FP8_LOSS_TOLERANCE:.0f}%)")
    return int(not worst <= FP8_LOSS_TOLERANCE)


if __name__ == "__main__":
    sys.exit(main())
