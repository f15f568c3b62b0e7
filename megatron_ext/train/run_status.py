"""How a run ended, for the batch script that launched it: ``done`` (it reached
``--train-iters``) or ``stopped`` (an exit signal, ``--exit-duration-in-mins`` or
``--exit-interval`` ended it before). Both exit 0, as in Megatron-LM; a SIGTERM sent to the
job step alone (``scancel --signal=TERM JOBID.0``, or Slurm cancelling the step) reaches the
ranks but not the batch script, which could then not tell a stopped run from a finished one.

When the environment names a file in :data:`STATUS_ENV` (``slurm/fixedcode.sbatch`` sets it),
global rank 0 writes one line there as the run ends: ``done`` or ``stopped <why>``; an error
writes nothing (the exit status says it).
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from ..runtime.files import write_text

STATUS_ENV = "FIXEDCODE_RUN_STATUS_FILE"


def status_line(iteration: int, exit_reason: Optional[str]) -> str:
    if exit_reason is None:
        return f"done at iteration {iteration}\n"
    return f"stopped at iteration {iteration}: {exit_reason}\n"


def record_run_end(iteration: int, exit_reason: Optional[str]) -> None:
    """Write the run's end to ``$FIXEDCODE_RUN_STATUS_FILE`` (global rank 0), if it is set."""
    path = os.environ.get(STATUS_ENV)
    if path and (not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0):
        write_text(path, status_line(iteration, exit_reason))
