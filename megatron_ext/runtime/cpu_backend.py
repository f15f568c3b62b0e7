"""Run Megatron-Core (0.16.1 to 0.19.x) on CPU over gloo: used by the tests and the CPU demo only.

Megatron-Core assumes CUDA in a handful of places. :func:`enable` redirects them to the CPU,
once per process, before any model is built:

* ``torch.cuda.current_device()``, ``torch.cuda.synchronize()``, ``torch.cuda.current_stream()``
  (DDP's gradient sync waits on it from megatron-core 0.19.0: a stream with nothing to wait
  for; :mod:`megatron_ext.runtime.megatron_compat`) and tensor factories/moves that name
``'cuda'`` (a
  ``TorchFunctionMode`` rewrites the device to ``'cpu'``);
* the CUDA RNG state calls (``torch.cuda.{get,set}_rng_state``, ``manual_seed``, and
  Megatron's own ``_get/_set_cuda_rng_state``) become the CPU generator's; the tracker's
  "CPU RNG state changed within GPU RNG context" warning is then expected and filtered;
* gradient clipping: Megatron's ``clip_grad_by_total_norm_fp32`` asserts CUDA tensors, so
  it is replaced by the same scaling on CPU tensors (the norm itself is computed by
  Megatron's fallback path, which works on CPU);
* ``Tensor.type()`` (the query, no argument) names a CPU tensor by its CUDA type: the
  mixed-precision optimizer sorts parameters into fp16/bf16 (given an fp32 main copy) and
  fp32 by those strings, and refuses any other. With that, ``--bf16`` and ``--fp16`` train
  on CPU through megatron-core's own mixed-precision optimizer: fp32 main parameters, loss
  scaling, overflow skips.

Gloo itself runs the collectives of sequence parallelism and the distributed optimizer
(``reduce_scatter_tensor``, ``all_gather_into_tensor``; torch 2.13): both train on CPU with
nothing redirected.
"""

from __future__ import annotations

import logging

import torch
from torch.overrides import TorchFunctionMode

from . import megatron_compat

_ENABLED = False


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)


class _CudaToCpu(TorchFunctionMode):
    """Rewrites ``device='cuda'`` (or a GPU index) to CPU, ``.cuda()`` to a no-op, and
    ``.type()`` of a CPU tensor to its CUDA name (``torch.BFloat16Tensor`` ->
    ``torch.cuda.BFloat16Tensor``)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs = {**kwargs, "device": "cpu"}
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


class _NoStream:
    """The current "stream" of a CPU process: work is done when it is issued."""

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass


class _DropTrackerWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "CPU RNG state changed within GPU RNG context" not in record.getMessage()


def _clip_grads_cpu(params, grads_for_norm=None, max_norm=1.0, total_norm=None,
                    use_decoupled_grad=False, *args, **kwargs):
    """Scale gradients so that their total norm is at most ``max_norm`` (CPU tensors)."""
    if isinstance(params, torch.Tensor):
        params = [params]
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0:
        for param in params:
            grad = param.decoupled_grad if use_decoupled_grad else param.grad
            if grad is not None:
                grad.mul_(clip_coeff)


def enable() -> None:
    """Make Megatron-Core run on CPU in this process (idempotent)."""
    global _ENABLED
    if _ENABLED:
        return
    from megatron.core.optimizer import optimizer as mcore_optimizer
    from megatron.core.tensor_parallel import random as mcore_random

    torch.cuda.current_device = lambda: 0
    torch.cuda.synchronize = lambda device=None: None
    if megatron_compat.grad_sync_asks_cuda_stream():
        torch.cuda.current_stream = lambda device=None: _NoStream()
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)
    torch.cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    mcore_random._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mcore_random._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    mcore_optimizer.clip_grad_by_total_norm_fp32 = _clip_grads_cpu
    logging.getLogger(mcore_random.__name__).addFilter(_DropTrackerWarning())
    _CudaToCpu().__enter__()  # stays active for the life of the process
    _ENABLED = True
