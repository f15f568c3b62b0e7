"""When a training job should stop early: a signal (``--exit-signal-handler``: SIGTERM or
SIGUSR1, as sent by Slurm before a time limit or on preemption), a wall-clock budget
(``--exit-duration-in-mins``) or an iteration multiple (``--exit-interval``).

Signals are recorded by :mod:`megatron_ext.runtime.exit_signals` from process start and may reach
ranks at different moments, so every decision is agreed on by all ranks (an all-reduce):
at the end of each start-up phase (:meth:`ExitConditions.signalled`: leave, nothing new to
save), after each validation batch (stop validating, save, leave) and at the end of each
training step (:meth:`ExitConditions.check`: save, leave). They all stop at the same point.
"""

from __future__ import annotations

import signal
import time
from typing import Optional

from ..config.run_config import CheckpointConfig
from ..runtime import exit_signals
from ..runtime.reductions import max_over_ranks


class ExitConditions:
    def __init__(self, config: CheckpointConfig, device: str, start_time: float):
        """``config``: the exit flags; ``device``: the run's (``cuda`` or ``cpu``), where the
        ranks agree."""
        self.config = config
        self.start_time = start_time
        self.device = device
        if config.exit_signal_handler:
            exit_signals.install()  # already in force when the entry point installed it

    def signalled(self) -> Optional[str]:
        """``"received SIGUSR1"`` when any rank received an exit signal, else None."""
        (signum,) = max_over_ranks([exit_signals.received() or 0], self.device)
        return f"received {signal.Signals(signum).name}" if signum else None

    def check(self, iteration: int) -> Optional[str]:
        """The reason to stop after ``iteration``, agreed by all ranks, or None."""
        a = self.config
        signum, duration, interval = max_over_ranks([
            exit_signals.received() or 0,
            a.exit_duration_in_mins is not None
            and (time.time() - self.start_time) / 60 >= a.exit_duration_in_mins,
            bool(a.exit_interval) and iteration % a.exit_interval == 0,
        ], self.device)
        if signum:
            return f"received {signal.Signals(signum).name}"
        if duration:
            return f"--exit-duration-in-mins {a.exit_duration_in_mins} reached"
        if interval:
            return f"--exit-interval {a.exit_interval} reached"
        return None
