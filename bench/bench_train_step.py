"""One full training step (forward, backward, Megatron DDP grad reduce and the Megatron Adam
step) of the same GPTModel with a learned input table and with fixed codes, side by side.

The step is the training loop's own: ``megatron_ext.train.setup.build_model_and_optimizer`` and
``train_step`` with pretrain_fixedcode.py's forward step, on one fixed synthetic batch. Each
arm runs in its own process. Model flags are the training flags; the defaults are a small
model with the reference vocabulary (49,152)::

    python bench/bench_train_step.py
    python bench/bench_train_step.py --bf16 --num-layers 4 --hidden-size 2048 \\
        --num-attention-heads 32 --seq-length 2048 --micro-batch-size 1
"""

from __future__ import annotations

import argparse
import itertools
import runpy
from pathlib import Path

import torch

import measure
from megatron_ext.codes.schemes import PAPER_ARMS

REPO = Path(__file__).resolve().parent.parent
DEFAULTS = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4",
            "--seq-length", "256", "--micro-batch-size", "2", "--vocab-size", "49151",
            "--tokenizer-type", "NullTokenizer", "--mock-data", "--train-iters", "1"]


def child(arm: str, model_argv: list, warmup: int, reps: int) -> None:
    entry = runpy.run_path(str(REPO / "pretrain_fixedcode.py"))  # a script, not a module
    forward_step, model_provider, parse_args = (
        entry["forward_step"], entry["model_provider"], entry["parse_args"])
    from megatron_ext.runtime.initialize import initialize_distributed, resolve_device
    from megatron_ext.train.setup import build_model_and_optimizer, check_machine_and_tokenizer
    from megatron_ext.train.step import train_step

    args = parse_args(DEFAULTS + model_argv + ["--input-interface", arm])
    device = resolve_device(args.training.device)
    initialize_distributed(device, seed=args.training.seed)
    _, args, derived = check_machine_and_tokenizer(args, device)
    gen = torch.Generator().manual_seed(0)
    b, s = args.training.micro_batch_size, args.model.seq_length
    tokens = torch.randint(0, args.data.vocab_size, (b, s + 1), generator=gen)
    batch = {"tokens": tokens[:, :-1], "labels": tokens[:, 1:],
             "loss_mask": torch.ones(b, s), "position_ids": torch.arange(s).expand(b, -1)}
    batch = {k: v.contiguous().to(device) for k, v in batch.items()}

    baseline = measure.memory_now()
    model, ddp, optimizer, scheduler = build_model_and_optimizer(args, derived, model_provider)
    measure.reset_peak()
    batches = itertools.repeat(batch)

    def step():
        train_step(args, derived.num_microbatches, forward_step, batches, ddp, optimizer,
                   scheduler)

    step_ms = measure.time_ms(step, warmup, reps)
    peak = measure.peak_memory() - baseline
    tokens_per_step = derived.global_batch_size * s
    measure.emit({"step_ms": step_ms, "peak_bytes": peak,
                  "tokens_per_s": tokens_per_step / step_ms["wall"] * 1e3,
                  "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                  "shape": f"{args.model.num_layers} layers, hidden {args.model.hidden_size}, "
                           f"seq {s}, {derived.global_batch_size} x "
                           f"{s} tokens/step, vocab {derived.padded_vocab_size}, "
                           f"{model.config.params_dtype}"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=None, help="default 20 GPU, 5 CPU")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args, model_argv = parser.parse_known_args()
    reps = args.reps if args.reps is not None else (20 if measure.device() == "cuda" else 5)
    if args.child:
        return child(args.child, model_argv, args.warmup, reps)

    results = {arm: measure.run_child(__file__, arm, "--warmup", str(args.warmup), "--reps",
                                      str(reps), *model_argv) for arm in PAPER_ARMS}
    base = results["learned"]
    print(f"# bench_train_step: {base['shape']}; warmup {args.warmup}, reps {reps} (median)\n"
          f"# machine: {measure.machine()}\n# memory: {measure.MEMORY_KIND}")
    clocks = measure.clocks()
    print("| input | trainable | " + " | ".join(f"step {c} ms" for c in clocks)
          + " | tokens/s (wall) | peak MiB | "
          + " | ".join(f"learned/this step {c}" for c in clocks) + " | learned/this peak |")
    print("|---|" + "---:|" * (4 + 2 * len(clocks)))
    for arm, r in results.items():
        print(f"| {arm} | {r['trainable']:,} | "
              + " | ".join(f"{r['step_ms'][c]:.1f}" for c in clocks)
              + f" | {r['tokens_per_s']:,.0f} | {r['peak_bytes'] / 2**20:.0f} | "
              + " | ".join(f"{base['step_ms'][c] / r['step_ms'][c]:.2f}x" for c in clocks)
              + f" | {base['peak_bytes'] / max(r['peak_bytes'], 1):.2f}x |")


if __name__ == "__main__":
    from megatron_ext.runtime.errors import exits_on_error
    with exits_on_error():
        main()
