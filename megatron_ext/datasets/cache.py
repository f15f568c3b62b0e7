"""Megatron-Core's dataset index caches in ``--data-cache-path``: built ahead of time by
tools/build_data_cache.py, then loaded by every rank of the training job.

Megatron-Core builds a GPT dataset's document, sample and shuffle indices (and a blend's
dataset indices) on rank 0 when ``--data-cache-path`` does not hold them, saves them there
as ``.npy`` files beside a ``description.txt``, and the other ranks load rank 0's files
after a barrier. Here:

- :func:`check_visible`: before anything is built, every rank checks that it sees the
  directory rank 0 sees (a file rank 0 writes there, or the files already there), so a node
  without that filesystem fails at once, on every rank, naming the path and the flag;
- :class:`CheckedGPTDataset`: the data files' size and modification time are part of the
  caches' key (Megatron-Core keys them by path only, so a dataset rebuilt in place was read
  through its old indices: appended documents never read, or an ``IndexError`` later); with
  ``--require-data-cache`` a GPT dataset whose indices are not cached is an error instead of
  a build; on a rank other than 0 a missing file is an error naming the flag, never a bare
  ``FileNotFoundError`` from numpy;
- :func:`cache_report`: which cache files each dataset uses, and whether they were built or
  found (loaded);
- :func:`one_process_group`: the process group of one process that building the caches ahead
  of time runs under (megatron_ext.datasets.gpt_datasets.build_caches);
- :class:`CacheBuild`: tools/build_data_cache.py's own flag, the job the caches are built for.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import uuid
from typing import Optional

import torch
from megatron.core.datasets.gpt_dataset import GPTDataset

from ..config.flag_fields import FlagConfig, flag
from ..runtime.errors import DataError, joined
from ..runtime.files import file_fingerprint

# megatron.core 0.16.1's files of one GPT dataset split (GPTDataset.
# _build_document_sample_shuffle_indices): PATH/HASH-GPTDataset-SPLIT-SUFFIX.
GPT_INDEX_SUFFIXES = ("description.txt", "document_index.npy", "sample_index.npy",
                      "shuffle_index.npy")
BUILDER = "tools/build_data_cache.py"


def _where() -> str:
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    return f"rank {rank} on {socket.gethostname()}"


def not_shared(path: str, missing: str) -> str:
    """The error of a rank that does not see ``missing``, which rank 0 sees in ``path``."""
    return (f"--data-cache-path {path}: {_where()} does not see {missing}, which rank 0 "
            f"sees there: not a shared filesystem? Every node of the job must see the same "
            f"--data-cache-path (a shared filesystem, not node-local storage)")


class CheckedGPTDataset(GPTDataset):
    """Megatron-Core's ``GPTDataset``, checking its cached indices before it builds or loads
    them. It keeps the class name ``GPTDataset``, which the cache files and their description
    carry; their hash also covers the data files' size and modification time
    (:meth:`_key_data_files`), so a rebuilt dataset gets new indices.

    ``require_cache`` (``--require-data-cache``): indices that are not in ``path_to_cache``
    are an error on every rank instead of being built on rank 0."""

    require_cache = False

    def _build_document_sample_shuffle_indices(self):
        if not self.config.mock:
            self._key_data_files()
        path = self.config.path_to_cache
        if path and not self.config.mock:
            base = f"{self.unique_description_hash}-{type(self).__name__}-{self.index_split.name}"
            files = [os.path.join(path, f"{base}-{suffix}") for suffix in GPT_INDEX_SUFFIXES]
            missing = [f for f in files if not os.path.isfile(f)]
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            if missing and self.require_cache:
                raise DataError(
                   f"--require-data-cache: --data-cache-path {path} holds no "
                   f"{self.index_split.name} indices of {self.dataset_path} for these flags "
                   f"({os.path.basename(missing[0])} is missing, {_where()}); build them with "
                   f"{BUILDER} and the same training flags (and --world-size of this job when "
                   f"--global-batch-size is not given), or drop --require-data-cache")
            if missing and rank != 0:  # rank 0 built or found them before the barrier
                raise DataError(not_shared(path, missing[0]))
        return super()._build_document_sample_shuffle_indices()


    def _key_data_files(self) -> None:
        """Add the ``.bin``/``.idx`` fingerprints to the identifiers the cache files are
        named by (their hash, recomputed as MegatronDataset computes it; a blend's hash,
        computed later from its datasets' identifiers, carries them too)."""
        self.unique_identifiers["data_files"] = {
            ext: file_fingerprint(self.dataset_path + ext) for ext in (".bin", ".idx")}
        self.unique_description = json.dumps(self.unique_identifiers, indent=4,
                                             default=lambda obj: obj.unique_identifiers)
        self.unique_description_hash = hashlib.md5(self.unique_description.encode("utf-8"),
                                                   usedforsecurity=False).hexdigest()


class RequiredCacheGPTDataset(CheckedGPTDataset):
    """:class:`CheckedGPTDataset` under ``--require-data-cache``."""

    require_cache = True


# The name in the cache files; __qualname__ stays, so that pickle finds the classes here.
CheckedGPTDataset.__name__ = RequiredCacheGPTDataset.__name__ = GPTDataset.__name__


def gpt_dataset_class(require_cache: bool) -> type:
    return RequiredCacheGPTDataset if require_cache else CheckedGPTDataset


def check_visible(path: str, require_cache: bool) -> None:
    """On every rank, before the datasets are built: rank 0 creates ``path`` (with
    ``require_cache`` it must exist) and writes a probe file there (it need not be writable
    with ``require_cache``: then the files already there serve); every rank checks that it
    sees them. Any failure is a :class:`DataError` on every rank at once, naming the ranks that
    failed, so no rank waits on another."""
    dist = torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
    probe, problem, names = None, None, []
    if not dist or torch.distributed.get_rank() == 0:
        problem, probe, names = _rank0_view(path, require_cache)
    if dist:
        shared = [problem, names]
        torch.distributed.broadcast_object_list(shared, src=0)
        problem, names = shared
    if problem is None:
        missing = ([path] if not os.path.isdir(path) else
                   [n for n in names if not os.path.exists(os.path.join(path, n))])
        if missing:
            problem = not_shared(path, missing[0])
    problems = [problem]
    if dist:
        problems = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(problems, problem)
    if probe:
        os.remove(probe)
    problems = list(dict.fromkeys(p for p in problems if p))  # rank 0's once, not per rank
    if problems:
        raise DataError(joined(problems[:8]) + (f"\n... and {len(problems) - 8} more ranks"
                                                if len(problems) > 8 else ""))


def _rank0_view(path: str, require_cache: bool):
    """``(problem, probe path, names every rank must see)`` as rank 0 sees ``path``; never
    raises, since the other ranks wait for its answer."""
    if require_cache and not os.path.isdir(path):
        return (f"--require-data-cache: --data-cache-path {path} does not exist "
                f"({_where()}); build the caches with {BUILDER} first, or drop "
                f"--require-data-cache"), None, []
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".probe-{socket.gethostname()}-{uuid.uuid4().hex[:12]}")
        with open(probe, "w"):
            pass
        return None, probe, [os.path.basename(probe)]
    except OSError as e:
        problem = (f"--data-cache-path {path}: rank 0 cannot write there ({e.strerror}), "
                   f"and Megatron-Core saves the dataset index caches there; give a writable "
                   f"directory on a filesystem every node shares")
    if not require_cache:
        return problem, None, []
    # A read-only cache is enough when it is only loaded: a few of its files serve as probe.
    try:
        return None, None, sorted(n for n in os.listdir(path)
                                  if n.endswith("description.txt"))[:4]
    except OSError:
        return problem.replace("write", "read"), None, []


@dataclasses.dataclass
class CacheRecord:
    """The cache files of one dataset split (a GPT dataset or a blend)."""

    kind: str  # GPTDataset, BlendedDataset
    split: str
    samples: int
    source: str  # the dataset prefix, or the blended prefixes
    files: list[str]
    built: bool  # False: every file was there before


def one_process_group() -> bool:
    """A torch.distributed group of this process alone, in memory (no port); True if it was
    started here (Megatron-Core's blend code asks for a rank)."""
    if torch.distributed.is_initialized():
        return False
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0,
                                         world_size=1)
    return True


@dataclasses.dataclass(frozen=True)
class CacheBuild(FlagConfig):
    """The training job that caches are built ahead for (tools/build_data_cache.py)."""
    FLAG_GROUP = "tools/build_data_cache.py"
    world_size: Optional[int] = flag(
        None, "ranks of the training job (nodes x tasks per node): sets the data-parallel "
              "size, hence the default --global-batch-size")


def listing(path: Optional[str]) -> set[str]:
    """The names in ``path`` (none when it does not exist)."""
    return set(os.listdir(path)) if path and os.path.isdir(path) else set()


def cache_report(datasets, path: str, before: set[str]) -> list[CacheRecord]:
    """The cache files of ``datasets`` (train, valid, test; None for a split not built) and
    of the GPT datasets inside a blend, given the names ``before`` that ``path`` held before
    they were built."""
    names, records = listing(path), []

    def add(ds, parts):
        files = sorted(n for n in names if n.startswith(f"{ds.unique_description_hash}-"))
        split = getattr(ds, "index_split", None) or ds.split
        source = getattr(ds, "dataset_path", None) or " ".join(
            str(getattr(d, "dataset_path", "")) for d in parts)
        records.append(CacheRecord(type(ds).__name__, split.name, len(ds), source,
                                   [os.path.join(path, f) for f in files],
                                   not files or any(f not in before for f in files)))

    for ds in datasets:
        if ds is None:
            continue
        parts = getattr(ds, "datasets", None) or []
        for part in parts:
            add(part, [])
        add(ds, parts)
    return records
