"""Where the megatron-core releases fixedcode runs on differ (0.16.1 to 0.19.x, the range of
pyproject.toml): every difference the project meets is here, named with the release it appeared
in, and decided by asking the installed package for the feature (a name it has, a parameter, a
value its class reports), never by its version string. No other module touches a name that
moved; ``DIFFERENCES`` lists each with its release, and tests/unit/test_megatron_compat.py
checks each answer against the installed release on both tested legs (0.16.1 and 0.19.x).

The differences (first release that has them):

* 0.17.0: ``build_tokenizer`` moved from ``megatron.core.tokenizers.text.utils`` to
  ``megatron.core.tokenizers.utils``, with renamed flags (``tokenizer_hf_use_fast`` became
  ``tokenizer_hf_no_use_fast``, ...): :func:`megatron_core_tokenizer`.
* 0.17.0: ``dist_checkpointing.save`` takes ``async_strategy``, default ``"nvrx"`` (NVIDIA
  Resiliency Extension's writer), and Megatron-Core's own async writer logs that it is
  deprecated: :func:`async_save_kwargs` (see its docstring for why ours stays in use).
* 0.17.0: a save's writer runs its buckets in threads of the caller's process (before: forked
  processes) and reports a failed one by the type of its error alone (``<class 'OSError'>``:
  a full disk no longer says so); the error it keeps holds, through its frames, a view of the
  bucket's data in a reference cycle, which crashes CPython 3.12.0-3.12.1's garbage collector:
  :func:`keep_writer_errors` keeps the error, named and without the view,
  :func:`writer_os_error` gives it back.
* 0.18.0: a layer spec's ``mlp`` is ``functools.partial(MLP.as_mlp_submodule,
  submodules=...)``, no longer a ``ModuleSpec``: :func:`mlp_submodules`.
* 0.18.0: ``NullTokenizer(V)`` counts V ids and its EOD is V - 1 (before: V + 1 ids, EOD V):
  :func:`null_tokenizer_counts`.
* 0.18.0: the batch-size ramp (``RampupBatchsizeNumMicroBatchesCalculator``,
  ``--rampup-batch-size``) is gone: :func:`has_batch_ramp`.
* 0.19.0: a save keeps its common objects inside the torch_dist shards, with no ``common.pt``;
  older releases cannot read it: :func:`read_common_objects` refuses such a save there, naming
  both releases.
* 0.19.0: DDP's gradient sync asks for ``torch.cuda.current_stream()`` on every bucket, CPU
  included (``runtime/cpu_backend.py`` answers it on CPU): :func:`grad_sync_asks_cuda_stream`.

Deprecated in 0.19.0 and not yet acted on (the plan is in docs/architecture.md): ``GPTModel``
(``HybridModel`` replaces it) and ``dist_checkpointing``'s ``load_common``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import logging
import os
import pickle
import re
import traceback
from pathlib import Path
from typing import Callable, Optional

from .errors import CheckpointError

# The file a save of megatron-core before 0.19.0 keeps its common objects in.
COMMON_FILE = "common.pt"


def installed_release() -> str:
    """The installed megatron-core's release, ``"0.19.2"`` (without the local part that an
    install beside a git checkout adds: ``0.19.2+8d0e208``)."""
    import megatron.core
    from packaging.version import Version

    return Version(megatron.core.__version__).base_version


def mlp_is_partial() -> bool:
    """0.18.0: the local and TE layer specs give ``mlp`` as a ``functools.partial`` of
    ``MLP.as_mlp_submodule``."""
    from megatron.core.transformer.mlp import MLP

    return hasattr(MLP, "as_mlp_submodule")


def mlp_submodules(layer_spec):
    """The ``MLPSubmodules`` of a transformer layer spec (``linear_fc1``, ``linear_fc2``),
    which a caller may replace in place, on every release."""
    mlp = layer_spec.submodules.mlp
    if isinstance(mlp, functools.partial):
        return mlp.keywords["submodules"]
    return mlp.submodules


def has_async_strategy() -> bool:
    """0.17.0: ``dist_checkpointing.save`` chooses its async writer (``async_strategy``)."""
    from megatron.core import dist_checkpointing

    return "async_strategy" in inspect.signature(dist_checkpointing.save).parameters


class _DropMcoreAsyncDeprecation(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "MCore's async save is deprecated" not in record.getMessage()


def async_save_kwargs() -> dict:
    """The keywords of ``dist_checkpointing.save`` that keep Megatron-Core's own writer
    (``async_strategy="mcore"``) where a release defaults to NVRx's.

    Ours stays in use because fixedcode's save is built on it: the writer forked per rank
    (``AsyncCallsQueue``, its results queue), the checksums written where the writer runs, the
    full-disk path. NVIDIA Resiliency Extension 0.4.1 installs on CPU, but its writer queue
    reduces over ``torch.cuda.current_device()`` and is a persistent worker that our crash
    tests would have to be rebuilt around (docs/training.md, "Asynchronous saves"). Its
    deprecation line ("MCore's async save is deprecated ...", logged once per process) is
    filtered for that reason."""
    if not has_async_strategy():
        return {}
    logging.getLogger("megatron.core.dist_checkpointing.strategies.torch").addFilter(
        _DropMcoreAsyncDeprecation())
    return {"async_strategy": "mcore"}


def writer_in_threads() -> bool:
    """0.17.0: ``FileSystemWriterAsync`` writes a save's buckets in threads
    (``write_preloaded_data_multithread``) and keeps only a failed bucket's error type."""
    from megatron.core.dist_checkpointing.strategies.filesystem_async import (
        FileSystemWriterAsync)

    return hasattr(FileSystemWriterAsync, "write_preloaded_data_multithread")


_writer_errors: list = []  # the OSErrors of this process's failed buckets


def _release_frames(error: BaseException) -> None:
    """Clear the locals of the finished frames ``error`` and the errors chained to it were
    raised through (the frame still running keeps its own)."""
    errors, seen = [error], set()
    while errors:
        error = errors.pop()
        if error is not None and id(error) not in seen:
            seen.add(id(error))
            traceback.clear_frames(error.__traceback__)
            errors += [error.__cause__, error.__context__]


def _bucket_result(output, file: str):
    """A bucket's ``(index, write results or error)``, its error named and freed of the
    bucket's data, and kept (:func:`writer_os_error`)."""
    error = output[1]
    if isinstance(error, BaseException):
        _release_frames(error)
        if isinstance(error, OSError):
            if error.filename is None:  # write(2) and fsync(2) name no file
                error.filename = file
            _writer_errors.append(error)
    return output


class _BucketResults:
    """The results queue of one bucket's writer, its result passed through
    :func:`_bucket_result` before it is put."""

    def __init__(self, results, file: str):
        self.results, self.file = results, file

    def put(self, output) -> None:
        self.results.put(_bucket_result(output, self.file))


def keep_writer_errors() -> None:
    """In the process that writes a save's buckets (idempotent; the writer processes forked
    later inherit it), make each failed bucket's error the one a full disk needs:

    * named: an OSError of write(2) or fsync(2) names no file; the bucket's file is set on it;
    * without the bucket's data: the frames it was raised through held a view of the data
      (torch writes a ``BytesIO.getbuffer()``), and from 0.17.0, where the bucket is written
      in the caller's process, the error and those frames stay in a reference cycle (the
      bucket's result, a local of the frame the error holds). CPython 3.12.0 and 3.12.1 crash
      when the garbage collector clears such a view (gh-111049, fixed in 3.12.2): the
      frames' locals are released when the error is made;
    * kept: from 0.17.0 the writer reports a failed bucket by its type alone;
      :func:`writer_os_error` gives the error back.

    A bucket's writer (``write_preloaded_data``) puts its result in a results queue (before
    0.17.0, in a forked process) or, the one bucket written in the calling thread from 0.17.0,
    returns it."""
    from megatron.core.dist_checkpointing.strategies.filesystem_async import (
        FileSystemWriterAsync)

    original = FileSystemWriterAsync.write_preloaded_data
    if getattr(original, "keeps_errors", False):
        return

    def write_bucket(*args, **kwargs):
        file = kwargs["write_bucket"][0]  # megatron-core passes the bucket by keyword
        if kwargs.get("results_queue") is not None:
            kwargs["results_queue"] = _BucketResults(kwargs["results_queue"], file)
        output = original(*args, **kwargs)
        return output if output is None else _bucket_result(output, file)

    write_bucket.keeps_errors = True
    FileSystemWriterAsync.write_preloaded_data = staticmethod(write_bucket)


def writer_os_error() -> Optional[OSError]:
    """The first OSError the writer met in this process since the last call, or None."""
    errors, _writer_errors[:] = list(_writer_errors), []
    return errors[0] if errors else None


def megatron_core_tokenizer(tokenizer_type: str, tokenizer_model: Optional[str] = None,
                            vocab_size: Optional[int] = None):
    """The tokenizer Megatron-LM of the installed release builds for ``--tokenizer-type``
    (megatron.core's ``build_tokenizer``, moved and with renamed flags in 0.17.0), with
    Megatron-LM's defaults: the reference our tokenizers are tested against."""
    common = dict(tokenizer_type=tokenizer_type, tokenizer_model=tokenizer_model,
                  tokenizer_sentencepiece_legacy=False, tokenizer_metadata=None,
                  metadata_path=None, vocab_file=None, merge_file=None, trust_remote_code=False,
                  vocab_size=vocab_size, chat_template=None, special_tokens=None)
    try:
        from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
    except ImportError:  # before 0.17.0
        from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer
        return build_tokenizer(argparse.Namespace(
            **common, tokenizer_special_tokens=None, tokenizer_hf_use_fast=False,
            tokenizer_hf_include_special_tokens=False))
    return build_tokenizer(argparse.Namespace(
        **common, tokenizer_hf_no_use_fast=True, tokenizer_hf_no_include_special_tokens=True,
        tokenizer_sentencepiece_ignore_extra_whitespaces=False, pad_vocab_size=False))


NULL_TOKENIZER_FILE = "tokenizers/text/libraries/null_tokenizer.py"  # in megatron/core


@functools.lru_cache(maxsize=None)
def null_tokenizer_counts(vocab_size: int) -> tuple[int, int]:
    """``(vocabulary size, EOD id)`` of the installed release's ``NullTokenizer(vocab_size)``:
    ``(V + 1, V)`` before 0.18.0, ``(V, V - 1)`` from it. Its module is loaded alone, from the
    installed package's file (it imports nothing of Megatron's): its package's ``__init__``
    imports every tokenizer library, on 0.19.x transformers too, about 1 s of CPU added to the
    start-up of every run that uses it."""
    import importlib.util

    import megatron.core

    path = Path(megatron.core.__file__).parent / NULL_TOKENIZER_FILE
    spec = importlib.util.spec_from_file_location("megatron_core_null_tokenizer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tokenizer = module.NullTokenizer(vocab_size)
    return tokenizer.vocab_size, tokenizer.eod


RAMP_CALCULATOR = "RampupBatchsizeNumMicroBatchesCalculator"


def has_batch_ramp() -> bool:
    """Whether the installed release has the batch-size ramp (removed in 0.18.0, with
    Megatron-LM's ``--rampup-batch-size``)."""
    from megatron.core import num_microbatches_calculator

    return hasattr(num_microbatches_calculator, RAMP_CALCULATOR)


def megatron_core_batch_ramp(global_batch_size: int, micro_batch_size: int,
                             data_parallel_size: int, rampup: list[int]):
    """Megatron-Core's ramp calculator (before 0.18.0), ``--rampup-batch-size START INCREMENT
    SAMPLES``: the reference our ramp is tested against."""
    from megatron.core import num_microbatches_calculator

    return getattr(num_microbatches_calculator, RAMP_CALCULATOR)(
        global_batch_size, micro_batch_size, data_parallel_size, False, 0, *rampup)


def reads_common_from_shards() -> bool:
    """0.19.0: a save's common objects are a ShardedObject of the torch_dist shards (no
    ``common.pt``); the release reads both forms."""
    from megatron.core.dist_checkpointing import serialization

    return '"common_state"' in inspect.getsource(serialization.load_common_state_dict)


def read_common_objects(path: str, written_by: Optional[str]) -> dict:
    """The common objects of the save ``path`` (``written_by``: the megatron-core release its
    manifest records, None when it predates the record). A save without ``common.pt`` under a
    release that needs it is refused before anything is read, naming both releases."""
    from megatron.core import dist_checkpointing

    if not os.path.isfile(os.path.join(path, COMMON_FILE)) and not reads_common_from_shards():
        raise CheckpointError(
            f"{path} was written with megatron-core {written_by or '0.19.0 or later'}, which "
            f"keeps a save's common objects inside its shards (no {COMMON_FILE}); the "
            f"installed megatron-core {installed_release()} cannot read it. Resume it under "
            f"megatron-core {written_by or '0.19'} (Python 3.12: pip install "
            f"'megatron-core>=0.19,<0.20'); a save of 0.16.1 resumes under 0.19, not the "
            f"reverse")
    try:
        return dist_checkpointing.load_common_state_dict(path)
    except pickle.UnpicklingError as e:
        raise CheckpointError(_unsafe_pickle(path, e)) from None


def _unsafe_pickle(path: str, error: pickle.UnpicklingError) -> str:
    """What to say of a save whose common objects torch's safe loader (``weights_only``)
    refused: the file, and the type it names."""
    common = os.path.join(path, COMMON_FILE)
    found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
    what = f"a pickled {found.group(1)}" if found else f"a pickle it refuses ({error})"
    return (f"{common if os.path.isfile(common) else path}: holds {what}, outside the types "
            f"torch loads safely (weights_only=True); fixedcode saves none, and nothing of it "
            f"was run. Load only checkpoints you trust; this one was not written by fixedcode "
            f"as it is")


def grad_sync_asks_cuda_stream() -> bool:
    """0.19.0: ``start_grad_sync`` waits on ``torch.cuda.current_stream()`` for every bucket
    group (local CUDA-graph replays), whether or not the run is on a GPU."""
    from megatron.core.distributed import param_and_grad_buffer

    source = inspect.getsource(param_and_grad_buffer)
    return "current_stream = torch.cuda.current_stream()" in source


@dataclasses.dataclass(frozen=True)
class Difference:
    """One difference between releases: what changed, the first release with it, and the
    question that asks the installed package whether it has it."""
    what: str
    since: str
    present: Callable[[], bool]


DIFFERENCES = (
    Difference("build_tokenizer in megatron.core.tokenizers.utils, flags renamed", "0.17.0",
               lambda: _module_exists("megatron.core.tokenizers.utils.build_tokenizer")),
    Difference("dist_checkpointing.save takes async_strategy (default nvrx)", "0.17.0",
               has_async_strategy),
    Difference("the save's writer runs in threads, a failed bucket reported by type", "0.17.0",
               writer_in_threads),
    Difference("a layer spec's mlp is a partial of MLP.as_mlp_submodule", "0.18.0",
               mlp_is_partial),
    Difference("NullTokenizer(V) counts V ids, EOD V - 1", "0.18.0",
               lambda: null_tokenizer_counts(8) == (8, 7)),
    Difference("no batch-size ramp (--rampup-batch-size)", "0.18.0",
               lambda: not has_batch_ramp()),
    Difference("a save's common objects are in its shards, no common.pt", "0.19.0",
               reads_common_from_shards),
    Difference("DDP's gradient sync asks for the current CUDA stream", "0.19.0",
               grad_sync_asks_cuda_stream),
)


def _module_exists(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
