"""What the ranks agree on, one all-reduce each: the mean ``lm loss`` of a step or a
validation (micro-batches and data-parallel ranks) and the maximum of a few flags over all
ranks (a signal, a non-finite loss), so that every rank then takes the same decision. Used by
the training step (:mod:`megatron_ext.train.loop`), validation
(:mod:`megatron_ext.train.validation`) and the exit conditions
(:mod:`megatron_ext.train.exit_conditions`).
"""

from __future__ import annotations

from typing import Optional

import torch
from megatron.core import parallel_state


def reduce_losses(loss_dicts: list) -> Optional[float]:
    """Mean ``lm loss`` over the micro-batches and data-parallel ranks (last pipeline
    stage, one all-reduce per step), else None."""
    if not loss_dicts:
        return None
    total = torch.stack([d["lm loss"] for d in loss_dicts]).sum(0)
    torch.distributed.all_reduce(total, group=parallel_state.get_data_parallel_group())
    return (total[0] / total[1]).item()


def max_over_ranks(values: list, device: str) -> list[int]:
    """Each value (a bool, a small int or a one-element tensor) as its maximum over all
    ranks, in one all-reduce: what every rank then decides on alike."""
    t = torch.stack([torch.as_tensor(v, dtype=torch.float32, device=device).reshape(())
                     for v in values])
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]
