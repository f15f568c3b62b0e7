"""datatrove's Megatron tokenizer as a user runs it, for bench/bench_preprocess.py.

Run with a Python that has datatrove (``--datatrove-python``), not this project's venv:
``python datatrove_worker.py INPUT TOKENIZER_JSON OUTPUT_FOLDER TASKS``. INPUT is a ``.jsonl``
file (``JsonlReader``) or a folder of ``*.parquet`` shards (``ParquetReader``); the pipeline is
the reader and ``MegatronDocumentTokenizer(output_folder, tokenizer_name_or_path=...)`` with
every other option at datatrove's default (``eos_token="<|endoftext|>"`` appended after each
document, ``batch_size=10000``), run by ``LocalPipelineExecutor(tasks=TASKS, workers=TASKS)``.
datatrove gives each task the files ``files[rank::tasks]`` and each task writes its own
``{rank:05d}_tokens.bin/.idx`` into OUTPUT_FOLDER; its logs go to OUTPUT_FOLDER/logs.
"""

import os
import sys
from multiprocess import forkserver  # datatrove pools with multiprocess, not multiprocessing

from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader, ParquetReader
from datatrove.pipeline.tokens import MegatronDocumentTokenizer


def main() -> None:
    source, tokenizer, output, tasks = sys.argv[1:]
    if os.path.isdir(source):
        reader = ParquetReader(source, glob_pattern="*.parquet")
    else:
        reader = JsonlReader(os.path.dirname(source), glob_pattern=os.path.basename(source))
    LocalPipelineExecutor(
        pipeline=[reader, MegatronDocumentTokenizer(output, tokenizer_name_or_path=tokenizer)],
        tasks=int(tasks), workers=int(tasks), logging_dir=os.path.join(output, "logs"),
    ).run()
    # Its workers are children of multiprocess's fork server: stopping (and waiting for) the
    # server here brings their CPU time into this process's children, where the timer reads it.
    forkserver._forkserver._stop()


if __name__ == "__main__":
    main()
