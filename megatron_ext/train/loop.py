"""The training loop, as torchtitan's ``train()`` reads: :func:`pretrain` takes the three
callables users know from Megatron-LM's pretrain_gpt.py (model provider, forward step,
datasets provider), sets the run up (:func:`~megatron_ext.train.setup.set_up`), and steps
(:func:`~megatron_ext.train.step.train_step`) until ``--train-iters`` or an exit condition.
Each policy around the step belongs to an object: when to validate
(:class:`~megatron_ext.train.validation.Validator`), when to save
(:class:`~megatron_ext.checkpoint.saving.Checkpointer`), when to stop
(:class:`~megatron_ext.train.exit_conditions.ExitConditions`), what to log
(:class:`~megatron_ext.metrics.logger.MetricsLogger`), how many skipped updates to bear
(:class:`~megatron_ext.train.step.SkippedUpdates`, where they are counted), when to collect
garbage (:class:`~megatron_ext.train.gc_policy.GarbageCollection`); each takes its own part of
the run's config (:class:`~megatron_ext.config.run_config.RunConfig`, as set-up settled it).
What
must be closed (the lease rank 0 holds on ``--save``, :mod:`~megatron_ext.checkpoint.lease`,
from before the run writes there; the metrics sinks, the collector, the profiler, the
progress bar) joins one teardown as it is made, closed in reverse order however the loop
ends; a non-finite stop, which every rank reaches together, first completes a background
save. It returns a :class:`PretrainResult`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import time
from typing import Callable, Optional

import torch
from megatron.core.distributed import DistributedDataParallel
from tqdm import tqdm

from ..checkpoint.layout import TrainState
from ..checkpoint.lease import take_save_lease
from ..checkpoint.saving import Checkpointer, start_save
from ..config.derived import Derived, run_record
from ..config.megatron_defaults import defaults_line, query_groups_line
from ..config.run_config import RunConfig
from ..datasets.gpt_datasets import samples_per_split, test_split
from ..metrics.logger import MetricsLogger
from ..metrics.norms import NormReporter
from ..metrics.sinks import agree_wandb_run_id
from ..model.memory import footprint
from ..runtime.helper_processes import tie_forked_children
from ..runtime.initialize import initialize_distributed, resolve_device, world_size_from_env
from ..runtime.log import is_logging_rank, log
from .compile_layers import CompileTime
from .exit_conditions import ExitConditions
from .gc_policy import GarbageCollection
from .profiling import StepProfiler
from .setup import set_up
from .spikes import SpikeDetector
from .step import NonFiniteLossError, SkippedUpdates, gathered_parameters, train_step
from .validation import Batches, Validator


def _diagnostics(config: RunConfig, norms: Optional[NormReporter], grad_norms: dict,
                 num_zeros: Optional[float], optimizer, state: TrainState,
                 ddp: DistributedDataParallel) -> dict:
    """The optional scalars of a log iteration (``--log-params-norm``,
    ``--log-num-zeros-in-grad``, ``--log-layer-norms``; under ``--fp16`` the loss scale and
    the overflow skips so far), measured after the update."""
    out, logging = {}, config.logging
    if config.model.fp16:
        out["loss-scale"] = optimizer.get_loss_scale().item()
        out["overflow-skipped-iterations"] = state.overflow_skipped
    if logging.log_params_norm:
        with gathered_parameters(config.parallel, ddp):
            out["params-norm"] = norms.params_norm()
    if logging.log_num_zeros_in_grad and num_zeros is not None:
        out["num-zeros"] = int(num_zeros)
    if logging.log_layer_norms:
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
    test_loss: Optional[float] = None  # the test split's, at the end of training


def pretrain(config: RunConfig, model_provider: Callable, forward_step: Callable,
             datasets_provider: Callable) -> PretrainResult:
    """Run a whole training job of the run's ``config`` (built once from the flags); after
    the set-up the loop reads the config as set-up settled it (``setup.config``). Every
    process it forks dies with it
    (:func:`~megatron_ext.runtime.helper_processes.tie_forked_children`).

    With ``--exit-signal-handler``, an exit signal during start-up ends the job at the end
    of the current phase (checkpoint load, dataset building) with nothing saved; during
    validation, after the current batch, saving a checkpoint that asks the resumed run to
    validate first; during a training step, after the step, saving."""
    start_time = time.time()
    tie_forked_children()
    device = resolve_device(config.training.device)
    parallel = config.parallel
    parallel.check_world(world_size_from_env(), f"world size {world_size_from_env()}")
    initialize_distributed(device, parallel.tensor_model_parallel_size,
                           parallel.pipeline_model_parallel_size, config.training.seed)
    exits = ExitConditions(config.checkpoint, device, start_time)
    setup = set_up(config, device, model_provider)
    config, derived, state = setup.config, setup.derived, setup.state
    reason = exits.signalled()
    if reason:
        return _stopped(state, reason, "during start-up, before training (nothing new to save)")
    train_iter, valid_dataset, test_dataset = datasets_provider(
        config, setup.tokenizer, samples_per_split(config, derived), state.consumed_train_samples)
    reason = exits.signalled()
    if reason:
        return _stopped(state, reason, "while building the datasets (nothing new to save)")

    wandb_run_id = agree_wandb_run_id(config.logging,
                                      setup.common["wandb_run_id"] if setup.own else None)
    with contextlib.ExitStack() as teardown:
        try:
            lease = take_save_lease(config.checkpoint.save,  # before --save is written
                                    config.checkpoint.save_lease_timeout)
            if lease is not None:
                teardown.enter_context(contextlib.closing(lease))
            metrics = teardown.enter_context(contextlib.closing(MetricsLogger(
                config.logging, config.model, derived, setup.model, is_logging_rank(),
                state.iteration, wandb_run_id, device=device, save=config.checkpoint.save,
                record=run_record(config, derived))))
            gathered = functools.partial(gathered_parameters, config.parallel, setup.ddp)
            collector = teardown.enter_context(contextlib.closing(
                GarbageCollection(config.training)))
            batches = Batches(config.logging.eval_iters, derived.num_microbatches,
                              config.training.micro_batch_size, config.model.seq_length,
                              config.data.num_workers)
            validator = Validator(config.logging, batches, derived.train_iters, forward_step,
                                  valid_dataset, test_dataset, setup.ddp, exits, metrics,
                                  collector, gathered=gathered)
            checkpointer = Checkpointer(
                config.checkpoint,
                lambda at: start_save(config, derived, setup.model, setup.optimizer,
                                      setup.scheduler, at, setup.code, wandb_run_id),
                last_saved=state.iteration if setup.resume_path else None,
                gathered=gathered, lease=lease)
            norms = (NormReporter(setup.model) if config.logging.log_params_norm
                     or config.logging.log_layer_norms else None)
            profiler = teardown.enter_context(contextlib.closing(
                StepProfiler(config.logging, device, torch.distributed.get_rank())))
            _log_start(config, derived, setup.ddp, metrics.num_params)
            bar = teardown.enter_context(contextlib.closing(tqdm(
                total=derived.train_iters, initial=state.iteration, desc="train", unit="it",
                disable=not (sys.stderr.isatty() and metrics.is_logging_rank))))
            loss, reason = _train(setup, forward_step, train_iter, exits, metrics,
                                  validator, checkpointer, norms, profiler, collector, bar)
            reason = reason or validator.test(state)
        except NonFiniteLossError:  # every rank stops here together: a background save completes
            checkpointer.finish_pending()
            raise
    result = PretrainResult(state.iteration, loss, validator.last_loss, reason,
                            validator.test_loss)
    _log_end(result)
    return result


def _train(setup, forward_step, train_iter, exits: ExitConditions,
           metrics: MetricsLogger, validator: Validator, checkpointer: Checkpointer,
           norms: Optional[NormReporter], profiler: StepProfiler, collector: GarbageCollection,
           bar) -> tuple[Optional[float], Optional[str]]:
    """The steps from ``setup.state`` to ``--train-iters`` or an exit condition, then the
    final save; ``(the last update's loss, why it stopped early or None)``."""
    config, derived, state = setup.config, setup.derived, setup.state
    training = config.training
    optimizer, scheduler, ddp = setup.optimizer, setup.scheduler, setup.ddp
    skipped = SkippedUpdates(state, training.max_nonfinite_steps)
    spikes = (SpikeDetector(training.spiky_loss_factor, training.spiky_loss_samples)
              if training.check_for_spiky_loss else None)
    loss = reason = None
    if state.validation_pending:  # a signal stopped it before the checkpoint was saved
        reason = validator.validate(state)
    ramp = derived.batch_ramp()
    compile_time = CompileTime()
    collector.start()
    while state.iteration < derived.train_iters and not reason:
        profiler.step_starts(state.iteration)
        step_start = time.time()
        log_now = metrics.prints_line(state.iteration + 1)
        batch_size = ramp.batch_size(state.consumed_train_samples)
        step = train_step(
            config, ramp.num_microbatches(state.consumed_train_samples), forward_step,
            train_iter, ddp, optimizer, scheduler,
            (lambda: norms.grad_norms(optimizer.get_loss_scale().item()))
            if log_now and config.logging.log_layer_norms else None, spikes and spikes.check)
        state.iteration += 1
        state.consumed_train_samples += batch_size
        profiler.step_ended(state.iteration)
        bar.update(1)
        skipped.record(state.iteration, step.skip)
        compile_time.report(f"iteration {state.iteration}")
        if step.skip is None:
            loss = step.loss
        metrics.step(state.iteration, step.loss, step.grad_norm,
                     scheduler.get_lr(optimizer.param_groups[0]), time.time() - step_start,
                     step.skip is not None, state.nonfinite_skipped,
                     _diagnostics(config, norms, step.norms, step.num_zeros, optimizer, state,
                                  ddp) if log_now else None,
                     skips=skipped.interval, consumed_samples=state.consumed_train_samples,
                     batch_size=batch_size)
        if metrics.is_log_iteration(state.iteration):
            skipped.start_interval()
        if validator.should_validate(state.iteration):
            reason = validator.validate(state)
            compile_time.report(f"the validation after iteration {state.iteration}")
        if step.spike:
            log(spikes.log_line(state.iteration, training.spiky_loss_action))
            if training.spiky_loss_action == "stop":
                reason = reason or (f"spiky loss at iteration {state.iteration} "
                                    f"(--spiky-loss-action stop)")
        checkpointer.save(state)
        collector.after_step(state.iteration)
        if not reason and state.iteration < derived.train_iters:
            reason = exits.check(state.iteration)
    checkpointer.save(state, final=True)
    return loss, reason


def _stopped(state: TrainState, reason: str, when: str) -> PretrainResult:
    log(f"[fixedcode] {reason} {when}: exiting at iteration {state.iteration}")
    return PretrainResult(state.iteration, exit_reason=reason)


def _log_start(config: RunConfig, derived: Derived, ddp, num_params: int) -> None:
    device, parallel = config.training.device, config.parallel
    log(f"[fixedcode] {config.model.arm_description()} | {num_params:,} trainable parameters "
        f"| {device} x {derived.world_size} (tp {parallel.tensor_model_parallel_size}, "
        f"pp {parallel.pipeline_model_parallel_size}, dp {derived.data_parallel_size}) "
        f"| {derived.num_microbatches} micro-batches per step")
    for line in (defaults_line(config), query_groups_line(config.model)):
        if line:
            log(line)
    # Megatron-LM's line, for the most loaded pipeline stage (megatron_ext/model/memory.py)
    log(footprint(config, derived.padded_vocab_size, derived.data_parallel_size,
                  derived.num_microbatches, device).megatron_line())
    unread = test_split(config)[1]
    if unread:
        log(f"[fixedcode] the test split is not evaluated at the end of training: {unread}")
    if parallel.overlap_grad_reduce:
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
    if result.test_loss is not None:
        summary += f" | test loss {result.test_loss:.6f}"
    log(summary)
