"""The text of the training and validation log lines, as Megatron-LM core_v0.16.1 prints
them (``megatron/training/training.py``: ``training_log``, ``evaluate_and_print_results``), so
that a scraper written for Megatron-LM reads ours: every field both have comes first, under
Megatron-LM's name and in its format, each ``' name: value |'``; ours (tokens/s, MFU, memory,
the fp16 overflow skips so far) follow in the same form. Pure formatting, no torch: the
values come from :class:`~megatron_ext.metrics.logger.MetricsLogger`.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from typing import Optional


@dataclasses.dataclass(frozen=True)
class TrainingFields:
    """One log interval's values (means over the interval unless said)."""
    iteration: int
    train_iters: int
    consumed_samples: int
    step_time_s: float
    tflops_per_gpu: float
    learning_rate: float
    global_batch_size: int
    loss: Optional[float]  # None when no update of the interval had a finite loss
    loss_scale: float  # 1.0 unless --fp16, as in Megatron-LM
    grad_norm: Optional[float]
    num_zeros: Optional[int]
    params_norm: Optional[float]
    skipped_iterations: int  # updates skipped in this interval, for any reason
    nan_iterations: int  # iterations of this interval whose loss was NaN or infinite
    tokens_per_s: float
    mfu: Optional[float]
    mfu_fp8: Optional[float]
    memory_gib: float
    reserved_gib: Optional[float]
    overflow_skipped_total: Optional[int]  # fp16 only: the loss scaler's skips so far


def _timestamp(now: Optional[datetime.datetime]) -> str:
    return f" [{(now or datetime.datetime.now()).strftime('%Y-%m-%d %H:%M:%S.%f')}]"


def training_line(f: TrainingFields, now: Optional[datetime.datetime] = None) -> str:
    """Megatron-LM's ``training_log`` line, then ours. A missing loss is left out, as
    Megatron-LM leaves out a loss whose mean is not positive."""
    s = _timestamp(now)
    s += " iteration {:8d}/{:8d} |".format(f.iteration, f.train_iters)
    s += " consumed samples: {:12d} |".format(f.consumed_samples)
    s += " elapsed time per iteration (ms): {:.1f} |".format(f.step_time_s * 1000.0)
    s += f" throughput per GPU (TFLOP/s/GPU): {f.tflops_per_gpu:.1f} |"
    s += f" learning rate: {f.learning_rate:.6E} |"
    s += f" global batch size: {f.global_batch_size:5d} |"
    if f.loss is not None and math.isfinite(f.loss):
        s += " lm loss: {:.6E} |".format(f.loss)
    s += f" loss scale: {f.loss_scale:.1f} |"
    if f.grad_norm is not None:
        s += f" grad norm: {f.grad_norm:.3f} |"
    if f.num_zeros is not None:
        s += f" num zeros: {f.num_zeros} |"
    if f.params_norm is not None:
        s += f" params norm: {f.params_norm:.3f} |"
    s += " number of skipped iterations: {:3d} |".format(f.skipped_iterations)
    s += " number of nan iterations: {:3d} |".format(f.nan_iterations)
    s += f" tokens/s: {f.tokens_per_s:,.0f} |"
    if f.mfu is not None:
        s += f" MFU: {100 * f.mfu:.1f}% |"
    if f.mfu_fp8 is not None:
        s += f" MFU of FP8 peak: {100 * f.mfu_fp8:.1f}% |"
    s += f" mem: {f.memory_gib:.2f} GiB" + (
        "" if f.reserved_gib is None else f" (reserved {f.reserved_gib:.2f} GiB)") + " |"
    if f.overflow_skipped_total is not None:
        s += f" overflow skipped: {f.overflow_skipped_total} |"
    return s


def validation_lines(iteration: int, loss: float, where: str = "") -> list[str]:
    """Megatron-LM's ``evaluate_and_print_results`` for the loss ``lm loss``: the line
    between two rules of dashes (the perplexity of a loss above 20 is that of 20); ``where``
    follows the iteration at the end of training, `` on validation set`` or `` on test set``."""
    ppl = math.exp(min(20, loss))
    line = f" validation loss at iteration {iteration}{where} | "
    line += "lm loss value: {:.6E} | ".format(loss)
    line += "lm loss PPL: {:.6E} | ".format(ppl)
    rule = "-" * (len(line) + 1)
    return [rule, line, rule]
