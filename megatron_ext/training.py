"""The training loop, built from Megatron-Core parts: DistributedDataParallel,
``get_megatron_optimizer``, ``OptimizerParamScheduler`` and ``get_forward_backward_func``
(pipeline parallelism included).

:func:`pretrain` takes the three callables users know from Megatron-LM's pretrain_gpt.py
(model provider, forward step, datasets provider) and owns everything around them: set-up,
resume, validation, logging (stdout and TensorBoard), checkpoints, exit conditions
(signals, duration, interval) and non-finite losses.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Callable, Optional

import torch
from tqdm import tqdm

from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.distributed import finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.pipeline_parallel import get_forward_backward_func

from . import checkpointing
from .arguments import padded_vocab_size
from .datasets import build_loader
from .exit_conditions import ExitConditions
from .initialize import initialize_distributed, resolve_device
from .metrics import MetricsLogger
from .model import build_code
from .profiling import StepProfiler, validate_profile_args
from .tokenizer import build_tokenizer


class NonFiniteLossError(RuntimeError):
    pass


def is_logging_rank() -> bool:
    """The last rank: the one that holds the loss under pipelining."""
    return torch.distributed.get_rank() == torch.distributed.get_world_size() - 1


def log(msg: str) -> None:
    """Print once, from the logging rank."""
    if is_logging_rank():
        print(msg, flush=True)


def setup_args(args: argparse.Namespace):
    """Derive batch, parallel and vocabulary values; refuse what cannot run. Returns the
    tokenizer."""
    world = torch.distributed.get_world_size()
    args.world_size = world
    args.data_parallel_size = world // (args.tensor_model_parallel_size
                                        * args.pipeline_model_parallel_size)
    if args.global_batch_size is None:
        args.global_batch_size = args.micro_batch_size * args.data_parallel_size
    per_step = args.micro_batch_size * args.data_parallel_size
    if args.global_batch_size % per_step:
        raise SystemExit(f"error: --global-batch-size {args.global_batch_size} is not a multiple "
                         f"of --micro-batch-size {args.micro_batch_size} x data-parallel size "
                         f"{args.data_parallel_size}")
    args.num_microbatches = args.global_batch_size // per_step
    if (args.train_iters is None) == (args.train_samples is None):
        raise SystemExit("error: give exactly one of --train-iters and --train-samples")
    if args.train_iters is None:
        args.train_iters = math.ceil(args.train_samples / args.global_batch_size)
    if args.device == "cpu" and (args.sequence_parallel or args.use_distributed_optimizer):
        raise SystemExit("error: --sequence-parallel and --use-distributed-optimizer need GPUs "
                         "(their reduce-scatter is not available on CPU/gloo)")
    if args.ddp_bucket_size is not None and not args.overlap_grad_reduce:
        raise SystemExit("error: --ddp-bucket-size applies with --overlap-grad-reduce only")
    validate_profile_args(args)
    if args.ckpt_step is not None and not args.load:
        raise SystemExit("error: --ckpt-step needs --load")
    if args.save_interval and not args.save:
        raise SystemExit("error: --save-interval needs --save")
    tokenizer = build_tokenizer(args.tokenizer_type, args.tokenizer_model, args.vocab_size)
    args.vocab_size = tokenizer.vocab_size
    if args.input_interface != "learned" and tokenizer.vocab_size > 2 ** args.code_bits:
        raise SystemExit(f"error: the tokenizer's {tokenizer.vocab_size} tokens do not fit "
                         f"--code-bits {args.code_bits} (at most 2^{args.code_bits} = "
                         f"{2 ** args.code_bits} ids); raise --code-bits")
    args.padded_vocab_size = padded_vocab_size(
        tokenizer.vocab_size, args.make_vocab_size_divisible_by, args.tensor_model_parallel_size)
    return tokenizer


def resolve_checkpoint(args: argparse.Namespace):
    """``(path, common)`` of the checkpoint to resume, or ``(None, None)``; sets the code.

    A ``--save`` directory that holds a checkpoint is the run's own: it is resumed even when
    ``--load`` names another directory (a requeued branch continues, rather than starting
    over from where it branched), and a run without ``--load`` refuses to overwrite it."""
    load = args.load
    saved = checkpointing.latest_iteration(args.save) if args.save else None
    if saved is not None and not (load and os.path.realpath(load) == os.path.realpath(args.save)):
        if not load:
            raise SystemExit(f"error: --save {args.save} already holds checkpoints (latest: "
                             f"iteration {saved}); resume them with --load {args.save}, or "
                             f"save to another directory")
        log(f"[fixedcode] --save {args.save} holds iteration {saved}: resuming from it, not "
            f"from --load {load}")
        load = args.save
    step = args.ckpt_step if load == args.load else None
    path = common = None
    if load and (step is not None or checkpointing.latest_iteration(load) is not None):
        path, common = checkpointing.load_common(load, step)
        checkpointing.check_compatible(common["args"], args, path)
        args.fixed_code = common["fixed_code"]  # never regenerate A and b of a saved model
        changes = checkpointing.reconcile_schedule(common["args"], args, path)
        if changes:
            log("[fixedcode] learning-rate schedule " + (
                "from these flags, not the checkpoint's: " if args.override_opt_param_scheduler
                else "kept from the checkpoint; ignored: ") + ", ".join(changes))
    else:
        code = build_code(args)
        args.fixed_code = None if code is None else code.to_dict()
    return path, common


def build_model_and_optimizer(args, model_provider: Callable):
    pre = parallel_state.is_pipeline_first_stage()
    post = parallel_state.is_pipeline_last_stage()
    model = model_provider(args, pre_process=pre, post_process=post)
    if args.device == "cuda":
        model.cuda(torch.cuda.current_device())
    ddp = DistributedDataParallel(
        config=model.config,
        ddp_config=DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=args.overlap_grad_reduce,
            bucket_size=args.ddp_bucket_size,
            use_distributed_optimizer=args.use_distributed_optimizer),
        module=model)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=args.lr, min_lr=args.min_lr,
                        weight_decay=args.weight_decay, adam_beta1=args.adam_beta1,
                        adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
                        clip_grad=args.clip_grad, bf16=args.bf16, fp16=args.fp16,
                        params_dtype=model.config.params_dtype,
                        use_distributed_optimizer=args.use_distributed_optimizer),
        [ddp])
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=args.lr, min_lr=args.min_lr,
        lr_warmup_steps=args.lr_warmup_iters,
        lr_decay_steps=args.lr_decay_iters or args.train_iters,
        lr_decay_style=args.lr_decay_style,
        start_wd=args.weight_decay, end_wd=args.weight_decay,
        wd_incr_steps=args.train_iters, wd_incr_style="constant",
        wsd_decay_steps=args.lr_wsd_decay_iters, lr_wsd_decay_style=args.lr_wsd_decay_style,
        # The schedule was settled on resume (checkpointing.reconcile_schedule): the
        # scheduler takes its own values, which are the flags' or the checkpoint's.
        use_checkpoint_opt_param_scheduler=False, override_opt_param_scheduler=True)
    model.config.finalize_model_grads_func = finalize_model_grads
    model.config.no_sync_func = ddp.no_sync
    if args.fp16:
        model.config.grad_scale_func = optimizer.scale_loss
    return model, ddp, optimizer, scheduler


def _reduce_losses(loss_dicts: list) -> Optional[float]:
    """Mean ``lm loss`` over the micro-batches (last pipeline stage), else None."""
    if not loss_dicts:
        return None
    total = torch.stack([d["lm loss"] for d in loss_dicts]).sum(0)
    return (total[0] / total[1]).item()


def _any_rank(flag: bool, device: str) -> bool:
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t.item())


def train_step(args, forward_step, train_iter, ddp, optimizer, scheduler):
    """One global batch: returns ``(loss or None, grad_norm, skipped)``."""
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    losses = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=train_iter, model=[ddp],
        num_microbatches=args.num_microbatches, seq_length=args.seq_length,
        micro_batch_size=args.micro_batch_size, forward_only=False)
    loss = _reduce_losses(losses)
    if _any_rank(loss is not None and not math.isfinite(loss), args.device):
        return loss, None, True
    updated, grad_norm, _ = optimizer.step()
    if updated:
        scheduler.step(increment=1)
    return loss, grad_norm, not updated


def evaluate(args, forward_step, valid_dataset, ddp) -> Optional[float]:
    """Mean validation loss over the first ``--eval-iters`` global batches."""
    ddp.eval()
    batches = iter(build_loader(valid_dataset, args.micro_batch_size, args.num_workers, 0))
    totals = []
    with torch.no_grad():
        for _ in range(args.eval_iters):
            losses = get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=batches, model=[ddp],
                num_microbatches=args.num_microbatches, seq_length=args.seq_length,
                micro_batch_size=args.micro_batch_size, forward_only=True)
            totals.extend(losses)
    ddp.train()
    return _reduce_losses(totals)


def pretrain(args: argparse.Namespace, model_provider: Callable, forward_step: Callable,
             datasets_provider: Callable) -> dict:
    """Run a whole training job; returns ``{"iteration", "train_loss", "valid_loss",
    "exit_reason"}`` (losses on the last rank only)."""
    start_time = time.time()
    args.device = resolve_device(args.device)
    initialize_distributed(args.device, args.tensor_model_parallel_size,
                           args.pipeline_model_parallel_size, args.seed)
    tokenizer = setup_args(args)
    resume_path, common = resolve_checkpoint(args)
    model, ddp, optimizer, scheduler = build_model_and_optimizer(args, model_provider)

    iteration, consumed, skipped_total = 0, 0, 0
    if resume_path:
        checkpointing.load_checkpoint(resume_path, common, model, optimizer, scheduler)
        iteration, consumed = common["iteration"], common["consumed_train_samples"]
        skipped_total = common["nonfinite_skipped"]
        log(f"[fixedcode] resumed from {resume_path} at iteration {iteration}")
    elif args.load:
        log(f"[fixedcode] no checkpoint in {args.load} yet: starting from scratch")

    train_iter, valid_dataset = datasets_provider(
        args, tokenizer, args.train_iters * args.global_batch_size, consumed)
    metrics = MetricsLogger(args, model, is_logging_rank=is_logging_rank())
    exits = ExitConditions(args, start_time)
    profiler = StepProfiler(args, torch.distributed.get_rank())
    log(f"[fixedcode] {args.input_interface} arm | {metrics.num_params:,} trainable parameters "
        f"| {args.device} x {args.world_size} (tp {args.tensor_model_parallel_size}, "
        f"pp {args.pipeline_model_parallel_size}, dp {args.data_parallel_size}) "
        f"| {args.num_microbatches} micro-batches per step")
    if args.overlap_grad_reduce:
        buckets = sum(len(buffer.buckets) for buffer in ddp.buffers)
        log(f"[fixedcode] gradient reduction overlaps the backward pass: {buckets} buckets")

    last_saved = iteration if resume_path else None

    def save():
        nonlocal last_saved
        if args.save and last_saved != iteration:
            path = checkpointing.save_checkpoint(args, iteration, model, optimizer, scheduler,
                                                 consumed, skipped_total)
            last_saved = iteration
            log(f"[fixedcode] saved checkpoint {path}")

    loss = valid_loss = reason = None
    nonfinite_in_a_row = 0
    bar = tqdm(total=args.train_iters, initial=iteration, desc="train", unit="it",
               disable=not (sys.stderr.isatty() and metrics.is_logging_rank))
    while iteration < args.train_iters:
        profiler.step_starts(iteration)
        step_start = time.time()
        step_loss, grad_norm, skipped = train_step(args, forward_step, train_iter, ddp,
                                                   optimizer, scheduler)
        iteration += 1
        profiler.step_ended(iteration)
        consumed += args.global_batch_size
        bar.update(1)
        if skipped:
            skipped_total += 1
            nonfinite_in_a_row += 1
            log(f"[fixedcode] iteration {iteration}: non-finite loss, update skipped "
                f"({nonfinite_in_a_row} in a row)")
            if nonfinite_in_a_row >= args.max_nonfinite_steps:
                raise NonFiniteLossError(
                    f"{nonfinite_in_a_row} non-finite losses in a row (--max-nonfinite-steps "
                    f"{args.max_nonfinite_steps}) at iteration {iteration}; the last good "
                    f"checkpoint is intact")
        else:
            nonfinite_in_a_row = 0
            loss = step_loss
        metrics.step(iteration, step_loss, grad_norm, scheduler.get_lr(optimizer.param_groups[0]),
                     time.time() - step_start, skipped_total)
        if valid_dataset is not None and (iteration % args.eval_interval == 0
                                          or iteration == args.train_iters):
            valid_loss = evaluate(args, forward_step, valid_dataset, ddp)
            metrics.validation(iteration, valid_loss)
        if args.save_interval and iteration % args.save_interval == 0:
            save()
        reason = exits.check(iteration) if iteration < args.train_iters else None
        if reason:
            break
    bar.close()
    profiler.close()
    save()
    metrics.close()
    if reason:
        log(f"[fixedcode] {reason}: exiting at iteration {iteration}")
    else:
        summary = f"[fixedcode] training done: iteration {iteration}"
        if loss is not None:
            summary += f" | final train loss {loss:.6f}"
        if valid_loss is not None:
            summary += f" | final validation loss {valid_loss:.6f}"
        log(summary)
    return {"iteration": iteration, "train_loss": loss, "valid_loss": valid_loss,
            "exit_reason": reason}
