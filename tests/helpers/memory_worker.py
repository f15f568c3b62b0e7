"""Worker for test_memory_plan.py, run under torchrun with 2 processes: the weights,
gradients, optimizer state and activation peak of a training step (tests/helpers/
memory_probe.py) at TP=2 (with and without sequence parallelism), PP=2 (4 micro-batches in
flight) and DP=2 with the distributed optimizer, for the learned table and a fixed code, beside what
megatron_ext/model/memory.py plans for each rank. Each rank writes DIR/rank<R>.json."""

from __future__ import annotations

import json
import os
import sys

import megatron_ext  # noqa: F401
import torch
from megatron.core import parallel_state

from helpers.memory_probe import measure
from megatron_ext.runtime.initialize import initialize_distributed

LAYOUTS = {  # name -> (TP, PP, flags)
    "tp2": (2, 1, ["--tensor-model-parallel-size", "2"]),
    "tp2-sp": (2, 1, ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--bf16"]),
    "pp2": (1, 2, ["--pipeline-model-parallel-size", "2", "--global-batch-size", "16"]),
    "dp2-dist-opt": (1, 1, ["--use-distributed-optimizer", "--bf16"]),
}
ARMS = {"learned": [], "binary": ["--input-interface", "binary"]}


def main(root: str) -> None:
    results = {}
    for layout, (tp, pp, flags) in LAYOUTS.items():
        initialize_distributed("cpu", tp, pp, seed=1234)
        for arm, arm_flags in ARMS.items():
            got = measure(flags + arm_flags)
            fp = got["planned"]
            results[f"{layout}/{arm}"] = {
                "state": got["state"], "peak": got["peak"],
                "planned": {"weights": fp.weights, "gradients": fp.gradients,
                            "optimizer": fp.optimizer, "activations": fp.activations}}
        parallel_state.destroy_model_parallel()
    with open(os.path.join(root, f"rank{torch.distributed.get_rank()}.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
