"""Exit signals (``--exit-signal-handler``): SIGTERM and SIGUSR1 are caught from the first
instruction of the entry point, before torch is imported.

Slurm signals a job before its time limit or on preemption, and a requeued job can be
signalled again while it is still starting. A handler installed only when the training loop
begins leaves a window in which Python's default action kills the rank. Installed first, the
handler only records the signal; the training loop (:mod:`megatron_ext.train.exit_conditions`)
decides where to stop: at the next start-up phase boundary (nothing new to save), after the
current validation batch or training step (then it saves), never inside a save.

This module imports nothing heavy, so the entry point can install it before anything else.
"""

from __future__ import annotations

import signal
from typing import Optional, Sequence

EXIT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
FLAG = "--exit-signal-handler"

_received: Optional[int] = None


def _record(signum, frame) -> None:
    global _received
    _received = signum


def install() -> None:
    """Record SIGTERM/SIGUSR1 from now on instead of dying of them (idempotent)."""
    for sig in EXIT_SIGNALS:
        signal.signal(sig, _record)


def install_if_requested(argv: Sequence[str]) -> None:
    """:func:`install` when the command line asks for ``--exit-signal-handler``."""
    if FLAG in argv:
        install()


def ignore() -> None:
    """Ignore SIGTERM/SIGUSR1 from now on: for a rank that has finished, whose Python would
    otherwise restore the default action while shutting down and die of a late signal
    (exit 138/143, which the batch script must read as "killed before handling it")."""
    for sig in EXIT_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def received() -> Optional[int]:
    """The last exit signal this process received, or None."""
    return _received


def reset() -> None:
    """Forget a received signal: for a process that runs several trainings (the tests)."""
    global _received
    _received = None
