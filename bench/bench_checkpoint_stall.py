"""The training stall of one save, synchronous vs ``--async-save``, in one run of this script.

Trains the same model twice with pretrain_fixedcode.py (one process each, taking turns, the
sync run first), saving at ``--save-interval`` and at the end, and reads what the training
loop logs (megatron_ext/checkpoint/saving.py): how long the save at the interval held the loop
("training stalled"); under ``--async-save`` that is the stall when the save starts plus the
stall when it completes (an iteration later or more). Also shown: the size of the save (its
manifest), the background write time, and the step time of the iteration after the save in
both runs (under ``--async-save`` the writer shares the CPU with that step). The default
model holds > 1 GB of saved state (fp32 weights + Adam's two moments, 12 bytes a
parameter)::

    python bench/bench_checkpoint_stall.py            # prints one Markdown table
    python bench/bench_checkpoint_stall.py --num-layers 4 --hidden-size 512   # smaller
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import measure

REPO = Path(__file__).resolve().parent.parent
DEFAULTS = ["--input-interface", "binary", "--num-layers", "8", "--hidden-size", "1024",
            "--ffn-hidden-size", "4096", "--num-attention-heads", "16", "--seq-length", "64",
            "--micro-batch-size", "1", "--global-batch-size", "1", "--vocab-size", "32767",
            "--tokenizer-type", "NullTokenizer", "--mock-data", "--eval-iters", "0",
            "--log-interval", "1", "--num-workers", "0", "--lr", "1e-4"]
SAVE_AT, TRAIN_ITERS = 2, 4
STALL = re.compile(r"stalled(?: training)? ([\d.]+) s")


def run(model_argv: list, save_dir: str, async_save: bool) -> dict:
    """One training run; its save's stall, background write time and step times."""
    argv = DEFAULTS + model_argv + ["--train-iters", str(TRAIN_ITERS), "--save", save_dir,
                                    "--save-interval", str(SAVE_AT)]
    argv += ["--async-save"] if async_save else []
    out = subprocess.run([sys.executable, str(REPO / "pretrain_fixedcode.py"), *argv],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}).stdout
    path = f"{save_dir}/iter_{SAVE_AT:07d}"
    lines = [line for line in out.splitlines() if f"checkpoint {path} " in line]
    stall = sum(float(m.group(1)) for line in lines for m in STALL.finditer(line))
    written = re.search(r"written in the background in ([\d.]+) s", "\n".join(lines))
    files = json.load(open(f"{path}/manifest.json"))["files"]
    steps = {r["iteration"]: r["step-time-ms"] for r in map(json.loads, open(
        f"{save_dir}/metrics.jsonl")) if r["kind"] == "train"}
    return {"stall": stall, "written": float(written.group(1)) if written else None,
            "bytes": sum(f["size"] for f in files.values()), "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tmp", default=None, help="where the saves go (default: a temporary "
                        "directory); the disk's speed is part of the measurement")
    args, model_argv = parser.parse_known_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    machine = measure.machine()
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        sync = run(model_argv, f"{tmp}/sync", async_save=False)
        background = run(model_argv, f"{tmp}/async", async_save=True)
    print(f"# bench_checkpoint_stall, {started}, {machine}")
    print(f"# model: {' '.join(DEFAULTS + model_argv)}; save at iteration {SAVE_AT} of "
          f"{TRAIN_ITERS}")
    print("| mode | saved GiB | training stall s | background write s | "
          f"step {SAVE_AT + 1} ms (after the save) | step {SAVE_AT} ms (before) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in (("synchronous", sync), ("--async-save", background)):
        written = "—" if r["written"] is None else f"{r['written']:.2f}"
        print(f"| {name} | {r['bytes'] / 2**30:.2f} | {r['stall']:.2f} | {written} | "
              f"{r['steps'][SAVE_AT + 1]:.0f} | {r['steps'][SAVE_AT]:.0f} |")
    print(f"\nasync / sync training stall: **{background['stall'] / sync['stall']:.3f}×** "
          f"(goal ≤ 0.2×)")


if __name__ == "__main__":
    from megatron_ext.runtime.errors import exits_on_error
    with exits_on_error():
        main()
