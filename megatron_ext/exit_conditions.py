"""When a training job should save and stop early: a signal (``--exit-signal-handler``:
SIGTERM or SIGUSR1, as sent by Slurm before a time limit or preemption), a wall-clock
budget (``--exit-duration-in-mins``) or an iteration multiple (``--exit-interval``).

Signals may reach ranks at different moments, so every check is agreed on by all ranks
(an all-reduce) at the end of a step: they all save the same iteration and exit together.
"""

from __future__ import annotations

import argparse
import signal
import time
from typing import Optional

import torch


class ExitConditions:
    def __init__(self, args: argparse.Namespace, start_time: float):
        self.args = args
        self.start_time = start_time
        self.received: Optional[int] = None
        if args.exit_signal_handler:
            for sig in (signal.SIGTERM, signal.SIGUSR1):
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.received = signum

    def check(self, iteration: int) -> Optional[str]:
        """The reason to stop after ``iteration``, agreed by all ranks, or None."""
        a = self.args
        local = [
            float(self.received or 0),
            float(a.exit_duration_in_mins is not None
                  and (time.time() - self.start_time) / 60 >= a.exit_duration_in_mins),
            float(bool(a.exit_interval) and iteration % a.exit_interval == 0),
        ]
        flags = torch.tensor(local, device="cuda" if a.device == "cuda" else "cpu")
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        signum, duration, interval = (int(x) for x in flags.tolist())
        if signum:
            return f"received {signal.Signals(signum).name}"
        if duration:
            return f"--exit-duration-in-mins {a.exit_duration_in_mins} reached"
        if interval:
            return f"--exit-interval {a.exit_interval} reached"
        return None
