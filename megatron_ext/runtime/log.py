"""The one logging convention of the training package: a message is printed once, by the
logging rank (the last rank: the one that holds the loss under pipeline parallelism), and
flushed at once, so that a Slurm log shows it even if the job dies next."""

from __future__ import annotations

import torch


def is_logging_rank() -> bool:
    if not torch.distributed.is_initialized():
        return True
    return torch.distributed.get_rank() == torch.distributed.get_world_size() - 1


def log(msg: str) -> None:
    """Print once, from the logging rank."""
    if is_logging_rank():
        print(msg, flush=True)
