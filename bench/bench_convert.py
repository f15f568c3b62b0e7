"""The Hugging Face converter at a given shape on this machine: a checkpoint made here (the
model initialised as training starts it and saved alone, no step, no optimizer state:
megatron_ext/train/setup.py:save_initialised_model), then the whole command a user
runs, ``tools/convert_to_hf.py --load CKPT --output HF --validate``, in its own process:
its wall time and peak resident set (the kernel's ru_maxrss of that process), against W,
the bytes of one fp32 copy of the model's weights (megatron_ext/model/memory.py)::

    python bench/bench_convert.py --workdir /tmp/convert               # 1.7B, learned + binary
    python bench/bench_convert.py --workdir /tmp/c --arms binary -- --num-layers 4 \\
        --hidden-size 512 --num-attention-heads 8 --seq-length 512     # another shape

Model flags after ``--`` replace ``--preset smollm2-1.7b``. Each arm's checkpoint is made
in a process of its own (``init``) and removed after its conversion with the export.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GIB = 2 ** 30
# The reference shape, bf16 weights as the recipe trains them, a vocabulary of 49,152 ids.
BASE = ["--vocab-size", "49151", "--tokenizer-type", "NullTokenizer", "--mock-data", "--bf16",
        "--train-iters", "1", "--device", "cpu", "--transformer-impl", "local"]


def parse_args(flags: list):
    from megatron_ext.config.arguments import add_training_args, parse_model_config
    return parse_model_config(flags, "bench_convert", add_training_args)[0]


def init(save: str, flags: list) -> None:
    """Save the initialised model of ``flags`` to ``save`` (run in a process of its own)."""
    from megatron_ext.train.setup import save_initialised_model
    from megatron_ext.runtime.initialize import destroy_distributed, initialize_distributed
    initialize_distributed("cpu")
    start = time.time()
    path = save_initialised_model(parse_args(BASE + flags + ["--save", save]))
    print(f"saved {path} in {time.time() - start:.0f} s", flush=True)
    destroy_distributed()


def fp32_weight_bytes(flags: list) -> int:
    """W: one fp32 copy of the whole model's parameters."""
    from megatron_ext.config.model_config import padded_vocab_size
    from megatron_ext.model.memory import stage_parameters
    config = parse_args(BASE + flags)
    n = stage_parameters(config, padded_vocab_size(config.data.vocab_size + 1,
                                                   config.model.make_vocab_size_divisible_by,
                                                   1), 0)
    return 4 * (n.trained + n.frozen)


def measured(cmd: list) -> tuple[int, float, int, str]:
    """Run ``cmd`` (a process of its own); ``(exit status, wall seconds, peak resident set in
    bytes, its output)``. The peak is the process's ``VmHWM``, read until it exits (the
    kernel's ru_maxrss would count the forking parent's pages too)."""
    start = time.time()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True,
                                cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _high_water_mark(proc.pid))
            time.sleep(0.05)
        log.seek(0)
        return proc.returncode, time.time() - start, peak, log.read()


def _high_water_mark(pid: int) -> int:
    """``VmHWM`` of a running process in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
    except (OSError, StopIteration):
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, help="where checkpoints and exports go")
    parser.add_argument("--arms", nargs="+", default=["learned", "binary"],
                        help="arms to convert (default: learned binary)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the checkpoints and exports (default: removed after each arm)")
    if len(sys.argv) > 1 and sys.argv[1] == "init":
        init(sys.argv[2], sys.argv[3:])
        return
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    shape = argv[split + 1:] or ["--preset", "smollm2-1.7b"]
    from measure import machine
    print(f"# bench_convert: {' '.join(shape)}; {machine()}", flush=True)
    print("| arm | W (fp32 weights) GiB | init s | convert --validate wall s | peak RSS GiB "
          "| peak / W | max abs logit diff |", flush=True)
    print("|---|---:|---:|---:|---:|---:|---|", flush=True)
    for arm in args.arms:
        flags = shape + ["--input-interface", arm]
        weights = fp32_weight_bytes(flags)
        ckpt, out = Path(args.workdir) / arm / "ckpt", Path(args.workdir) / arm / "hf"
        shutil.rmtree(Path(args.workdir) / arm, ignore_errors=True)
        rc, init_s, _, text = measured([sys.executable, __file__, "init", str(ckpt), *flags])
        if rc:
            raise SystemExit(f"init {arm} failed ({rc}):\n{text[-3000:]}")
        rc, wall, peak, text = measured([sys.executable, "tools/convert_to_hf.py", "--load",
                                         str(ckpt), "--output", str(out), "--validate"])
        if rc:
            raise SystemExit(f"convert {arm} failed ({rc}):\n{text[-3000:]}")
        diff = next((line.split("=")[1].split()[0] for line in text.splitlines()
                     if "max |logits_hf - logits_megatron|" in line), "?")
        print(f"| {arm} | {weights / GIB:.2f} | {init_s:.0f} | {wall:.0f} | {peak / GIB:.2f} | "
              f"{peak / weights:.2f} | {diff} |", flush=True)
        if not args.keep:
            shutil.rmtree(Path(args.workdir) / arm)


if __name__ == "__main__":
    main()
