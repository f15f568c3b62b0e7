"""Writing saves: the run's save policy (:class:`Checkpointer`), synchronous or asynchronous
(``--async-save``), each save's manifest, the latest marker, retention, and a failed save.

One path for both modes, as megatron-core's own synchronous save: ``dist_checkpointing.save``
with ``async_sharded_save=True`` prepares the save and returns an ``AsyncRequest`` (the
writers' function, and the finalization functions that must run on every rank once every
writer has finished: megatron-core's ``.metadata`` and ``metadata.json``, then
:func:`_complete`). A synchronous save runs it at once (``execute_sync``); ``--async-save``
hands it to megatron-core's ``AsyncCallsQueue`` (a forked process per rank writes, training
goes on) and finalizes it at a later iteration, once an all-reduce says every rank's writer
is done, as Megatron-LM's training loop does (``maybe_finalize_async_save``).

A save goes to ``iter_N.partial/``. The writers checksum the files they have written
(``manifest.rankR.json``); :func:`_complete` (rank 0) writes ``manifest.json``
(:mod:`megatron_ext.checkpoint.manifest`), renames the directory to ``iter_N/``, replaces the marker
(atomically), and applies retention (:mod:`megatron_ext.checkpoint.retention`). A crash at any point
leaves the previous save and the marker as they were. A save that fails (a full disk, any
OSError, a writer's error) removes its own files and raises :class:`SaveFailed`, which ends the
run with its exit status (4).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import glob
import multiprocessing
import os
import shutil
import time
from typing import Callable, ContextManager, Optional

import torch
from torch.distributed.checkpoint.api import CheckpointException

from megatron.core import dist_checkpointing, parallel_state
from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
from megatron.core.dist_checkpointing.strategies import filesystem_async
from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue, AsyncRequest
from megatron.core.dist_checkpointing.strategies.fully_parallel import (
    FullyParallelSaveStrategyWrapper,
)

from ..codes.schemes import FixedCode
from ..config.derived import Derived, run_record
from ..config.checkpoint_config import CheckpointConfig
from ..config.run_config import RunConfig
from ..runtime.errors import CheckpointError
from ..runtime.files import read_json, write_json, write_text
from ..runtime.log import log
from ..runtime.megatron_compat import (async_save_kwargs, installed_release,
                                      keep_writer_errors, writer_os_error)
from . import manifest, retention
from .lease import SaveLease, confirm_save_lease
from .layout import (MARKER, TrainState, checkpoint_path, content_metadata, provenance, rng_state,
                     sharded_state)

class SaveFailed(CheckpointError):
    """A save could not be written; the previous save and the marker are intact. Its exit
    status, 4, is documented in docs/training.md; the Slurm script does not requeue it (a
    requeued job would fail the same way)."""
    exit_code = 4


def _fork_writer_results_queue() -> None:
    """megatron-core's torch_dist writer reports through a ``Manager`` queue that it starts,
    on a rank's first save, with the *spawn* method: the new process re-imports the entry
    point (torch, megatron-core), 4-6 s of CPU per rank. A Manager forked from this process
    serves the same queue within milliseconds (the writers themselves are forked too)."""
    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = multiprocessing.get_context("fork").Manager().Queue()


class _FullDisk:
    """Test hook ``FIXEDCODE_FAULT_DISK_FULL``: a file created on a full disk; every write
    fails with ENOSPC, as write(2) fails there (naming no file)."""

    def __init__(self, path, mode="r", *args, **kwargs):
        self.file = open(path, mode, *args, **kwargs)

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()

    def __getattr__(self, name):
        return getattr(self.file, name)


def _write_then_checksum(write, iteration: int, rank: int, write_buckets: list,
                         results_queue) -> None:
    """megatron-core's writer function, then the checksums of the files it wrote, into
    ``manifest.rankR.json``. Runs where the writer runs: in the training process for a
    synchronous save, in the forked writer process under ``--async-save``. A write error
    reaches the finalization through megatron-core's results queue."""
    time.sleep(float(os.environ.get("FIXEDCODE_TEST_WRITE_SECONDS", 0)))  # test hook
    full_disk = os.environ.get("FIXEDCODE_FAULT_DISK_FULL") == str(iteration)  # test hook
    if full_disk:
        filesystem_async.open = _FullDisk  # the writers are forked from here and inherit it
    keep_writer_errors()
    try:
        write(rank, write_buckets, results_queue)
    finally:
        if full_disk:
            del filesystem_async.open
    error = writer_os_error()
    if error is not None:  # megatron-core's report of it (0.17.0 on: its type alone) replaced
        results_queue.get()
        results_queue.put(error)
    files = [bucket[0] for bucket in write_buckets]
    try:
        sums = manifest.checksum_files(files)
        write_json(os.path.join(os.path.dirname(files[0]), f"manifest.rank{rank}.json"), sums)
    except OSError:
        pass  # the write failed as well; finalization reports it


def _complete(config: CheckpointConfig, iteration: int) -> None:
    """The last finalization step, on every rank once every writer has finished: rank 0
    writes the manifest, renames the save to its final name, moves the marker, applies
    retention; the other ranks wait for it."""
    # Test hooks: die after the shards, before completion; or stay inside the save a while
    # (a window for a signal to arrive in): "S" seconds in every save, "S@N" in iteration N's.
    if os.environ.get("FIXEDCODE_FAULT_AFTER_SHARDS") == str(iteration):
        os._exit(17)
    seconds, _, at = os.environ.get("FIXEDCODE_TEST_SAVE_SECONDS", "0").partition("@")
    if not at or at == str(iteration):
        time.sleep(float(seconds))
    messages = []  # retention's, from rank 0, printed by the logging rank
    if torch.distributed.get_rank() == 0:
        final = checkpoint_path(config.save, iteration)
        partial = final + ".partial"
        known = {}
        for part in sorted(glob.glob(os.path.join(partial, "manifest.rank*.json"))):
            known.update(read_json(part))
            os.remove(part)
        manifest.write_manifest(partial, known, written_by=installed_release())
        os.rename(partial, final)
        write_text(os.path.join(config.save, MARKER), str(iteration))
        if config.keep_last_checkpoints:
            retention.prune(config.save, iteration, config.keep_last_checkpoints,
                            config.keep_checkpoints_every, messages.append)
    shared = [messages]
    torch.distributed.broadcast_object_list(shared, src=0)  # every rank waits for rank 0
    for message in shared[0]:
        log(message)


def start_save(config: RunConfig, derived: Derived, model, optimizer, scheduler,
               state: TrainState, code: Optional[FixedCode],
               wandb_run_id: Optional[str] = None) -> AsyncRequest:
    """Prepare the save of ``state`` on every rank (the common objects are written now, the
    run's ``config`` among them as its ``args`` record);
    returns the request that writes the shards and completes the save. ``code``: the model's
    fixed code (``None`` for the learned arm), stored whole as the common object
    ``fixed_code``. ``optimizer`` and ``scheduler`` None: the model alone (a freshly
    initialised model saved for the converter, bench/bench_convert.py)."""
    iteration = state.iteration
    final = checkpoint_path(config.checkpoint.save, iteration)
    partial = final + ".partial"
    if torch.distributed.get_rank() == 0:
        # Leftovers of a crashed save: shards without completion, or a completed directory
        # whose marker was never written. Neither is a checkpoint; both are redone.
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        os.makedirs(partial)
    torch.distributed.barrier()
    _fork_writer_results_queue()
    metadata = content_metadata(config)
    sharded = sharded_state(model, optimizer, rng_state(), is_loading=False, metadata=metadata)
    sharded.update(args=run_record(config, derived),
                   fixed_code=None if code is None else code.to_dict(),
                   scheduler=None if scheduler is None else scheduler.state_dict(),
                   wandb_run_id=wandb_run_id, **dataclasses.asdict(state), **provenance())
    strategy = FullyParallelSaveStrategyWrapper(
        get_default_save_sharded_strategy(),
        parallel_state.get_data_parallel_group(with_context_parallel=True))
    request = dist_checkpointing.save(sharded, partial, strategy, content_metadata=metadata,
                                      async_sharded_save=True, **async_save_kwargs())
    if request.async_fn is not None:  # None: nothing to write on this rank
        request = request._replace(
            async_fn=functools.partial(_write_then_checksum, request.async_fn, iteration))
    request.add_finalize_fn(functools.partial(_complete, config.checkpoint, iteration))
    return request


def save_checkpoint(config: RunConfig, derived: Derived, model, optimizer, scheduler,
                    state: TrainState, code: Optional[FixedCode],
                    wandb_run_id: Optional[str] = None) -> str:
    """Save synchronously on every rank; returns the final checkpoint path."""
    start_save(config, derived, model, optimizer, scheduler, state, code,
               wandb_run_id).execute_sync()
    return checkpoint_path(config.checkpoint.save, state.iteration)


def remove_failed_save(save_dir: str, iteration: int) -> None:
    """Remove what a failed save wrote (rank 0), unless the marker already names it."""
    final = checkpoint_path(save_dir, iteration)
    shutil.rmtree(final + ".partial", ignore_errors=True)
    marker = os.path.join(save_dir, MARKER)
    if not (os.path.isfile(marker) and open(marker).read().strip() == str(iteration)):
        shutil.rmtree(final, ignore_errors=True)


def _errno_name(error: BaseException) -> str:
    """`` (ENOSPC)``: the name of the errno of the OSError that caused ``error``, or ``""``."""
    while error is not None and not (isinstance(error, OSError) and error.errno):
        error = error.__cause__
    return "" if error is None else f" ({errno.errorcode.get(error.errno, error.errno)})"


class Checkpointer:
    """The run's save policy: every ``--save-interval`` iterations and when the run ends,
    only with ``--save``, never the same iteration twice. With ``--async-save`` a save's
    files are written in the background; it completes (the marker moves) at a later
    iteration once every rank's writer has finished, and the next save and the end of the
    run first wait for it."""

    def __init__(self, config: CheckpointConfig, start: Callable[[TrainState], AsyncRequest],
                 last_saved: Optional[int],
                 gathered: Callable[[], ContextManager] = contextlib.nullcontext,
                 lease: Optional[SaveLease] = None):
        """``config``: the save flags; ``start(state)``: the save of the run at ``state``,
        prepared (:func:`start_save` of its model, optimizer, scheduler and code).
        ``gathered``: a context in which the model holds whole, current parameters (under
        ``--overlap-param-gather`` they are gathered only for a save, not every step).
        ``lease``: rank 0's lease on ``--save`` (:mod:`~megatron_ext.checkpoint.lease`),
        confirmed before each save."""
        self.config, self.start = config, start
        self.lease = lease
        self.gathered = gathered
        self.last_saved = last_saved
        self.queue = AsyncCallsQueue() if config.async_save else None
        self.pending: Optional[tuple[int, float]] = None  # (iteration, start) being written

    def save(self, state: TrainState, final: bool = False) -> None:
        """Call after every iteration, and with ``final`` when the run ends (done, or an exit
        condition): saves when due (every ``--save-interval``) or final, and completes a
        background save whose writers have all finished (``final``: waits for it)."""
        if not self.config.save:
            return
        due = final or (bool(self.config.save_interval)
                        and state.iteration % self.config.save_interval == 0)
        if not due or self.last_saved == state.iteration:
            self._complete_pending(wait=final)
            return
        self._complete_pending(wait=True)
        confirm_save_lease(self.config.save, self.lease)
        start = time.time()
        path = checkpoint_path(self.config.save, state.iteration)
        try:
            if self.queue is None or final:
                with self.gathered():
                    self.start(state).execute_sync()
                log(f"[fixedcode] saved checkpoint {path} (training stalled "
                    f"{time.time() - start:.2f} s)")
            else:
                with self.gathered():
                    self.queue.schedule_async_request(self.start(state))
                self.pending = (state.iteration, start)
                log(f"[fixedcode] saving checkpoint {path} in the background (training "
                    f"stalled {time.time() - start:.2f} s)")
        except (OSError, CheckpointException) as e:
            raise self._failed(state.iteration, e) from e
        self.last_saved = state.iteration

    def finish_pending(self) -> None:
        """Wait for a background save and complete it (a run that stops on an error every
        rank shares, so that its last save is not lost)."""
        self._complete_pending(wait=True)

    def _complete_pending(self, wait: bool) -> None:
        if self.pending is None:
            return
        iteration, start = self.pending
        if wait:
            log(f"[fixedcode] waiting for the background save of iteration {iteration}")
        completing = time.time()
        try:
            done = self.queue.maybe_finalize_async_calls(blocking=wait)
        except (OSError, CheckpointException) as e:
            self.pending = None
            raise self._failed(iteration, e) from e
        if done:
            self.pending = None
            now = time.time()
            log(f"[fixedcode] saved checkpoint {checkpoint_path(self.config.save, iteration)} "
                f"(written in the background in {now - start:.2f} s; completing it stalled "
                f"training {now - completing:.2f} s)")

    def _failed(self, iteration: int, error: BaseException) -> SaveFailed:
        if torch.distributed.get_rank() == 0:
            remove_failed_save(self.config.save, iteration)
        if isinstance(error, CheckpointException):  # the writers' errors, by rank (rank 0 has them)
            error = "; ".join(f"rank {rank}: {exc}{_errno_name(exc)}" for rank, (exc, _) in
                              sorted(error.failures.items())) or "a writer failed on another rank"
        return SaveFailed(
            f"the save of iteration {iteration} to {self.config.save} failed ({error}); its "
            f"files were removed, the previous save and {MARKER} are intact. Free space (or "
            f"fix the filesystem) and resume with --load {self.config.save}")
