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


def main(plan: str) -> None:
    logging_rank = int(os.environ["RANK"]) == int(os.environ["WORLD_SIZE"]) - 1
    with open(plan) as f:
        runs = json.load(f)
    for name, argv in runs:
        if logging_rank:
            print(f"=== run {name}", flush=True)
        args = parse_args(argv)
        pretrain(args, model_provider, forward_step, datasets_provider)
        parallel_state.destroy_model_parallel()  # the next run may lay the ranks out otherwise
        metrics = args.metrics_file or os.path.join(args.save, "metrics.jsonl")
        if logging_rank:
            shutil.copy(metrics, os.path.join(os.path.dirname(plan), f"{name}.jsonl"))


if __name__ == "__main__":
    main(sys.argv[1])
