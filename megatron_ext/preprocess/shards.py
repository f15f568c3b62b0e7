"""``--shard I/N`` of tools/preprocess_data.py: the input files that node ``I`` of a job split
over ``N`` nodes (a Slurm array: slurm/preprocess_array.sh) takes.

Shard ``I`` takes a contiguous run of the input files, in the order the tool reads them
(``--input`` as given, globs and folders sorted): files ``floor(I*F/N)`` to
``floor((I+1)*F/N) - 1`` of the ``F``. Each file is in exactly one shard, every shard holds one
file at least (``N <= F``), and the shards in order are the inputs in order, so their
datasets, merged in shard order (tools/merge_datasets.py, megatron_ext/preprocess/merge.py), are
the bytes one run over every input writes. The unit is a file: a corpus meant for many nodes
comes as many shards (FineWeb-Edu, SmolLM-Corpus and DCLM do), of about equal size.
"""

from __future__ import annotations

import re

from ..runtime.errors import FlagError


def parse_shard(text: str) -> tuple[int, int]:
    """``(I, N)`` of ``--shard I/N``, with ``0 <= I < N``."""
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match or not int(match[1]) < int(match[2]):
        raise FlagError(f"--shard {text}: give I/N, this node's index I from 0 to N-1 and the "
                        "number of nodes N (a Slurm array: $SLURM_ARRAY_TASK_ID/"
                        "$SLURM_ARRAY_TASK_COUNT)")
    return int(match[1]), int(match[2])


def shard_inputs(paths: list[str], shard: str) -> list[str]:
    """The input files of ``--shard`` ``shard`` among ``paths`` (the module docstring)."""
    index, count = parse_shard(shard)
    if count > len(paths):
        raise FlagError(f"--shard {shard}: {count} shards of {len(paths)} input files; a shard "
                        f"takes whole files: use at most {len(paths)} shards")
    return paths[index * len(paths) // count:(index + 1) * len(paths) // count]
