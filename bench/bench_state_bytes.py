"""Training-state bytes a fixed-code input saves at the reference 1.7B shape: weights,
gradients and Adam state, from the real parameter counts of megatron_ext/model/param_count.py
(Megatron modules instantiated on the meta device).

Bytes per trainable parameter, as megatron_ext/train/loop.py trains with ``--bf16``: bf16
weights (2), fp32 gradients (4: Megatron DDP's ``grad_reduce_in_fp32=True``), Adam in fp32:
master copy + m + v (12). Totals are per model replica; a distributed optimizer spreads the
Adam state over the data-parallel ranks::

    python bench/bench_state_bytes.py                  # --preset smollm2-1.7b
    python bench/bench_state_bytes.py --grad-bytes 2   # bf16 gradients instead
"""

from __future__ import annotations

import argparse

from megatron_ext.config.arguments import parse_model_config
from megatron_ext.model.param_count import ARMS_WITHOUT_FLAGS, count_arms

WEIGHT_BYTES, ADAM_BYTES = 2, 12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grad-bytes", type=int, choices=[2, 4], default=4,
                        help="bytes per gradient element: 4 fp32 (default), 2 bf16")
    args, model_argv = parser.parse_known_args()
    config = parse_model_config(model_argv or ["--preset", "smollm2-1.7b"], "state bytes")[0]
    counts = count_arms(config, ARMS_WITHOUT_FLAGS)

    per_param = {"weights (bf16)": WEIGHT_BYTES,
                 f"gradients ({'fp32' if args.grad_bytes == 4 else 'bf16'})": args.grad_bytes,
                 "Adam fp32 master+m+v": ADAM_BYTES}
    per_param["total"] = sum(per_param.values())
    gib = 2 ** 30
    print(f"# bench_state_bytes: {config.model.num_layers} layers, hidden "
          f"{config.model.hidden_size}, vocab {config.data.vocab_size}; bytes per trainable "
          f"parameter: "
          + ", ".join(f"{k} {v}" for k, v in per_param.items()))
    print("| input | trainable params | " + " | ".join(f"{k} GiB" for k in per_param)
          + " | saved vs learned GiB | saved % |")
    print("|---|" + "---:|" * (len(per_param) + 3))
    learned = counts["learned"]["total"]
    for arm in ARMS_WITHOUT_FLAGS:
        n = counts[arm]["total"]
        saved = (learned - n) * per_param["total"]
        print(f"| {arm} | {n:,} | " + " | ".join(f"{n * b / gib:.2f}" for b in per_param.values())
              + f" | {saved / gib:.2f} | {100 * (learned - n) / learned:.1f} |")


if __name__ == "__main__":
    from megatron_ext.runtime.errors import exits_on_error
    with exits_on_error():
        main()
