"""One run at a time writes into a ``--save`` directory: the lease ``DIR/.locks/run.lease``.

A job submitted twice, or a requeued job while a lost node's ranks still write, would have two
runs saving into one directory, each corrupting the other's saves. The run's rank 0 takes the
lease before anything is written there and gives it back when the run ends. The lease file
names its holder (host, process id, Slurm job id) and carries a heartbeat, rewritten every
tenth of ``--save-lease-timeout`` by a thread of the holder. A second run refuses to start,
naming the holder, unless the lease is free to take:

- its holder's Slurm job is this job (a requeue reclaims its own lease; the older run of the
  job, if a lost node still runs it, finds the lease gone and saves no more);
- its holder ran on this host and its process is gone (``kill -9``): taken at once;
- its heartbeat is older than ``--save-lease-timeout`` seconds (a dead node): taken.

Taking is written with ``link(2)`` (a new lease) or ``rename(2)`` (a lease taken over), both
atomic on local disks, NFS and Lustre, then read back: of two runs taking one lease at once,
the one whose token is not there refuses. No ``flock``: on Lustre it needs a mount option,
and a lock held by a dead node's client is not released for minutes. Heartbeats compare the
holder's clock with the reader's: a cluster's nodes keep their clocks within seconds (NTP),
far below the timeout.

Before each save the run confirms it still holds the lease (:meth:`SaveLease.confirm`); a run
whose lease was taken over stops with a :class:`~megatron_ext.runtime.errors.CheckpointError`
instead of writing over the new holder's saves.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
import sys
import uuid
from typing import Callable, Optional

import torch

from ..runtime.errors import CheckpointError
from ..runtime.log import log
from ..runtime.files import publish, temporary_name
from .retention import LOCKS

LEASE = "run.lease"


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lease, as its file says."""
    host: str
    pid: int
    slurm_job_id: Optional[str]
    token: str
    heartbeat: float  # time.time() of the holder's last heartbeat

    def describe(self, now: float) -> str:
        job = f", Slurm job {self.slurm_job_id}" if self.slurm_job_id else ""
        return (f"host {self.host}, pid {self.pid}{job}, last heartbeat "
                f"{max(0.0, now - self.heartbeat):.0f} s ago")


def this_process(now: float) -> Holder:
    return Holder(socket.gethostname(), os.getpid(), os.environ.get("SLURM_JOB_ID") or None,
                  uuid.uuid4().hex, now)


def lease_path(save_dir: str) -> str:
    return os.path.join(save_dir, LOCKS, LEASE)


def read_holder(path: str) -> Optional[Holder]:
    """The lease's holder; None when there is no lease. A lease file that does not parse (a
    writer killed mid-write, on a file system without atomic rename) has no live holder."""
    try:
        with open(path) as f:
            return Holder(**json.load(f))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError):
        return Holder("unknown", -1, None, "", 0.0)


def _process_gone(pid: int) -> bool:
    if pid <= 0:  # an unreadable lease's (os.kill would address a process group)
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def why_free(holder: Holder, me: Holder, timeout: float, now: float) -> Optional[str]:
    """Why ``me`` may take the lease ``holder`` has, or None when it may not."""
    if me.slurm_job_id and holder.slurm_job_id == me.slurm_job_id:
        return f"this Slurm job's own lease (job {me.slurm_job_id}, requeued)"
    if holder.host == me.host and _process_gone(holder.pid):
        return f"its holder, pid {holder.pid} on this host, is gone"
    if now - holder.heartbeat > timeout:
        return f"no heartbeat for {now - holder.heartbeat:.0f} s (> {timeout:g} s)"
    return None


def _write(path: str, holder: Holder) -> str:
    """``holder`` written to a temporary file beside ``path``; returns its name."""
    tmp = temporary_name(path) + f".{holder.token}"
    with open(tmp, "w") as f:
        json.dump(dataclasses.asdict(holder), f)
        f.flush()
        os.fsync(f.fileno())
    return tmp


class SaveLease:
    """The lease of one run on ``save_dir`` (rank 0). :meth:`take` it; :meth:`close` gives it
    back."""

    def __init__(self, save_dir: str, timeout: float, clock: Callable[[], float] = time.time):
        self.path, self.timeout, self.clock = lease_path(save_dir), timeout, clock
        self.save_dir = save_dir
        self.me: Optional[Holder] = None
        self.lost: Optional[str] = None  # why the lease is no longer this run's
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._writing = threading.Lock()  # the heartbeat thread and confirm() both renew

    def take(self) -> str:
        """Take the lease, or raise :class:`CheckpointError` naming its holder; returns the
        line that says so (and why a held lease was free to take)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        now = self.clock()
        me = this_process(now)
        tmp = _write(self.path, me)
        try:
            try:
                os.link(tmp, self.path)  # fails if a lease exists, atomically
                how = None
            except FileExistsError:
                holder = read_holder(self.path)
                how = why_free(holder, me, self.timeout, now) if holder else "no holder"
                if how is None:
                    raise CheckpointError(
                        f"--save {self.save_dir} is in use by another run ({holder.describe(now)}"
                        f"; lease {self.path}): two runs saving into one directory corrupt "
                        f"each other's saves. Stop that run, or wait: a lease without a "
                        f"heartbeat for --save-lease-timeout {self.timeout:g} s is taken "
                        f"over") from None
                publish(tmp, self.path)
                tmp = None
        finally:
            if tmp is not None:
                os.remove(tmp)
        taken = read_holder(self.path)
        if taken is None or taken.token != me.token:  # another run took it at the same time
            raise CheckpointError(
                f"--save {self.save_dir}: another run took the lease {self.path} at the same "
                f"moment ({taken.describe(now) if taken else 'since removed'})")
        self.me = me
        return (f"[fixedcode] lease on --save {self.save_dir} taken"
                + (f" over: {how}" if how else ""))

    def heartbeat(self) -> None:
        """Renew the lease; marks it :attr:`lost` (and stops renewing) when another run
        holds it now."""
        with self._writing:
            if self.me is None or self.lost:
                return
            holder = read_holder(self.path)
            if holder is None or holder.token != self.me.token:
                self.lost = (f"taken over by another run ({holder.describe(self.clock())})"
                             if holder else "removed")
                return
            self.me = dataclasses.replace(self.me, heartbeat=self.clock())
            publish(_write(self.path, self.me), self.path)

    def start_heartbeat(self) -> None:
        """Renew the lease every tenth of the timeout, in a daemon thread."""
        def beat():
            while not self._stop.wait(self.timeout / 10):
                try:
                    self.heartbeat()
                except OSError as e:  # a file system hiccup: the next beat retries
                    print(f"[fixedcode] lease heartbeat failed ({e}); retrying",
                          file=sys.stderr, flush=True)
        self._thread = threading.Thread(target=beat, name="save-lease", daemon=True)
        self._thread.start()

    def confirm(self) -> Optional[str]:
        """None while this run holds the lease, else why it does not."""
        self.heartbeat()
        return self.lost

    def close(self) -> None:
        """Stop renewing and remove the lease if it is still this run's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.me is None:
            return
        holder = read_holder(self.path)
        if holder is not None and holder.token == self.me.token:
            os.remove(self.path)
        self.me = None


def take_save_lease(save_dir: Optional[str], timeout: float) -> Optional[SaveLease]:
    """Rank 0 takes the lease on ``save_dir`` (None: no lease) and renews it; every rank
    raises its refusal. Collective."""
    lease, said = None, [None, None]  # [refusal, what was done]
    if save_dir and torch.distributed.get_rank() == 0:
        lease = SaveLease(save_dir, timeout)
        try:
            said[1] = lease.take()
            lease.start_heartbeat()
        except (CheckpointError, OSError) as e:
            said[0] = str(e)
    if save_dir:
        torch.distributed.broadcast_object_list(said, src=0)
    if said[0]:
        raise CheckpointError(said[0])
    if said[1]:
        log(said[1])
    return lease


def confirm_save_lease(save_dir: Optional[str], lease: Optional[SaveLease]) -> None:
    """Before a save: every rank raises :class:`CheckpointError` when rank 0's lease was
    taken over by another run. Collective (with ``--save``)."""
    if not save_dir:
        return
    lost = [lease.confirm() if lease is not None else None]
    torch.distributed.broadcast_object_list(lost, src=0)
    if lost[0]:
        raise CheckpointError(f"--save {save_dir}: this run's lease was {lost[0]}; not saving "
                              f"over that run's checkpoints")
