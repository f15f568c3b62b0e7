"""Worker for tests that take several runs on the same ranks, run under torchrun: ``runs_worker.py
PLAN.json``, the plan a list of ``[name, args]``, each run the training loop
(``megatron_ext.train.loop.pretrain``) in this one process group, one after another. The logging
rank prints ``=== run NAME`` before each run's log and, once it ends, copies its metrics file
(``--metrics-file``, else ``--save``'s ``metrics.jsonl``) to ``NAME.jsonl`` beside the plan: what
the file held then (a resumed run appends to its save's). One process start serves all the runs,
where a torchrun launch per run started every rank again."""

from __future__ import annotations

import json
import os
import shutil
import sys

import megatron_ext  # noqa: F401
from megatron.core import parallel_state

from megatron_ext.train.loop import pretrain
from pretrain_fixedcode import datasets_provider, forward_step, model_provider, parse_args


def lay_out(args) -> None:
    """Before a run: the model-parallel groups of the previous run are kept when ``args`` lays
    the ranks out alike (pretrain sets up groups only where there are none), else dropped. A
    layout is some 30 gloo groups, whose threads megatron-core's ``destroy_model_parallel``
    leaves running (it drops its references only): made anew for each of test_parallel's 23
    runs, they reached 1,000 threads per rank, polling, and 40% of the launch's CPU was the
    kernel's (28 s user, 17 s system)."""
    layout = (args.parallel.tensor_model_parallel_size, args.parallel.pipeline_model_parallel_size)
    if parallel_state.model_parallel_is_initialized() and layout != (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size()):
        parallel_state.destroy_model_parallel()


def main(plan: str) -> None:
    logging_rank = int(os.environ["RANK"]) == int(os.environ["WORLD_SIZE"]) - 1
    with open(plan) as f:
        runs = json.load(f)
    for name, argv in runs:
        if logging_rank:
            print(f"=== run {name}", flush=True)
        args = parse_args(argv)
        lay_out(args)
        pretrain(args, model_provider, forward_step, datasets_provider)
        metrics = args.logging.metrics_file or os.path.join(args.checkpoint.save,
                                                            "metrics.jsonl")
        if logging_rank:
            shutil.copy(metrics, os.path.join(os.path.dirname(plan), f"{name}.jsonl"))


if __name__ == "__main__":
    main(sys.argv[1])
