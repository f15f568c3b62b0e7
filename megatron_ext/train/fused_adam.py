"""``--torch-adam-fused``: torch's fused AdamW kernel for the optimizer megatron-core 0.16.1
builds when neither Transformer Engine nor Apex supplies a FusedAdam (the lent GPU image).
megatron-core then builds ``torch.optim.AdamW`` with torch's default for-each update (a
dozen kernels per parameter tensor per step); the fused one is one kernel pass over all of
them, with the same arithmetic. The optimizer stays the same class (the distributed
optimizer's checks of its type hold): its parameter groups are switched to ``fused``, which
torch's AdamW reads at every step."""

from __future__ import annotations

import torch
from megatron.core import optimizer as megatron_optimizer

from ..runtime.errors import FlagError


def torch_adam_fused(setting: str, device: str) -> bool:
    """Whether this run fuses torch's AdamW (``setting``: ``--torch-adam-fused``): ``auto``
    on a GPU, ``on`` everywhere; ``on`` is refused where megatron-core's optimizer is TE's or
    Apex's FusedAdam already."""
    if setting == "off":
        return False
    if not megatron_optimizer.USING_PYTORCH_OPTIMIZER:
        if setting == "on":
            raise FlagError("--torch-adam-fused on: the optimizer is already Transformer "
                            "Engine's or Apex's FusedAdam (they import); drop the flag")
        return False
    return setting == "on" or device == "cuda"


def fuse_torch_adam(optimizer) -> int:
    """Switch each torch AdamW of megatron-core's optimizer chain to the fused kernel, and put
    its ``step`` counters on their parameters' device (the kernel reads them there; a loaded
    checkpoint or :mod:`megatron_ext.checkpoint.torch_adam` leaves them on the CPU). Called
    after the optimizer is built and again after a checkpoint is loaded (loading restores
    the saved parameter groups). Returns the number of parameter groups switched."""
    switched = 0
    for chained in optimizer.chained_optimizers:
        inner = chained.optimizer
        if not isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
            continue
        for group in inner.param_groups:
            group["fused"], group["foreach"] = True, False
            switched += 1
            for param in group["params"]:
                state = inner.state.get(param)
                if state and "step" in state and state["step"].device != param.device:
                    state["step"] = state["step"].to(param.device)
    return switched
