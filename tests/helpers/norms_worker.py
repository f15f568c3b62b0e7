"""Worker for test_norms.py: the norms of the same weights after the same backward pass must be
equal at TP=1, at TP=2 and at PP=2 (two processes over gloo).

The test builds each variant at TP=1, saves its weights with dist_checkpointing under
``DIR/<variant>`` and measures its norms in process (:func:`norms_after_backward`). Run under
torchrun with 2 processes, ``norms_worker.py DIR`` loads those weights at TP=2, then at PP=2
(resharded by dist_checkpointing), measures the same norms and rank 0 writes them to
``DIR/norms.json`` as ``{layout: {variant: norms}}``.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import megatron_ext  # noqa: F401
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.distributed import (DistributedDataParallel, DistributedDataParallelConfig,
                                       finalize_model_grads)
from megatron.core.pipeline_parallel import get_forward_backward_func

from conftest import TINY_MODEL
from megatron_ext.config.model_config import padded_vocab_size
from megatron_ext.runtime.initialize import initialize_distributed
from megatron_ext.model.provider import model_provider
from megatron_ext.metrics.norms import NormReporter
from pretrain_fixedcode import forward_step, parse_args

VOCAB = 500
MICRO_BATCH = 2
# Four layers: at PP=2 the second stage holds layers 3 and 4 as decoder.layers.0 and .1.
NUM_LAYERS = 4
VARIANTS = {"learned": ["--input-interface", "learned"],
            "learned-tied": ["--input-interface", "learned",
                             "--no-untie-embeddings-and-output-weights"],
            "binary": ["--input-interface", "binary"],
            "factorized": ["--input-interface", "factorized", "--input-table-rank", "8"],
            "binary-map": ["--input-interface", "binary", "--code-projection"]}
LAYOUTS = {"tp2": (2, 1), "pp2": (1, 2)}  # (tensor, pipeline) parallel sizes


def build(variant: str, num_layers: int = NUM_LAYERS):
    """``(args, model of this rank's pipeline stage)`` at the current parallel sizes."""
    tp = parallel_state.get_tensor_model_parallel_world_size()
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    args = parse_args(TINY_MODEL + ["--num-layers", str(num_layers), "--vocab-size", str(VOCAB),
                                    "--tensor-model-parallel-size", str(tp),
                                    "--pipeline-model-parallel-size", str(pp), "--device", "cpu",
                                    "--train-iters", "1", "--mock-data", *VARIANTS[variant]])
    model = model_provider(args, padded_vocab_size(VOCAB, args.model.make_vocab_size_divisible_by,
                                                   tp),
                           pre_process=parallel_state.is_pipeline_first_stage(),
                           post_process=parallel_state.is_pipeline_last_stage(), on_cpu=True)
    return args, model


def batch(seq_length: int) -> dict:
    tokens = torch.randint(0, VOCAB, (MICRO_BATCH, seq_length + 1),
                           generator=torch.Generator().manual_seed(0))
    return {"tokens": tokens[:, :-1], "labels": tokens[:, 1:],
            "loss_mask": torch.ones(MICRO_BATCH, seq_length),
            "position_ids": torch.arange(seq_length).expand(MICRO_BATCH, seq_length)}


def norms_after_backward(args, model) -> dict:
    """The norms as the training loop measures them: after one forward-backward pass of
    :func:`batch` through DDP and Megatron's gradient finalization, before any update."""
    ddp = DistributedDataParallel(model.config,
                                  DistributedDataParallelConfig(grad_reduce_in_fp32=True), model)
    model.config.finalize_model_grads_func = finalize_model_grads
    reporter = NormReporter(model)
    get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter([batch(args.model.seq_length)]),
        model=[ddp], num_microbatches=1, seq_length=args.model.seq_length,
        micro_batch_size=MICRO_BATCH, forward_only=False)
    return {"params_norm": reporter.params_norm(), "param_norms": reporter.param_norms(),
            "grad_norms": reporter.grad_norms()}


def main(root: str) -> None:
    results = {}
    for layout, (tp, pp) in LAYOUTS.items():
        initialize_distributed("cpu", tp, pp)
        results[layout] = {}
        for variant in VARIANTS:
            args, model = build(variant)
            model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(),
                                                          os.path.join(root, variant)))
            results[layout][variant] = norms_after_backward(args, model)
        parallel_state.destroy_model_parallel()
    if torch.distributed.get_rank() == 0:
        with open(os.path.join(root, "norms.json"), "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
