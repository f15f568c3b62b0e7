"""megatron-core 0.16.1 cannot resume a distributed optimizer over torch's Adam (no TE, no
Apex: the lent GPU image) as it is; this is the fix, applied by :mod:`.loading`. Found on the
first GPU run (H200 without TE or Apex); tested on CPU at one rank."""

from __future__ import annotations

import torch

from megatron.core.optimizer import distrib_optimizer
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer


def distributed_torch_adam(optimizer) -> list:
    """The distributed optimizers of a chain that run torch's Adam (no TE, no Apex), with their
    indices in the chain. megatron-core 0.16.1 cannot resume them as it is:

    * it builds the loading template from one ``step`` among the per-parameter states, which
      torch's Adam creates at its first step only (an assert in ``state_dict`` fails):
      :func:`init_state` creates the state a first step would;
    * loading the parameter state copies the template's ``step`` over the one just read from
      the saved parameter groups: :func:`restore_steps` puts the saved one back.

    Found on the first GPU run (H200 without TE or Apex); tested on CPU at one rank."""
    if distrib_optimizer.HAVE_APEX_OR_TE:
        return []
    return [(i, opt) for i, opt in enumerate(optimizer.chained_optimizers)
            if isinstance(opt, DistributedOptimizer)]


def init_state(optimizer) -> None:
    for _, opt in distributed_torch_adam(optimizer):
        if not opt.optimizer.state:
            opt.init_state_fn(opt.optimizer, opt.config)
            for state in opt.optimizer.state.values():
                state["step"] = torch.tensor(0.0)


def restore_steps(optimizer, loaded) -> None:
    """``loaded``: the optimizer part of the loaded checkpoint, as the chain's
    ``load_state_dict`` takes it (one optimizer's state dict, or one per optimizer)."""
    chain = optimizer.chained_optimizers
    if len(chain) > 1:
        loaded = [v for _, v in sorted(loaded.items())] if isinstance(loaded, dict) else loaded
    for i, opt in distributed_torch_adam(optimizer):
        saved = loaded if len(chain) == 1 else loaded[i]
        (step,) = {g["step"] for g in saved["optimizer"]["param_groups"]}
        for state in opt.optimizer.state.values():
            state["step"] = torch.tensor(float(step))
