"""Merge Megatron indexed datasets, in order, into one: ``{output_prefix}.bin/.idx``.

The bytes are those megatron.core's ``IndexedDatasetBuilder.add_index`` over the inputs followed
by ``finalize`` writes (what Megatron-LM's ``tools/merge_datasets.py`` writes), in memory bounded
by the largest input index, and nothing appears under the final name until it is whole. Merging
the datasets of ``tools/preprocess_data.py --shard I/N`` for I = 0 .. N-1, in that order, gives
the bytes one run over every input writes (slurm/preprocess_array.sh does both). The library:
megatron_ext/preprocess/merge.py.

    python -m tools.merge_datasets --input data/fineweb.shard-0000{0,1,2,3}_text_document \\
        --output-prefix data/fineweb_text_document
"""

from __future__ import annotations

import argparse
from typing import Optional

from megatron_ext.config.flag_fields import ShowDefaults, add_flags
from megatron_ext.preprocess.merge import merge_dataset_files
from megatron_ext.preprocess.preprocess_config import DatasetMerge
from megatron_ext.runtime.errors import exits_on_error


def parse_args(argv: Optional[list[str]] = None) -> DatasetMerge:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=ShowDefaults)
    add_flags(parser, DatasetMerge, required=("input", "output_prefix"))
    return DatasetMerge.from_flags(parser.parse_args(argv))


def main(argv: Optional[list[str]] = None) -> list:
    with exits_on_error():
        merge = parse_args(argv)
        indexes = merge_dataset_files(list(merge.input), merge.output_prefix)
        print(f"merged {len(indexes)} datasets: {sum(i.documents for i in indexes):,} documents, "
              f"{sum(i.tokens() for i in indexes):,} tokens -> {merge.output_prefix}.bin/.idx "
              f"({indexes[0].dtype.__name__})")
        return indexes


if __name__ == "__main__":
    main()
