"""Every process a run forks dies with the process that forked it: the ``Manager`` serving the
checkpoint writers' result queue, the background writer of ``--async-save`` and its per-bucket
writers, the data loader's workers. Killed with ``kill -9`` (or by the out-of-memory killer),
a training process cannot shut its helpers down; a Manager left running held the run's files
and a slot of the node. :func:`tie_forked_children` makes each forked child ask Linux to
``SIGKILL`` it when its parent dies (``prctl(PR_SET_PDEATHSIG)``), a chain that reaches the
writers' own children.

Linux only (elsewhere nothing changes). ``PR_SET_PDEATHSIG`` fires when the *thread* that
forked exits, so only children forked by the main thread, which lives as long as the
process, are tied. Processes started with ``exec`` (``subprocess``, ``spawn``) are not
touched: the hooks run for ``os.fork`` only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1  # linux/prctl.h

_parent = {"pid": None, "main_thread": False}  # the forking side, as the child sees it
_installed = False


def _before_fork() -> None:
    _parent["pid"] = os.getpid()
    _parent["main_thread"] = threading.current_thread() is threading.main_thread()


def _in_child() -> None:
    if not _parent["main_thread"]:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # the child then outlives a killed parent, as it did before
    if os.getppid() != _parent["pid"]:  # the parent died before the request was made
        os._exit(1)


def tie_forked_children() -> None:
    """From now on, each child this process forks from its main thread is killed when this
    process dies. Idempotent; a no-op off Linux."""
    global _installed
    if _installed or not sys.platform.startswith("linux"):
        return
    os.register_at_fork(before=_before_fork, after_in_child=_in_child)
    _installed = True
