"""The training loop, built from Megatron-Core parts: DistributedDataParallel,
``get_megatron_optimizer``, ``OptimizerParamScheduler`` and ``get_forward_backward_func``
(pipeline parallelism included).

:func:`pretrain` takes the three callables users know from Megatron-LM's pretrain_gpt.py
(model provider, forward step, datasets provider) and runs the loop; each policy around it
belongs to an object: when to validate (:class:`~megatron_ext.validation.Validator`), when
to save (:class:`~megatron_ext.saving.Checkpointer`), when to stop
(:class:`~megatron_ext.exit_conditions.ExitConditions`), what to log
(:class:`~megatron_ext.metrics.MetricsLogger`), how many non-finite steps to bear
(:class:`NonFiniteGuard`). It returns a :class:`PretrainResult`.

The flags are read, never written: what start-up settles (the device, the layers, a resumed
schedule) is a frozen :class:`~megatron_ext.derived.Resolved`, beside the
:class:`~megatron_ext.derived.Derived` values.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
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
from megatron.core.optimizer import OptimizerConfig, distrib_optimizer, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.transformer.module import Float16Module

from . import checkpointing
from .attention import local_core_attention
from .checkpointing import TrainState
from .code_limits import require_vocab_fits
from .codes import FixedCode
from .datasets import samples_per_split
from .device_checks import check_cuda_connections, fp8_refusal
from .derived import Derived, Resolved, derive, run_record
from .exit_conditions import ExitConditions
from .initialize import initialize_distributed, resolve_device
from .log import is_logging_rank, log
from .metric_sinks import agree_wandb_run_id
from .metrics import MetricsLogger
from .model import build_code, transformer_engine_imports, transformer_engine_version
from .norms import NormReporter
from .profiling import StepProfiler, validate_profile_args
from .saving import Checkpointer
from .tokenizer import build_tokenizer
from .reductions import max_over_ranks, reduce_losses
from .validation import Validator


class NonFiniteLossError(RuntimeError):
    pass


def setup_args(args: argparse.Namespace, device: str) -> tuple:
    """Refuse what cannot run on ``device`` (``cuda`` or ``cpu``); returns ``(tokenizer,
    derived, resolved)``: the values derived from the flags, the world and the tokenizer
    (:class:`~megatron_ext.derived.Derived`) and the flags settled for this machine
    (:class:`~megatron_ext.derived.Resolved`, with the flags' schedule), built once. ``args``
    is not written into."""
    tokenizer = build_tokenizer(args.tokenizer_type, args.tokenizer_model, args.vocab_size)
    derived = derive(args, torch.distributed.get_world_size(), tokenizer.vocab_size)
    if args.log_layer_norms and args.use_distributed_optimizer:
        raise SystemExit("error: --log-layer-norms reads whole gradients, which "
                         "--use-distributed-optimizer scatters across ranks; drop one")
    if (args.use_distributed_optimizer and args.dist_ckpt_optim_fully_reshardable
            and not distrib_optimizer.HAVE_APEX_OR_TE):
        raise SystemExit("error: --dist-ckpt-optim-fully-reshardable: neither Transformer "
                         "Engine nor Apex imports, so the distributed optimizer runs torch's "
                         "Adam, whose state megatron-core 0.16.1 cannot load in that layout; "
                         "drop the flag (the default layout resumes) or pip install '.[gpu]'")
    transformer_impl, sequence_parallel = resolve_layers(args, device)
    resolved = Resolved(device, transformer_impl, sequence_parallel,
                        {k: getattr(args, k) for k in checkpointing.SCHEDULE_FLAGS})
    if args.ddp_bucket_size is not None and not args.overlap_grad_reduce:
        raise SystemExit("error: --ddp-bucket-size applies with --overlap-grad-reduce only")
    if args.overlap_param_gather and not (args.use_distributed_optimizer
                                          and args.overlap_grad_reduce):
        raise SystemExit("error: --overlap-param-gather needs --use-distributed-optimizer and "
                         "--overlap-grad-reduce, as in Megatron-LM")
    if args.manual_gc_interval < 0:
        raise SystemExit(f"error: --manual-gc-interval {args.manual_gc_interval} is negative")
    validate_profile_args(resolved.applied_to(args))
    if args.ckpt_step is not None and not args.load:
        raise SystemExit("error: --ckpt-step needs --load")
    for flag in ("save_interval", "async_save", "keep_last_checkpoints"):
        if getattr(args, flag) and not args.save:
            raise SystemExit(f"error: --{flag.replace('_', '-')} needs --save")
    for flag in ("keep_last_checkpoints", "keep_checkpoints_every"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise SystemExit(f"error: --{flag.replace('_', '-')} must be at least 1")
    if args.keep_checkpoints_every and not args.keep_last_checkpoints:
        raise SystemExit("error: --keep-checkpoints-every applies with --keep-last-checkpoints "
                         "only (without it every save is kept)")
    if args.input_interface != "learned":
        require_vocab_fits(derived.padded_vocab_size, args.code_bits, tokenizer.vocab_size)
    return tokenizer, derived, resolved


def resolve_layers(args: argparse.Namespace, device: str) -> tuple[str, bool]:
    """``(transformer_impl, sequence_parallel)``: the transformer layers, attention, FP8 and
    sequence parallelism for ``device``, settled as Megatron-LM settles them
    (megatron/training/arguments.py): Transformer Engine layers by default on a GPU where TE
    imports (local layers otherwise, said in the log), sequence parallelism turned off with a
    warning at TP=1; on a GPU, the checks of :mod:`megatron_ext.device_checks`."""
    impl, sequence_parallel = args.transformer_impl, args.sequence_parallel
    if impl is None:
        te = device == "cuda" and transformer_engine_imports()
        impl = "transformer_engine" if te else "local"
        if device == "cuda":
            log(f"[fixedcode] --transformer-impl {impl} (the default on a GPU: "
                + ("Transformer Engine imports)" if te else
                   "Transformer Engine does not import; pip install '.[gpu]' for it)"))
    elif impl == "transformer_engine" and device == "cpu":
        raise SystemExit("error: --transformer-impl transformer_engine needs a GPU (Transformer "
                         "Engine's layers run on CUDA only); use --transformer-impl local")
    if args.fp8_format and impl != "transformer_engine":
        raise SystemExit("error: --fp8-format needs --transformer-impl transformer_engine "
                         "(Transformer Engine layers, on a GPU)")
    if impl == "local":
        local_core_attention(args.attention_backend)  # refuses TE's own backends
    elif args.attention_backend == "local":
        raise SystemExit("error: --attention-backend local is Megatron-Core's attention of the "
                         "local layers: it needs --transformer-impl local, as in Megatron-LM")
    if sequence_parallel and args.tensor_model_parallel_size == 1:
        log("[fixedcode] warning: --sequence-parallel turned off: it splits activations over "
            "tensor-parallel ranks, and --tensor-model-parallel-size is 1 (as in Megatron-LM)")
        sequence_parallel = False
    if device == "cuda":
        capability = torch.cuda.get_device_capability()
        check_cuda_connections(args.tensor_model_parallel_size, sequence_parallel,
                               capability, os.environ)
        if args.fp8_format:
            refusal = fp8_refusal(args.fp8_recipe, capability, transformer_engine_version())
            if refusal:
                raise SystemExit(f"error: {refusal}")
    return impl, sequence_parallel


def resolve_checkpoint(args: argparse.Namespace, derived: Derived, resolved: Resolved):
    """``(path, common, code, resolved)``: the checkpoint to resume (``None, None`` for a
    fresh run), the run's fixed code (``None`` for the learned arm), resolved once: the
    checkpoint's saved code (A and b are never redrawn), else one drawn from the flags; and
    ``resolved`` with the schedule the run keeps (the checkpoint's, with
    ``--use-checkpoint-opt_param-scheduler``). The caller passes the code to the model
    provider and to saving.

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
        checkpointing.check_compatible(common["args"], run_record(resolved.applied_to(args),
                                                                  derived), path)
        checkpointing.check_optimizer_resharding(common, args, path)
        saved = common["fixed_code"]
        code = None if saved is None else FixedCode.from_dict(saved)
        changes, schedule = checkpointing.reconcile_schedule(common["args"], args,
                                                             derived.train_iters, path)
        resolved = dataclasses.replace(resolved, schedule=schedule)
        if changes:
            log("[fixedcode] learning-rate schedule " + (
                "from these flags, not the checkpoint's: " if args.override_opt_param_scheduler
                else "kept from the checkpoint; ignored: ") + ", ".join(changes))
    else:
        code = build_code(args, derived.padded_vocab_size)
    return path, common, code, resolved


def build_model_and_optimizer(args, derived: Derived, model_provider: Callable,
                              code: Optional[FixedCode] = None):
    """``args``: the flags as the run applies them (:meth:`Resolved.applied_to`); ``code``:
    the run's fixed code (:func:`resolve_checkpoint`); omitted, the model provider draws one
    from the flags."""
    pre = parallel_state.is_pipeline_first_stage()
    post = parallel_state.is_pipeline_last_stage()
    model = model_provider(args, derived.padded_vocab_size, pre_process=pre, post_process=post,
                           code=code)
    if args.device == "cuda":
        model.cuda(torch.cuda.current_device())
    # As Megatron-LM: under --bf16/--fp16 every parameter (norms included, which the local
    # layers create in fp32) is cast to the training dtype, and so are the first stage's
    # float inputs; the last stage's output comes back in fp32. ``model`` stays the bare
    # GPTModel (checkpoints, metrics, norms); the wrapper shares its parameters.
    module = Float16Module(model.config, model) if args.bf16 or args.fp16 else model
    ddp = DistributedDataParallel(
        config=model.config,
        ddp_config=DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=args.overlap_grad_reduce,
            overlap_param_gather=args.overlap_param_gather,
            bucket_size=args.ddp_bucket_size,
            use_distributed_optimizer=args.use_distributed_optimizer),
        module=module)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=args.lr, min_lr=args.min_lr,
                        weight_decay=args.weight_decay, adam_beta1=args.adam_beta1,
                        adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
                        clip_grad=args.clip_grad, bf16=args.bf16, fp16=args.fp16,
                        log_num_zeros_in_grad=args.log_num_zeros_in_grad,
                        params_dtype=model.config.params_dtype,
                        use_distributed_optimizer=args.use_distributed_optimizer),
        [ddp])
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=args.lr, min_lr=args.min_lr,
        lr_warmup_steps=args.lr_warmup_iters,
        lr_decay_steps=args.lr_decay_iters or derived.train_iters,
        lr_decay_style=args.lr_decay_style,
        start_wd=args.weight_decay, end_wd=args.weight_decay,
        wd_incr_steps=derived.train_iters, wd_incr_style="constant",
        wsd_decay_steps=args.lr_wsd_decay_iters, lr_wsd_decay_style=args.lr_wsd_decay_style,
        # The schedule was settled on resume (checkpointing.reconcile_schedule): the
        # scheduler takes its own values, which are the flags' or the checkpoint's.
        use_checkpoint_opt_param_scheduler=False, override_opt_param_scheduler=True)
    model.config.finalize_model_grads_func = finalize_model_grads
    model.config.no_sync_func = ddp.no_sync
    if args.fp16:
        model.config.grad_scale_func = optimizer.scale_loss
    return model, ddp, optimizer, scheduler


def _nonfinite_grads(ddp: DistributedDataParallel) -> torch.Tensor:
    """Whether this rank holds a NaN or infinite gradient: one norm per gradient buffer, the
    measure of megatron-core's ``check_for_nan_in_grad`` (per bucket). Read after the
    data-parallel reduction, over the whole buffer: under the distributed optimizer a rank's
    buffer then holds its reduced shard and, elsewhere, its own unreduced gradients, so every
    NaN is seen by some rank."""
    norms = [buffer.grad_data.norm() for buffer in ddp.buffers + ddp.expert_parallel_buffers]
    return ~torch.isfinite(torch.stack(norms)).all()


# Why a step's update was skipped. The first three are failures, counted by NonFiniteGuard;
# an fp16 overflow above the minimum loss scale is the dynamic loss scaler at work (it
# lowers the scale, the next step retries): from its initial 2^32 the scale comes down in
# the first ~20 steps of every fp16 run.
NONFINITE_LOSS = "non-finite loss"
NONFINITE_GRADS = "non-finite gradients with a finite loss"
OVERFLOW_AT_MIN_SCALE = "fp16 gradients overflow at the minimum loss scale"
OVERFLOW = "fp16 gradients overflow; loss scale lowered"
FAILURES = (NONFINITE_LOSS, NONFINITE_GRADS, OVERFLOW_AT_MIN_SCALE)


@dataclasses.dataclass
class StepResult:
    loss: Optional[float]  # None on ranks that are not the last pipeline stage
    grad_norm: Optional[float] = None
    num_zeros: Optional[float] = None
    skip: Optional[str] = None  # why the update was skipped (NONFINITE_LOSS, ...), or None
    norms: dict = dataclasses.field(default_factory=dict)  # grad_norms() of train_step


class NonFiniteGuard:
    """Counts updates skipped for a failure (:data:`FAILURES`); after
    ``--max-nonfinite-steps`` in a row, training stops with :class:`NonFiniteLossError` (the
    last checkpoint is left as it was: no failing update ever reached the weights). fp16
    overflows above the minimum loss scale neither count nor break a row."""

    def __init__(self, limit: int):
        self.limit = limit
        self.in_a_row = 0

    def record(self, iteration: int, skip: Optional[str]) -> None:
        if skip == OVERFLOW:
            return
        if skip is None:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        log(f"[fixedcode] iteration {iteration}: {skip}, update skipped "
            f"({self.in_a_row} in a row)")
        if self.in_a_row >= self.limit:
            raise NonFiniteLossError(
                f"{self.in_a_row} non-finite steps in a row (--max-nonfinite-steps "
                f"{self.limit}) at iteration {iteration}, the last: {skip}; the last good "
                f"checkpoint is intact")


def train_step(args, num_microbatches: int, forward_step, train_iter, ddp, optimizer, scheduler,
               grad_norms: Optional[Callable[[], dict]] = None) -> StepResult:
    """One global batch; ``StepResult.norms`` is ``grad_norms()`` measured between the
    backward pass and the update.

    A non-finite loss, or a NaN/infinite gradient with a finite loss, skips the update on
    every rank (agreed in one all-reduce). Megatron-LM instead raises at once on the rank
    that sees a NaN gradient (DDP's ``check_for_nan_in_grad``); skipping keeps one policy for
    both, ``--max-nonfinite-steps``, and all ranks take the same decision. Under fp16 the
    gradients are left to the dynamic loss scaler, whose overflows are expected (Megatron-LM
    turns its check off there too)."""
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    losses = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=train_iter, model=[ddp],
        num_microbatches=num_microbatches, seq_length=args.seq_length,
        micro_batch_size=args.micro_batch_size, forward_only=False)
    loss = reduce_losses(losses)
    norms = grad_norms() if grad_norms else {}
    bad_loss, bad_grads = max_over_ranks(
        [loss is not None and not math.isfinite(loss), not args.fp16 and _nonfinite_grads(ddp)],
        args.device)
    if bad_loss or bad_grads:
        return StepResult(loss, skip=NONFINITE_LOSS if bad_loss else NONFINITE_GRADS,
                          norms=norms)
    scale = optimizer.get_loss_scale().item() if args.fp16 else None
    updated, grad_norm, num_zeros = optimizer.step()
    if not updated:  # only fp16's loss scaler declines a step
        return StepResult(loss, skip=OVERFLOW_AT_MIN_SCALE
                          if scale <= optimizer.config.min_loss_scale else OVERFLOW, norms=norms)
    scheduler.step(increment=1)
    return StepResult(loss, grad_norm, num_zeros, None, norms)


@contextlib.contextmanager
def gathered_parameters(args, ddp: DistributedDataParallel):
    """Whole, current parameters in the model for what reads them between steps (validation,
    a checkpoint, the parameter norm). Under ``--overlap-param-gather`` the distributed
    optimizer's update reaches the other ranks' copies only in the next forward pass's
    pre-hooks: they are gathered now and the hooks stay off meanwhile, as Megatron-LM does."""
    if not args.overlap_param_gather:
        yield
        return
    ddp.disable_forward_pre_hook(param_sync=True)
    try:
        yield
    finally:
        ddp.enable_forward_pre_hook()


def _diagnostics(args, norms: Optional[NormReporter], grad_norms: dict,
                 num_zeros: Optional[float], optimizer, state: TrainState,
                 ddp: DistributedDataParallel) -> dict:
    """The optional scalars of a log iteration (``--log-params-norm``,
    ``--log-num-zeros-in-grad``, ``--log-layer-norms``; under ``--fp16`` the loss scale and
    the overflow skips so far), measured after the update."""
    out = {}
    if args.fp16:
        out["loss-scale"] = optimizer.get_loss_scale().item()
        out["overflow-skipped-iterations"] = state.overflow_skipped
    if args.log_params_norm:
        with gathered_parameters(args, ddp):
            out["params-norm"] = norms.params_norm()
    if args.log_num_zeros_in_grad and num_zeros is not None:
        out["num-zeros"] = int(num_zeros)
    if args.log_layer_norms:
        out.update({f"grad-norm/{k}": v for k, v in grad_norms.items()})
        out.update({f"params-norm/{k}": v for k, v in norms.param_norms().items()})
    return out


@dataclasses.dataclass(frozen=True)
class PretrainResult:
    """How a training job ended (losses on the last pipeline stage only, else None)."""
    iteration: int  # the last completed iteration
    train_loss: Optional[float] = None  # the last update's
    valid_loss: Optional[float] = None  # the last validation's
    exit_reason: Optional[str] = None  # why it stopped before --train-iters, or None


def pretrain(args: argparse.Namespace, model_provider: Callable, forward_step: Callable,
             datasets_provider: Callable) -> PretrainResult:
    """Run a whole training job. ``args`` (the parsed flags) is read, never written.

    With ``--exit-signal-handler``, an exit signal during start-up ends the job at the end
    of the current phase (checkpoint load, dataset building) with nothing saved; during
    validation, after the current batch, saving a checkpoint that asks the resumed run to
    validate first; during a training step, after the step, saving."""
    start_time = time.time()
    device = resolve_device(args.device)
    initialize_distributed(device, args.tensor_model_parallel_size,
                           args.pipeline_model_parallel_size, args.seed)
    exits = ExitConditions(args, device, start_time)
    tokenizer, derived, resolved = setup_args(args, device)
    resume_path, common, code, resolved = resolve_checkpoint(args, derived, resolved)
    run = resolved.applied_to(args)  # the flags as this run applies them
    model, ddp, optimizer, scheduler = build_model_and_optimizer(run, derived, model_provider,
                                                                 code)
    state = TrainState()
    if resume_path:
        checkpointing.load_checkpoint(resume_path, common, model, optimizer, scheduler)
        state = TrainState.from_common(common)
        log(f"[fixedcode] resumed from {resume_path} at iteration {state.iteration}")
    elif args.load:
        log(f"[fixedcode] no checkpoint in {args.load} yet: starting from scratch")

    reason = exits.signalled()
    if reason:
        return _stopped(state, reason, "during start-up, before training (nothing new to save)")
    train_iter, valid_dataset = datasets_provider(
        run, tokenizer, samples_per_split(args, derived), state.consumed_train_samples)
    reason = exits.signalled()
    if reason:
        return _stopped(state, reason, "while building the datasets (nothing new to save)")

    own_run = bool(resume_path and args.save) and (
        os.path.realpath(os.path.dirname(resume_path)) == os.path.realpath(args.save))
    wandb_run_id = agree_wandb_run_id(args, common["wandb_run_id"] if own_run else None)
    metrics = MetricsLogger(run, derived, model, is_logging_rank(), state.iteration,
                            wandb_run_id)
    gathered = functools.partial(gathered_parameters, run, ddp)
    validator = Validator(run, derived.train_iters, derived.num_microbatches, forward_step,
                          valid_dataset, ddp, exits, metrics, gathered=gathered)
    checkpointer = Checkpointer(run, derived, model, optimizer, scheduler, code,
                                wandb_run_id, last_saved=state.iteration if resume_path else None,
                                gathered=gathered)
    norms = NormReporter(model) if args.log_params_norm or args.log_layer_norms else None
    guard = NonFiniteGuard(args.max_nonfinite_steps)
    profiler = StepProfiler(run, torch.distributed.get_rank())
    _log_start(run, derived, ddp, metrics.num_params)

    loss = None
    if state.validation_pending:  # a signal stopped it before the checkpoint was saved
        reason = validator.validate(state)
    if args.manual_gc:  # Python's collector pauses each rank at its own moment
        gc.disable()
        gc.collect()
    bar = tqdm(total=derived.train_iters, initial=state.iteration, desc="train", unit="it",
               disable=not (sys.stderr.isatty() and metrics.is_logging_rank))
    while state.iteration < derived.train_iters and not reason:
        profiler.step_starts(state.iteration)
        step_start = time.time()
        log_now = metrics.is_log_iteration(state.iteration + 1)
        step = train_step(
            run, derived.num_microbatches, forward_step, train_iter, ddp, optimizer, scheduler,
            (lambda: norms.grad_norms(optimizer.get_loss_scale().item()))
            if log_now and args.log_layer_norms else None)
        state.iteration += 1
        state.consumed_train_samples += derived.global_batch_size
        profiler.step_ended(state.iteration)
        bar.update(1)
        state.nonfinite_skipped += step.skip in FAILURES
        state.overflow_skipped += step.skip == OVERFLOW
        guard.record(state.iteration, step.skip)
        if step.skip is None:
            loss = step.loss
        metrics.step(state.iteration, step.loss, step.grad_norm,
                     scheduler.get_lr(optimizer.param_groups[0]), time.time() - step_start,
                     state.nonfinite_skipped,
                     _diagnostics(args, norms, step.norms, step.num_zeros, optimizer, state,
                                  ddp) if log_now else None)
        if validator.should_validate(state.iteration):
            reason = validator.validate(state)
        checkpointer.save(state)
        if args.manual_gc and args.manual_gc_interval \
                and state.iteration % args.manual_gc_interval == 0:
            gc.collect()
        if not reason and state.iteration < derived.train_iters:
            reason = exits.check(state.iteration)
    bar.close()
    profiler.close()
    checkpointer.save(state, final=True)
    if args.manual_gc:
        gc.enable()
    metrics.close()
    result = PretrainResult(state.iteration, loss, validator.last_loss, reason)
    _log_end(result)
    return result


def _stopped(state: TrainState, reason: str, when: str) -> PretrainResult:
    log(f"[fixedcode] {reason} {when}: exiting at iteration {state.iteration}")
    return PretrainResult(state.iteration, exit_reason=reason)


def _log_start(run: argparse.Namespace, derived: Derived, ddp, num_params: int) -> None:
    log(f"[fixedcode] {run.input_interface} arm | {num_params:,} trainable parameters "
        f"| {run.device} x {derived.world_size} (tp {run.tensor_model_parallel_size}, "
        f"pp {run.pipeline_model_parallel_size}, dp {derived.data_parallel_size}) "
        f"| {derived.num_microbatches} micro-batches per step")
    if run.overlap_grad_reduce:
        buckets = sum(len(buffer.buckets) for buffer in ddp.buffers)
        log(f"[fixedcode] gradient reduction overlaps the backward pass: {buckets} buckets")


def _log_end(result: PretrainResult) -> None:
    if result.exit_reason:
        log(f"[fixedcode] {result.exit_reason}: exiting at iteration {result.iteration}")
        return
    summary = f"[fixedcode] training done: iteration {result.iteration}"
    if result.train_loss is not None:
        summary += f" | final train loss {result.train_loss:.6f}"
    if result.valid_loss is not None:
        summary += f" | final validation loss {result.valid_loss:.6f}"
    log(summary)
