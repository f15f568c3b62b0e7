"""Each difference between the megatron-core releases fixedcode supports, asked of the installed
package (megatron_ext/runtime/megatron_compat.py), agrees with the release it appeared in: on
the 0.16.1 leg none is present, on the 0.19.x leg all are. And no module but the compat module
touches a name that moved."""

from __future__ import annotations

import errno
import re

import pytest
from packaging.version import Version

from conftest import REPO
from megatron_ext.runtime import megatron_compat
from megatron_ext.runtime.megatron_compat import DIFFERENCES, installed_release


def test_the_installed_release_is_in_the_supported_range():
    pin = re.search(r'"megatron-core>=([\d.]+),<([\d.]+)"',
                    (REPO / "pyproject.toml").read_text()).groups()
    assert Version(pin[0]) <= Version(installed_release()) < Version(pin[1])


@pytest.mark.parametrize("difference", DIFFERENCES, ids=lambda d: f"{d.since} {d.what}")
def test_each_difference_is_found_where_its_release_has_it(difference):
    assert difference.present() == (Version(installed_release()) >= Version(difference.since))


def test_the_mlp_submodules_are_found_in_every_release_and_replaced_in_place():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    fc1 = megatron_compat.mlp_submodules(spec).linear_fc1
    megatron_compat.mlp_submodules(spec).linear_fc2 = "replaced"
    assert megatron_compat.mlp_submodules(spec).linear_fc2 == "replaced"
    assert megatron_compat.mlp_submodules(spec).linear_fc1 is fc1


@pytest.mark.parametrize("vocab_size", [1, 8, 50257])
def test_the_null_tokenizer_loaded_alone_counts_as_its_package_class(vocab_size):
    """null_tokenizer_counts loads NullTokenizer's file alone (not its package, which imports
    every tokenizer library): the same counts as the class the package exports."""
    from megatron.core.tokenizers.text.libraries import NullTokenizer

    packaged = NullTokenizer(vocab_size)
    assert megatron_compat.null_tokenizer_counts(vocab_size) == (packaged.vocab_size,
                                                                 packaged.eod)


# Names that moved or went between the supported releases: only the compat module says them.
MOVED = ("tokenizers.text.utils", "tokenizers.utils.build_tokenizer", "as_mlp_submodule",
         "async_strategy", "load_common_state_dict", "RampupBatchsize",
         "tokenizer_hf_use_fast", "tokenizer_hf_no_use_fast")


def test_only_the_compat_module_touches_a_moved_name():
    sources = [p for folder in ("megatron_ext", "tools", "tests", "bench", "examples")
               for p in (REPO / folder).rglob("*.py")] + [REPO / "pretrain_fixedcode.py"]
    touching = sorted(f"{p.relative_to(REPO)}: {name}" for p in sources
                      for name in MOVED if name in p.read_text(encoding="utf-8")
                      and p.name not in ("megatron_compat.py", "test_megatron_compat.py"))
    assert touching == []


@pytest.mark.skipif(not megatron_compat.writer_in_threads(), reason="before megatron-core "
                    "0.17.0 each bucket is written in a forked process, which exits after it")
def test_a_bucket_failed_on_a_full_disk_leaves_no_view_of_its_data_alive():
    """/dev/full: a real ENOSPC on the write of a bucket's bytes. megatron-core 0.17.0 on keeps
    the error in the caller's process, whose traceback held the frame that wrote the data's
    ``getbuffer()`` view: a view kept in a reference cycle, which CPython 3.12.0 and 3.12.1 crash
    on when the garbage collector clears it (gh-111049). Once the error is kept, no view of the
    data is left: the BytesIO can grow again, and its error names ENOSPC and the file."""
    import io
    import queue

    from megatron.core.dist_checkpointing.strategies.filesystem_async import (
        FileSystemWriterAsync)
    from torch.distributed.checkpoint.filesystem import _StorageWriterTransforms
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import WriteItem, WriteItemType

    megatron_compat.keep_writer_errors()
    data = io.BytesIO(bytes(1 << 20))  # past the file's buffer: written, and failed, at once
    item = WriteItem(index=MetadataIndex("common"), type=WriteItemType.BYTE_IO)
    count = queue.Queue()
    count.put(0)
    FileSystemWriterAsync.write_preloaded_data(  # as megatron-core calls it
        [_StorageWriterTransforms()], local_proc_idx=0,
        write_bucket=("/dev/full", "full", ([(item, data)], [])), results_queue=queue.Queue(),
        count_queue=count, use_fsync=True)
    error = megatron_compat.writer_os_error()
    assert error.errno == errno.ENOSPC and error.filename == "/dev/full"
    data.write(b"more")  # BufferError while a view of it is alive
