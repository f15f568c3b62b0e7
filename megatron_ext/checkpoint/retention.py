"""Which saves of a ``--save`` directory are kept (``--keep-last-checkpoints``,
``--keep-checkpoints-every``), their crash-safe deletion, and the read lock that keeps a save
alive while a study's evaluation reads it.

Deletion renames ``iter_N/`` to ``iter_N.deleting/`` (atomic) and only then removes it: a kill
at any moment leaves every other save whole, and a half-removed one under a name that nothing
loads (the next pruning finishes it). Never deleted: the save the marker names, anything newer,
a ``.partial`` save, the newest ``--keep-last-checkpoints``, every ``--keep-checkpoints-every``-th
iteration, and a save whose lock file ``.locks/iter_N.lock`` a reader holds (:func:`reading`).
The lock files live in the hidden ``.locks/`` folder, so that the save directory lists as
Megatron-LM's does (saves and the marker).

The lock is ``flock(2)`` on ``.locks/iter_N.lock``: readers share it; the deleter takes it
exclusively without waiting (held: the save is kept, and logged) and holds it across the
rename, so a reader that gets the lock afterwards finds the save gone rather than
half-deleted. On Lustre, flock
needs the ``flock`` mount option; on NFSv4 Linux maps it to byte-range locks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from typing import Callable, Iterator, Optional

from ..runtime.errors import CheckpointError
from .layout import checkpoint_path, completed_iterations

DELETING = ".deleting"
LOCKS = ".locks"  # in --save: the readers' lock files (and the run's lease, checkpoint.lease)


class SaveDeleted(CheckpointError):
    """The save a reader asked for was deleted by retention before the reader got its lock."""


def lock_path(save_dir: str, iteration: int) -> str:
    """``DIR/.locks/iter_N.lock``, its folder created."""
    folder = os.path.join(save_dir, LOCKS)
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, os.path.basename(checkpoint_path(save_dir, iteration)) + ".lock")


@contextlib.contextmanager
def reading(save_dir: str, iteration: int) -> Iterator[None]:
    """Hold save ``iteration`` of ``save_dir`` against deletion while the block reads it;
    raises :class:`SaveDeleted` when it was deleted before the lock was taken."""
    with open(lock_path(save_dir, iteration), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        path = checkpoint_path(save_dir, iteration)
        if not os.path.isdir(path):
            raise SaveDeleted(f"{path}: deleted by the training run's retention "
                                    f"(--keep-last-checkpoints) before it could be read")
        yield


def to_delete(iterations: list[int], latest: int, keep_last: int,
              keep_every: Optional[int]) -> list[int]:
    """The saves retention removes (before locks are looked at): older than ``latest`` (the
    marker's), not among the ``keep_last`` newest up to it, not a multiple of ``keep_every``."""
    complete = [i for i in iterations if i <= latest]
    kept = set(complete[-keep_last:]) | {latest}
    return [i for i in complete if i not in kept and not (keep_every and i % keep_every == 0)]


def prune(save_dir: str, latest: int, keep_last: int, keep_every: Optional[int],
          log: Callable[[str], None]) -> list[int]:
    """Apply retention after save ``latest`` is complete (its marker written); returns the
    iterations deleted. Leftovers of an interrupted deletion are removed first."""
    for name in os.listdir(save_dir):
        if name.endswith(DELETING):
            shutil.rmtree(os.path.join(save_dir, name), ignore_errors=True)
    deleted = []
    for iteration in to_delete(completed_iterations(save_dir), latest, keep_last, keep_every):
        path = checkpoint_path(save_dir, iteration)
        with open(lock_path(save_dir, iteration), "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log(f"[fixedcode] retention: kept {path}: a reader holds its lock")
                continue
            os.rename(path, path + DELETING)
            os.remove(lock.name)
        try:
            shutil.rmtree(path + DELETING)
        except OSError as e:  # the save is out of reach already; the next pruning retries
            log(f"[fixedcode] retention: {path} not fully removed yet ({e})")
        deleted.append(iteration)
        log(f"[fixedcode] retention: deleted {path}")
    return deleted
