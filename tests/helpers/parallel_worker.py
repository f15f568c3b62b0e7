"""Worker for test_parallel.py, run under torchrun with 2 processes: the training loop
(``megatron_ext.train.loop.pretrain``, in this one process group) of every arm at TP=1 x DP=2
(DDP) and at TP=2 with sequence parallelism; then one arm with the distributed optimizer at
DP=2, straight and interrupted after 5 steps and resumed, without and with
``--overlap-param-gather``; and the binary arm in bf16 with ``--fp32-residual-connection`` at
PP=1 (DP=2), saved after 5 steps, whose checkpoint then continues at PP=2 (the same weights:
a fresh PP=2 run would draw its second stage's with another seed). Each run writes its metrics file
to ``DIR/<layout>-<arm>.jsonl``; the test compares the per-step losses. One process start
(torch and megatron imported once) serves all the runs."""

from __future__ import annotations

import os
import sys

import megatron_ext  # noqa: F401

from conftest import TINY_RUN
from megatron_ext.train.loop import pretrain
from pretrain_fixedcode import datasets_provider, forward_step, model_provider, parse_args
from helpers.runs_worker import lay_out
from helpers.tp_parity_worker import ARMS

STEPS = 10
LAYOUTS = {"dp2": [], "tp2-sp": ["--tensor-model-parallel-size", "2", "--sequence-parallel"]}
DIST_OPT_ARM = "binary"
DIST_OPT = ["--use-distributed-optimizer"]
# Several buckets, their parameters gathered during the next forward pass; the parameter norm
# read between steps (it needs the gathered parameters).
OVERLAP = ["--overlap-grad-reduce", "--overlap-param-gather", "--ddp-bucket-size", "20000",
           "--log-params-norm"]
# bf16 weights, fp32 residual stream: pipeline stages send fp32 activations.
FP32_RESIDUAL = ["--bf16", "--fp32-residual-connection"]
FP32_RESIDUAL_SAVED = 5


def train(root: str, name: str, flags: list) -> None:
    args = parse_args(TINY_RUN + ["--train-iters", str(STEPS), "--device", "cpu",
                                  "--metrics-file", os.path.join(root, name + ".jsonl"), *flags])
    lay_out(args)
    pretrain(args, model_provider, forward_step, datasets_provider)


def main(root: str) -> None:
    for layout, flags in LAYOUTS.items():
        for arm, arm_flags in ARMS.items():
            train(root, f"{layout}-{arm}", flags + arm_flags)
    arm = ARMS[DIST_OPT_ARM]
    train(root, "dist-opt", DIST_OPT + arm)
    ckpt = ["--save", os.path.join(root, "ckpt"), "--load", os.path.join(root, "ckpt")]
    train(root, "dist-opt-first", DIST_OPT + arm + ckpt + ["--exit-interval", "5"])
    train(root, "dist-opt-resumed", DIST_OPT + arm + ckpt)
    ckpt = ["--save", os.path.join(root, "ckpt-overlap"), "--load",
            os.path.join(root, "ckpt-overlap")]
    train(root, "overlap-first", DIST_OPT + arm + OVERLAP + ckpt + ["--exit-interval", "5"])
    train(root, "overlap-resumed", DIST_OPT + arm + OVERLAP + ckpt)
    saved = os.path.join(root, "ckpt-fp32-residual")
    train(root, "fp32-residual-pp1", FP32_RESIDUAL + arm + [
        "--save", saved, "--save-interval", str(FP32_RESIDUAL_SAVED)])
    train(root, "fp32-residual-pp2", FP32_RESIDUAL + arm + [
        "--pipeline-model-parallel-size", "2", "--load", saved,
        "--ckpt-step", str(FP32_RESIDUAL_SAVED), "--save", os.path.join(root, "ckpt-pp2")])


if __name__ == "__main__":
    main(sys.argv[1])
