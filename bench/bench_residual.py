"""What a bf16 residual stream costs a +-1 fixed code (``--fp32-residual-connection``).

A pm1 code puts every residual element at +-1 (times ``--code-scale``), where bf16 has 8
significant bits: steps of 2^-7, so an increment below 2^-8 ~ 0.0039 added to the stream
rounds away. Two measures, on CPU or GPU:

* **dropped increments**: in the first layer, the share of the attention's non-zero
  increments that leave the bf16 stream unchanged, and the relative error of the increments
  that remain, for the model at initialisation and after the fp32 run's training;
* **training**: the same run in fp32, in bf16, and in bf16 with the fp32 residual stream
  (mock data, the same seed): per-step loss against fp32, and tokens/s.

    python bench/bench_residual.py            # binary arm, 4 layers, h 128, 40 steps
    python bench/bench_residual.py --input-interface learned
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import measure

REPO = Path(__file__).resolve().parent.parent
MODEL = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4",
         "--seq-length", "64", "--micro-batch-size", "4", "--global-batch-size", "8",
         "--lr", "3e-3", "--lr-warmup-iters", "4", "--mock-data", "--tokenizer-type",
         "NullTokenizer", "--vocab-size", "4095", "--log-interval", "1", "--eval-iters", "0",
         "--num-workers", "0", "--device", "cpu"]
RUNS = {"fp32": [], "bf16": ["--bf16"], "bf16 + fp32 residual": ["--bf16",
                                                                 "--fp32-residual-connection"]}


def dropped_increments(model, tokens: torch.Tensor) -> tuple[float, float]:
    """``(share of non-zero first-layer attention increments lost in a bf16 stream, median
    relative error of the others)``, from an fp32 forward pass."""
    seen = {}
    layer = model.decoder.layers[0]

    def stream(module, args, kwargs):
        seen["x"] = (kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]).clone()

    def increment(module, inputs, output):  # copied: the residual add works in place
        seen["d"] = output[0].clone()

    hooks = [layer.register_forward_pre_hook(stream, with_kwargs=True),
             layer.self_attention.register_forward_hook(increment)]
    with torch.no_grad():
        model(tokens, torch.arange(tokens.shape[1]).expand_as(tokens), None)
    for hook in hooks:
        hook.remove()
    x, d = seen["x"].bfloat16(), seen["d"].bfloat16()
    moved = (x + d).float() - x.float()
    nonzero = d != 0
    lost = (moved == 0) & nonzero
    kept = nonzero & ~lost
    rel = ((moved - d.float()).abs() / d.float().abs())[kept]
    return lost.sum().item() / nonzero.sum().item(), rel.median().item()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input-interface", default="binary", help="the arm")
    parser.add_argument("--train-iters", type=int, default=40, help="steps of each run")
    cli = parser.parse_args(argv)
    torch.set_num_threads(1)  # as measure.run_child's OMP_NUM_THREADS=1, which machine() says
    sys.path.insert(0, str(REPO))
    from megatron_ext.runtime.initialize import initialize_distributed
    from megatron_ext.metrics.sinks import read_metrics
    from megatron_ext.model.provider import model_provider as build_gpt
    from megatron_ext.train.loop import pretrain
    from pretrain_fixedcode import datasets_provider, forward_step, model_provider, \
        parse_args

    initialize_distributed("cpu")
    flags = MODEL + ["--input-interface", cli.input_interface, "--train-iters",
                     str(cli.train_iters)]
    tokens = torch.randint(0, 4095, (4, 64), generator=torch.Generator().manual_seed(0))
    losses, speed, trained = {}, {}, None
    with tempfile.TemporaryDirectory() as scratch:
        for name, extra in RUNS.items():
            path = os.path.join(scratch, name.replace(" ", "_") + ".jsonl")
            args = parse_args(flags + extra + ["--metrics-file", path])
            kept = {}

            def provider(*a, **k):
                kept["model"] = model_provider(*a, **k)
                return kept["model"]

            pretrain(args, provider, forward_step, datasets_provider)
            records = [r for r in read_metrics(path) if r["kind"] == "train"]
            losses[name] = {r["iteration"]: r["lm loss"] for r in records}
            speed[name] = statistics.median(r["tokens-per-second"] for r in records[3:])
            if name == "fp32":
                trained = kept["model"]
    init = build_gpt(parse_args(flags), 4096, on_cpu=True)
    print(f"`python bench/bench_residual.py --input-interface {cli.input_interface} "
          f"--train-iters {cli.train_iters}`; {measure.machine()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    print("| first layer, bf16 stream | increments lost | median relative error of the rest |")
    print("|---|---|---|")
    for name, model in (("at initialisation", init), (f"after {cli.train_iters} fp32 steps",
                                                      trained)):
        lost, rel = dropped_increments(model.eval(), tokens)
        print(f"| {name} | {100 * lost:.1f}% | {rel:.3f} |")
    print("\n| run | loss at step 1 | at the last | max abs difference to fp32 | "
          "tokens/s (median) |")
    print("|---|---|---|---|---|")
    ref = losses["fp32"]
    for name, run in losses.items():
        diff = max(abs(run[i] - ref[i]) for i in ref)
        print(f"| {name} | {run[1]:.4f} | {run[cli.train_iters]:.4f} | {diff:.4f} | "
              f"{speed[name]:,.0f} |")


if __name__ == "__main__":
    from megatron_ext.runtime.errors import exits_on_error
    with exits_on_error():
        main()
