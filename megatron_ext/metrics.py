"""Training metrics: one readable line per ``--log-interval`` (and at the last iteration) on
stdout and the same values as TensorBoard scalars (``--tensorboard-dir``), plus validation
loss and perplexity.

Throughput is tokens per second of the whole job; MFU (GPU only) is model FLOPs per second
over the devices' dense bf16 peak, with model FLOPs per token = 6 x trainable parameters
outside the input table (a lookup costs no FLOPs) + 12 x layers x hidden x sequence
(attention scores), the PaLM-paper estimate.
"""

from __future__ import annotations

import argparse
import math
from typing import Optional

import psutil
import torch

from megatron.core import parallel_state
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared

# Dense bf16 peak TFLOP/s per device, by a substring of torch.cuda.get_device_name().
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}


def parameters_counted_once(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """``(name, parameter)`` for this rank's trainable parameters that, over the model-parallel
    group, hold every parameter of the whole model once: one duplicated on every
    tensor-parallel rank (a norm weight) only on the first, and the last pipeline stage's copy
    of a tied input table (Megatron's ``shared``) nowhere."""
    return [(name, p) for name, p in model.named_parameters()
            if p.requires_grad and param_is_not_tensor_parallel_duplicate(p)
            and param_is_not_shared(p)]


def trainable_parameters(model: torch.nn.Module, device: str) -> tuple[int, int]:
    """``(all, input table)`` trainable parameters of the whole model, summed over tensor and
    pipeline ranks."""
    counts = [0, 0]
    for name, p in parameters_counted_once(model):
        counts[0] += p.numel()
        counts[1] += p.numel() if name.startswith("embedding.") else 0
    t = torch.tensor(counts, dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t, group=parallel_state.get_model_parallel_group())
    return int(t[0].item()), int(t[1].item())


def peak_flops(device: str) -> Optional[float]:
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name()
    return next((v * 1e12 for k, v in PEAK_TFLOPS.items() if k in name), None)


def memory_gib(device: str) -> float:
    """Peak allocated GPU memory, or this process's resident memory on CPU."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return psutil.Process().memory_info().rss / 2**30


class MetricsLogger:
    def __init__(self, args: argparse.Namespace, model: torch.nn.Module, is_logging_rank: bool):
        self.args = args
        self.is_logging_rank = is_logging_rank
        self.num_params, table = trainable_parameters(model, args.device)
        self.flops_per_token = (6 * (self.num_params - table)
                                + 12 * args.num_layers * args.hidden_size * args.seq_length)
        self.peak = peak_flops(args.device)
        self.writer = None
        if args.tensorboard_dir and is_logging_rank:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(log_dir=args.tensorboard_dir, max_queue=100)
        self._reset()

    def _reset(self) -> None:
        self.losses, self.times, self.norms = [], [], []

    def _scalar(self, tag: str, value: float, iteration: int) -> None:
        if self.writer is not None and value is not None:
            self.writer.add_scalar(tag, value, iteration)

    def step(self, iteration: int, loss: Optional[float], grad_norm: Optional[float], lr: float,
             step_time: float, skipped_total: int) -> None:
        if loss is not None and math.isfinite(loss):
            self.losses.append(loss)
        if grad_norm is not None:
            self.norms.append(float(grad_norm))
        self.times.append(step_time)
        if iteration % self.args.log_interval and iteration != self.args.train_iters:
            return
        a = self.args
        step_time = sum(self.times) / len(self.times)
        tokens_per_s = a.global_batch_size * a.seq_length / step_time
        loss = sum(self.losses) / len(self.losses) if self.losses else float("nan")
        grad_norm = sum(self.norms) / len(self.norms) if self.norms else None
        mem = memory_gib(a.device)
        parts = [f"iteration {iteration:>8}/{a.train_iters}",
                 f"consumed samples {iteration * a.global_batch_size:>10}",
                 f"lm loss: {loss:.6E}", f"lr: {lr:.3E}"]
        if grad_norm is not None:
            parts.append(f"grad norm: {grad_norm:.3f}")
        parts += [f"tokens/s: {tokens_per_s:,.0f}", f"step time: {step_time * 1000:.1f} ms"]
        mfu = None
        if self.peak:
            mfu = self.flops_per_token * tokens_per_s / (self.peak * a.world_size)
            parts.append(f"MFU: {100 * mfu:.1f}%")
        parts += [f"mem: {mem:.2f} GiB", f"skipped: {skipped_total}"]
        if self.is_logging_rank:
            print(" | ".join(parts), flush=True)
        for tag, value in (("lm loss", loss if self.losses else None), ("learning-rate", lr),
                           ("grad-norm", grad_norm), ("tokens-per-second", tokens_per_s),
                           ("step-time-ms", step_time * 1000), ("mfu", mfu),
                           ("memory-gib", mem), ("skipped-iterations", skipped_total)):
            self._scalar(tag, value, iteration)
        self._reset()

    def validation(self, iteration: int, loss: Optional[float]) -> None:
        if loss is None:
            return
        ppl = math.exp(min(loss, 20.0))
        if self.is_logging_rank:
            print(f"validation at iteration {iteration} | lm loss: {loss:.6E} | "
                  f"lm loss PPL: {ppl:.4E}", flush=True)
        self._scalar("lm loss validation", loss, iteration)
        self._scalar("lm loss validation ppl", ppl, iteration)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
