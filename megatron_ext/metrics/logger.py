"""Training metrics: one line per ``--log-interval`` (and at the run's first and last
iteration) on stdout, in Megatron-LM's format (:mod:`megatron_ext.metrics.log_line`), and the
same values of each interval, with validation and test loss and perplexity, to the run's
metrics file (``metrics.jsonl``), TensorBoard and wandb (:mod:`megatron_ext.metrics.sinks`).

Throughput is tokens per second of the whole job, and model TFLOP/s per device, with the
model FLOPs Megatron-LM 0.16.1 counts (:func:`~megatron_ext.metrics.flops.flops_per_token`). MFU
(GPU only) is those FLOP/s over the device's dense bf16 peak, for bf16 and FP8 runs alike, so that
they compare; an FP8 run also shows its MFU against the FP8 peak.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Optional

import psutil
import torch

from megatron.core import parallel_state
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared

from ..config.derived import Derived
from ..config.run_config import LoggingConfig, ModelConfig
from ..runtime.log import log
from . import sinks
from .flops import flops_per_token, peak_flops
from .log_line import TrainingFields, training_line, validation_lines


# What TensorBoard and wandb take per iteration (each --tensorboard-log-interval), the
# iteration's own value, as Megatron-LM's training_log writes them; not again per interval.
PER_ITERATION = ("lm loss", "learning-rate", "batch-size", "grad-norm")


def parameters_counted_once(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """``(name, parameter)`` for this rank's trainable parameters that, over the model-parallel
    group, hold every parameter of the whole model once: one duplicated on every
    tensor-parallel rank (a norm weight) only on the first, and the last pipeline stage's copy
    of a tied input table (Megatron's ``shared``) nowhere."""
    return [(name, p) for name, p in model.named_parameters()
            if p.requires_grad and param_is_not_tensor_parallel_duplicate(p)
            and param_is_not_shared(p)]


def trainable_parameters(model: torch.nn.Module, device: str) -> int:
    """Trainable parameters of the whole model, summed over tensor and pipeline ranks."""
    count = sum(p.numel() for _, p in parameters_counted_once(model))
    t = torch.tensor([count], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t, group=parallel_state.get_model_parallel_group())
    return int(t.item())


def reserved_gib(device: str) -> Optional[float]:
    """Peak memory the GPU's caching allocator reserved (None on CPU)."""
    return torch.cuda.max_memory_reserved() / 2**30 if device == "cuda" else None


def memory_gib(device: str) -> float:
    """Peak allocated GPU memory, or this process's resident memory on CPU."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return psutil.Process().memory_info().rss / 2**30


def metrics_path(config: LoggingConfig, save: Optional[str]) -> Optional[str]:
    """The run's metrics file: ``--metrics-file``, else ``metrics.jsonl`` in ``save``
    (``--save``)."""
    if config.metrics_file:
        return config.metrics_file
    return os.path.join(save, "metrics.jsonl") if save else None


@dataclasses.dataclass(frozen=True)
class IntervalSkips:
    """The updates skipped in a log interval, as the log line shows them: for any reason,
    and for a non-finite loss (counted by ``train.step.SkippedUpdates``)."""
    skipped: int = 0
    nonfinite_losses: int = 0


class MetricsLogger:
    """Turns each step's values into the log line and the scalars every sink receives
    (:mod:`megatron_ext.metrics.sinks`). Sinks exist on the logging rank only."""

    def __init__(self, config: LoggingConfig, model_config: ModelConfig, derived: Derived,
                 model: torch.nn.Module, is_logging_rank: bool, resumed_iteration: int,
                 wandb_run_id: Optional[str], *, device: str, save: Optional[str],
                 record: dict):
        """``model_config``: the shape the FLOPs are counted for; ``device``: the run's;
        ``save``: its ``--save`` (where the metrics file and wandb's files go by default);
        ``record``: its arguments as a checkpoint stores them (wandb's config)."""
        self.config, self.derived, self.device = config, derived, device
        self.seq_length = model_config.seq_length
        self.is_logging_rank = is_logging_rank
        self.num_params = trainable_parameters(model, device)
        self.flops_per_token = flops_per_token(model_config, derived.padded_vocab_size)
        self.peak = self.fp8_peak = None
        if device == "cuda":
            name = torch.cuda.get_device_name()
            self.peak = peak_flops(name, fp8=False)
            if model_config.fp8_format:
                self.fp8_peak = peak_flops(name, fp8=True)
            log(f"[fixedcode] MFU against the dense bf16 peak of {name}: "
                f"{self.peak / 1e12:,.0f} TFLOP/s per GPU"
                + (f" (FP8 peak {self.fp8_peak / 1e12:,.0f}, shown beside it)"
                   if self.fp8_peak else "") if self.peak else
                f"[fixedcode] MFU not shown: no dense bf16 peak known for {name}")
        self.sinks = []
        if is_logging_rank:
            if config.tensorboard_dir:
                self.sinks.append(sinks.TensorBoardSink(config.tensorboard_dir))
            if metrics_path(config, save):
                self.sinks.append(sinks.JsonlSink(metrics_path(config, save),
                                                  resumed_iteration))
            if config.wandb_project:
                self.sinks.append(sinks.WandbSink(config, save, record, wandb_run_id))
        self.consumed_samples = resumed_iteration * derived.global_batch_size
        self.first_iteration = resumed_iteration + 1
        self._reset()

    def _reset(self) -> None:
        self.losses, self.times, self.batch_sizes = [], [], []

    def _write(self, kind: str, iteration: int, scalars: dict) -> None:
        """``kind`` "step" goes to the per-iteration sinks only, which take a "train" record
        without :data:`PER_ITERATION`."""
        scalars = {k: v for k, v in scalars.items() if v is not None}
        where = {"iteration": iteration,
                 "consumed_samples": self.consumed_samples,
                 "tokens": self.consumed_samples * self.seq_length,
                 "time": time.time()}
        for sink in self.sinks:
            if sink.per_iteration and kind == "train":
                sink.write(kind, iteration, {k: v for k, v in scalars.items()
                                             if k not in PER_ITERATION}, where)
            elif sink.per_iteration or kind != "step":
                sink.write(kind, iteration, scalars, where)

    def is_log_iteration(self, iteration: int) -> bool:
        """Whether the interval ends at ``iteration``: every ``--log-interval`` and the last."""
        return iteration % self.config.log_interval == 0 or iteration == self.derived.train_iters

    def prints_line(self, iteration: int) -> bool:
        """Whether ``iteration`` prints the training line: each log iteration, and the run's
        first, as Megatron-LM's (start-up cost in sight; its interval goes on)."""
        return self.is_log_iteration(iteration) or iteration == self.first_iteration

    def step(self, iteration: int, loss: Optional[float], grad_norm: Optional[float], lr: float,
             step_time: float, skipped: bool, skipped_total: int,
             diagnostics: Optional[dict] = None, *, skips: IntervalSkips,
             consumed_samples: Optional[int] = None, batch_size: Optional[int] = None) -> None:
        """Record one step (``skipped``: its update was skipped; ``skipped_total``: updates
        skipped for a failure so far; ``skips``: those of the interval, this step's
        included); at a log iteration, log the interval's mean loss, step time and
        throughput, and this step's grad norm and ``diagnostics`` (scalars measured at it:
        norms, zeros in the gradient), as Megatron-LM's line does.
        ``consumed_samples`` after it and its ``batch_size`` (default: full global batches;
        they differ under ``--rampup-batch-size``)."""
        batch_size = batch_size or self.derived.global_batch_size
        self.consumed_samples = (iteration * self.derived.global_batch_size
                                 if consumed_samples is None else consumed_samples)
        self.batch_sizes.append(batch_size)
        if loss is not None and math.isfinite(loss):
            self.losses.append(loss)
        self.times.append(step_time)
        if iteration % self.config.tensorboard_log_interval == 0:
            finite = loss is not None and math.isfinite(loss) and not skipped
            self._write("step", iteration, {
                "lm loss": loss if finite else None, "learning-rate": lr,
                "batch-size": batch_size,
                "grad-norm": None if grad_norm is None else float(grad_norm)})
        if not self.prints_line(iteration):
            return
        d = self.derived
        step_time = sum(self.times) / len(self.times)
        tokens_per_s = sum(self.batch_sizes) / len(self.batch_sizes) * self.seq_length / step_time
        loss = sum(self.losses) / len(self.losses) if self.losses else None
        grad_norm = None if grad_norm is None else float(grad_norm)
        mem, reserved = memory_gib(self.device), reserved_gib(self.device)
        flops_per_device = self.flops_per_token * tokens_per_s / d.world_size
        mfu = flops_per_device / self.peak if self.peak else None
        mfu_fp8 = flops_per_device / self.fp8_peak if self.fp8_peak else None
        diagnostics = diagnostics or {}
        fields = TrainingFields(
            iteration=iteration, train_iters=d.train_iters,
            consumed_samples=self.consumed_samples, step_time_s=step_time,
            tflops_per_gpu=flops_per_device / 1e12, learning_rate=lr,
            global_batch_size=batch_size, loss=loss,
            loss_scale=diagnostics.get("loss-scale", 1.0), grad_norm=grad_norm,
            num_zeros=diagnostics.get("num-zeros"), params_norm=diagnostics.get("params-norm"),
            skipped_iterations=skips.skipped, nan_iterations=skips.nonfinite_losses,
            tokens_per_s=tokens_per_s, mfu=mfu, mfu_fp8=mfu_fp8, memory_gib=mem,
            reserved_gib=reserved,
            overflow_skipped_total=diagnostics.get("overflow-skipped-iterations"))
        if self.is_logging_rank:
            print(training_line(fields), flush=True)
            layers = {k: v for k, v in diagnostics.items() if "/" in k}
            if layers:
                print("  norms: " + ", ".join(f"{k} {v:.4g}" for k, v in layers.items()),
                      flush=True)
        if not self.is_log_iteration(iteration):
            return
        self._write("train", iteration, {
            "lm loss": loss, "learning-rate": lr, "grad-norm": grad_norm,
            "tokens-per-second": tokens_per_s, "step-time-ms": step_time * 1000,
            "tflops-per-gpu": flops_per_device / 1e12, "mfu": mfu, "mfu-fp8-peak": mfu_fp8,
            "memory-gib": mem, "memory-reserved-gib": reserved,
            "skipped-iterations": skipped_total, **diagnostics})
        self._reset()

    def validation(self, iteration: int, loss: Optional[float], *, periodic: bool = True,
                   final: bool = False) -> None:
        """Log a validation loss: Megatron-LM's line of a ``--eval-interval`` validation
        (``periodic``), and of the one at the end of training (``final``: "... on
        validation set"); the sinks get it once."""
        if loss is None:
            return
        ppl = math.exp(min(loss, 20.0))
        if self.is_logging_rank:
            lines = (validation_lines(iteration, loss) if periodic or not final else []) + (
                validation_lines(iteration, loss, " on validation set") if final else [])
            print("\n".join(lines), flush=True)
        self._write("valid", iteration, {"lm loss validation": loss,
                                         "lm loss validation ppl": ppl})

    def test(self, iteration: int, loss: Optional[float]) -> None:
        """Log the test loss at the end of training, as Megatron-LM's "... on test set"."""
        if loss is None:
            return
        if self.is_logging_rank:
            print("\n".join(validation_lines(iteration, loss, " on test set")), flush=True)
        self._write("test", iteration, {"lm loss test": loss,
                                        "lm loss test ppl": math.exp(min(loss, 20.0))})

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
