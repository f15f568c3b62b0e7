"""The learning-rate schedule and the global batch size in samples, as Megatron-LM counts them
(``get_optimizer_param_scheduler`` and ``update_train_iters`` in its
``megatron/training/training.py``, and the batch ramp of megatron.core before 0.18.0): the
scheduler steps by the samples of each update, so an iteration-based schedule (``--lr-warmup-iters``, ``--lr-decay-iters``, ``--lr-warmup-fraction``) and a
sample-based one (``--lr-warmup-samples``, ``--lr-decay-samples``) mean the same thing, and
``--rampup-batch-size`` grows the batch without moving the schedule (megatron-core 0.18.0
removed the ramp: there the flag is refused). No torch (but for a ramp's check): the
arithmetic (:func:`scheduler_steps`, :class:`BatchRamp`, :func:`ramped_train_iters`; the
flags' own checks are ``run_config.TrainingConfig.validate``'s). Its place: beside
``derived.py``, which takes the number of iterations from here."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..runtime.errors import FlagError


@dataclasses.dataclass(frozen=True)
class SchedulerSteps:
    """``OptimizerParamScheduler``'s lengths, in samples."""
    warmup: float
    decay: int
    wsd_decay: Optional[int]
    wd_incr: int


def scheduler_steps(schedule: dict, train_samples: Optional[int], train_iters: int,
                    global_batch_size: int) -> SchedulerSteps:
    """The scheduler's lengths in samples from the schedule flags (``schedule``: their values
    by name, as the run keeps them). ``train_samples``: ``--train-samples``, or None for an
    iteration-based run, whose lengths are iterations x ``global_batch_size`` (Megatron-LM's
    arithmetic). In a sample-based run the iteration flags count full global batches."""
    batch = global_batch_size
    if train_samples is None:
        decay = (schedule["lr_decay_iters"] or train_iters) * batch
        wd_incr = train_iters * batch
    else:
        decay = (schedule["lr_decay_samples"] if schedule["lr_decay_samples"] is not None
                 else schedule["lr_decay_iters"] * batch if schedule["lr_decay_iters"]
                 else train_samples)
        wd_incr = train_samples
    if schedule["lr_warmup_fraction"] is not None:
        warmup = schedule["lr_warmup_fraction"] * decay
    else:
        warmup = schedule["lr_warmup_samples"] or schedule["lr_warmup_iters"] * batch
    wsd = schedule["lr_wsd_decay_samples"]
    if wsd is None and schedule["lr_wsd_decay_iters"] is not None:
        wsd = schedule["lr_wsd_decay_iters"] * batch
    return SchedulerSteps(warmup, decay, wsd, wd_incr)


class BatchRamp:
    """The global batch size of each update: ``--global-batch-size``, or under
    ``--rampup-batch-size START INCREMENT SAMPLES`` Megatron-Core's ramp: START, growing by
    INCREMENT every ``SAMPLES / ((global - START) / INCREMENT)`` consumed samples, then the
    full batch once SAMPLES are consumed. A function of the consumed samples only, so a run
    resumed mid-ramp takes the batches of the uninterrupted one."""

    def __init__(self, global_batch_size: int, micro_batch_times_dp: int,
                 rampup: Optional[list[int]] = None):
        self.global_batch_size, self.per_micro_batch = global_batch_size, micro_batch_times_dp
        self.rampup = rampup
        if rampup is None:
            return
        start, increment, samples = rampup  # each at least 1 (the flag's type)
        from ..runtime.megatron_compat import has_batch_ramp, installed_release
        if not has_batch_ramp():  # imports megatron-core: only for a run that asks for a ramp
            raise FlagError(f"--rampup-batch-size {start} {increment} {samples}: the installed "
                            f"megatron-core {installed_release()} has no batch-size ramp "
                            f"(0.18.0 removed it, and Megatron-LM the flag; its "
                            f"--step-batch-size-schedule is not supported here): train with a "
                            f"constant --global-batch-size, or under megatron-core 0.16.1 or "
                            f"0.17.x")
        diff = global_batch_size - start
        if diff < 0 or diff % increment:
            raise FlagError(f"--rampup-batch-size {start} {increment} {samples}: "
                            f"--global-batch-size {global_batch_size} - START must be a "
                            f"non-negative multiple of INCREMENT")
        for name, value in (("START", start), ("INCREMENT", increment)):
            if value % micro_batch_times_dp:
                raise FlagError(f"--rampup-batch-size {name} {value} is not a multiple of "
                                f"--micro-batch-size x data-parallel size "
                                f"{micro_batch_times_dp}")
        self.samples_per_increment = samples / (diff // increment) if diff else None

    def batch_size(self, consumed_samples: int) -> int:
        if self.rampup is None or consumed_samples > self.rampup[2] or \
                self.samples_per_increment is None:
            return self.global_batch_size
        start, increment, _ = self.rampup
        return start + int(consumed_samples / self.samples_per_increment) * increment

    def num_microbatches(self, consumed_samples: int) -> int:
        return self.batch_size(consumed_samples) // self.per_micro_batch


def train_iters_of_samples(train_samples: int, global_batch: int) -> int:
    """Megatron-LM's ``update_train_iters`` without a ramp: the whole global batches of
    ``--train-samples`` (a partial last batch is dropped)."""
    return train_samples // global_batch


def ramped_train_iters(ramp: BatchRamp, train_samples: int) -> int:
    """Megatron-LM's ``update_train_iters`` under a ramp: the updates of the ramp (until
    past its samples or ``train_samples``), then whole full batches; a partial last batch is
    dropped."""
    iterations = consumed = 0
    while consumed <= ramp.rampup[2] and consumed <= train_samples:
        consumed += ramp.batch_size(consumed)
        iterations += 1
    if train_samples > consumed:
        iterations += (train_samples - consumed) // ramp.global_batch_size
    return iterations
