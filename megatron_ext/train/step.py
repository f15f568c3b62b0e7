"""One training step and the count of skipped ones: the global batch's forward and backward
passes through Megatron-Core's schedule, the agreed skip of a non-finite update, the optimizer
and scheduler step (:func:`train_step` -> :class:`StepResult`), and :class:`SkippedUpdates`,
where every skipped update is counted, once, and which ends the run after
``--max-nonfinite-steps`` failures in a row."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Callable, Optional

import torch
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel
from megatron.core.pipeline_parallel import get_forward_backward_func

from ..checkpoint.layout import TrainState
from ..config.parallel_config import ParallelConfig
from ..config.run_config import RunConfig
from ..metrics.logger import IntervalSkips
from ..runtime.errors import TrainingError
from ..runtime.log import log
from ..runtime.reductions import max_over_ranks, reduce_losses


class NonFiniteLossError(TrainingError):
    """``--max-nonfinite-steps`` updates in a row failed; the last checkpoint is intact. Exit
    status 3 (the Slurm script does not requeue it)."""
    exit_code = 3


def _nonfinite_grads(ddp: DistributedDataParallel) -> torch.Tensor:
    """Whether this rank holds a NaN or infinite gradient: one norm per gradient buffer, the
    measure of megatron-core's ``check_for_nan_in_grad`` (per bucket). Read after the
    data-parallel reduction, over the whole buffer: under the distributed optimizer a rank's
    buffer then holds its reduced shard and, elsewhere, its own unreduced gradients, so every
    NaN is seen by some rank."""
    norms = [buffer.grad_data.norm() for buffer in ddp.buffers + ddp.expert_parallel_buffers]
    return ~torch.isfinite(torch.stack(norms)).all()


# Why a step's update was skipped. The first three are failures (SkippedUpdates' in a row);
# an fp16 overflow above the minimum loss scale is the dynamic loss scaler at work (it
# lowers the scale, the next step retries): from its initial 2^32 the scale comes down in
# the first ~20 steps of every fp16 run.
NONFINITE_LOSS = "non-finite loss"
NONFINITE_GRADS = "non-finite gradients with a finite loss"
OVERFLOW_AT_MIN_SCALE = "fp16 gradients overflow at the minimum loss scale"
OVERFLOW = "fp16 gradients overflow; loss scale lowered"
FAILURES = (NONFINITE_LOSS, NONFINITE_GRADS, OVERFLOW_AT_MIN_SCALE)
SPIKY_LOSS = "spiky loss"  # --check-for-spiky-loss with --spiky-loss-action skip or stop


@dataclasses.dataclass
class StepResult:
    loss: Optional[float]  # None on ranks that are not the last pipeline stage
    grad_norm: Optional[float] = None
    num_zeros: Optional[float] = None
    skip: Optional[str] = None  # why the update was skipped (NONFINITE_LOSS, ...), or None
    norms: dict = dataclasses.field(default_factory=dict)  # grad_norms() of train_step
    spike: bool = False  # the loss is a spike (--check-for-spiky-loss), on every rank


class SkippedUpdates:
    """The one count of skipped updates. Each step's skip (None, or why) is recorded once,
    into the run's totals in the train state (``nonfinite_skipped``: the failures,
    :data:`FAILURES`; ``overflow_skipped``: fp16 overflows; both saved with each checkpoint),
    the current log interval's (:attr:`interval`, started anew by :meth:`start_interval`),
    and the failures in a row: after ``--max-nonfinite-steps`` of them, training stops with
    :class:`NonFiniteLossError` (the last checkpoint is left as it was: no failing update
    ever reached the weights). fp16 overflows above the minimum loss scale and spiky losses
    neither count as failures nor break a row."""

    def __init__(self, state: TrainState, limit: int):
        self.state, self.limit = state, limit
        self.in_a_row = 0
        self.interval = IntervalSkips()

    def start_interval(self) -> None:
        self.interval = IntervalSkips()

    def record(self, iteration: int, skip: Optional[str]) -> None:
        self.state.nonfinite_skipped += skip in FAILURES
        self.state.overflow_skipped += skip == OVERFLOW
        self.interval = IntervalSkips(self.interval.skipped + (skip is not None),
                                      self.interval.nonfinite_losses + (skip == NONFINITE_LOSS))
        if skip in (OVERFLOW, SPIKY_LOSS):  # neither a failure nor the end of a row
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


def train_step(config: RunConfig, num_microbatches: int, forward_step, train_iter, ddp,
               optimizer, scheduler, grad_norms: Optional[Callable[[], dict]] = None,
               spike: Optional[Callable[[Optional[float]], Optional[str]]] = None
               ) -> StepResult:
    """One global batch of the run of ``config``; ``StepResult.norms`` is ``grad_norms()`` measured between the
    backward pass and the update; ``spike(loss)`` (``SpikeDetector.check``): whether the
    loss is a spike, agreed over the ranks with the non-finite checks; with
    ``--spiky-loss-action skip`` or ``stop`` its update is skipped.

    A non-finite loss, or a NaN/infinite gradient with a finite loss, skips the update on
    every rank (agreed in one all-reduce). Megatron-LM instead raises at once on the rank
    that sees a NaN gradient (DDP's ``check_for_nan_in_grad``); skipping keeps one policy for
    both, ``--max-nonfinite-steps``, and all ranks take the same decision. Under fp16 the
    gradients are left to the dynamic loss scaler, whose overflows are expected (Megatron-LM
    turns its check off there too)."""
    fp16, training = config.model.fp16, config.training
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    losses = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=train_iter, model=[ddp],
        num_microbatches=num_microbatches, seq_length=config.model.seq_length,
        micro_batch_size=training.micro_batch_size, forward_only=False)
    loss = reduce_losses(losses)
    norms = grad_norms() if grad_norms else {}
    bad_loss, bad_grads, spiky = max_over_ranks(
        [loss is not None and not math.isfinite(loss), not fp16 and _nonfinite_grads(ddp),
         spike is not None and spike(loss) is not None], training.device)
    if bad_loss or bad_grads:
        return StepResult(loss, skip=NONFINITE_LOSS if bad_loss else NONFINITE_GRADS,
                          norms=norms)
    if spiky and training.spiky_loss_action != "log":
        return StepResult(loss, skip=SPIKY_LOSS, norms=norms, spike=True)
    scale = optimizer.get_loss_scale().item() if fp16 else None
    updated, grad_norm, num_zeros = optimizer.step()
    if not updated:  # only fp16's loss scaler declines a step
        return StepResult(loss, skip=OVERFLOW_AT_MIN_SCALE
                          if scale <= optimizer.config.min_loss_scale else OVERFLOW, norms=norms)
    # As Megatron-LM: the scheduler counts samples (config/schedule.py), this update's.
    scheduler.step(increment=num_microbatches * training.micro_batch_size
                   * parallel_state.get_data_parallel_world_size())
    return StepResult(loss, grad_norm, num_zeros, None, norms, bool(spiky))


@contextlib.contextmanager
def gathered_parameters(parallel: ParallelConfig, ddp: DistributedDataParallel):
    """Whole, current parameters in the model for what reads them between steps (validation,
    a checkpoint, the parameter norm). Under ``--overlap-param-gather`` the distributed
    optimizer's update reaches the other ranks' copies only in the next forward pass's
    pre-hooks: they are gathered now and the hooks stay off meanwhile, as Megatron-LM does."""
    if not parallel.overlap_param_gather:
        yield
        return
    ddp.disable_forward_pre_hook(param_sync=True)
    try:
        yield
    finally:
        ddp.enable_forward_pre_hook()


