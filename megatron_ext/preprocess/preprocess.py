"""The preprocessing job of tools/preprocess_data.py (which describes what it writes and
guarantees): inputs cut into tasks and encoded in order by a pool of worker processes
(:mod:`.tasks`; :mod:`.encode`: gigatoken where it gives the reference library's ids,
``--encoder``), which write the tokens into a resumable work folder whose parts this process
completes from their answers (:mod:`.parts`), then merged and published under the final names
(:mod:`.merge`). This process reads no input that a worker can read itself and moves no token.
Neither megatron.core nor torch is imported.
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing
import os
import sys
import threading
import time
from typing import Iterator, Optional

from tqdm import tqdm

from ..codes.limits import check_vocab_fits
from ..datasets.tokenizer import tokenizer_from_args
from ..runtime.errors import DataError, FlagError
from ..runtime.files import file_fingerprint

from ..datasets.indexed import optimal_dtype
from .character_table import TABLE_FROM_BYTES, character_table
from .encode import TaskResult, gigatoken_encoder, init_worker
from .gigatoken_encoder import GigatokenEncoder, gigatoken_version
from .merge import merge_datasets, publish_dataset
from .parts import WorkDir, dataset_prefix
from .preprocess_config import PreprocessConfig
from .readers import describe_bad_input, expand_inputs, input_kind
from .shards import shard_inputs
from .tasks import plan_tasks, run_in_order, task_bytes


@dataclasses.dataclass
class Summary:
    """What a run produced (also printed)."""

    outputs: dict  # {key: dataset prefix}
    dtype: str
    documents: int
    tokens: dict  # {key: tokens}
    max_token_id: int  # -1 without tokens
    bad_lines: dict  # {kind: count}, skipped with --skip-bad-lines
    parts: int
    resumed_documents: int  # taken from complete parts of an interrupted run
    code_bits: int
    code_warning: Optional[str]  # why a --code-bits fixed code would not fit this tokenizer
    encoder: str  # what encoded the texts gigatoken did not: the reference library
    gigatoken: Optional[str]  # gigatoken's version when it encoded what it could, else None
    gigatoken_note: Optional[str]  # why it did not (--encoder reference, a tokenizer it lacks)
    reference_documents: int  # documents with a text the reference encoded
    verified_documents: int  # documents gigatoken encoded that the reference encoded again

    def report(self) -> str:
        """What tools/preprocess_data.py prints: documents, parts, tokens and dataset of each
        key, the largest token id against 2^code_bits, the skipped bad lines."""
        resumed = (f"; {self.resumed_documents:,} from an interrupted run"
                   if self.resumed_documents else "")
        parts = f"{self.parts} part{'s' if self.parts > 1 else ''}"
        lines = [f"preprocessed {self.documents:,} documents in {parts}{resumed}"]
        for key, prefix in self.outputs.items():
            lines.append(f"  {key}: {self.tokens[key]:,} tokens -> {prefix}.bin/.idx "
                         f"({self.dtype})")
        lines.append(f"  max token id {self.max_token_id} "
                     f"{'<' if self.max_token_id < 2 ** self.code_bits else '>='} "
                     f"2^{self.code_bits}")
        if self.gigatoken:
            lines.append(f"  encoders: gigatoken {self.gigatoken} "
                         f"{self.documents - self.reference_documents:,} documents, reference "
                         f"({self.encoder}) {self.reference_documents:,}; "
                         f"{self.verified_documents:,} verified against the reference")
        else:
            lines.append(f"  encoder: reference ({self.encoder}) {self.documents:,} documents; "
                         f"not gigatoken: {self.gigatoken_note}")
        if self.bad_lines:
            kinds = ", ".join(f"{n:,} {kind}" for kind, n in sorted(self.bad_lines.items()))
            lines.append(f"  skipped {sum(self.bad_lines.values()):,} bad lines: {kinds}")
        return "\n".join(lines)


class _Progress:
    """A tqdm bar over input bytes on disk, with documents, tokens and text megabytes per second."""

    def __init__(self, paths: list[str], start_input: int):
        sizes = [os.path.getsize(path) for path in paths]
        self.bar = tqdm(total=sum(sizes), initial=sum(sizes[:start_input]), unit="B",
                        unit_scale=True, desc="preprocess",
                        mininterval=1 if sys.stderr.isatty() else 30,  # a line per 30 s in logs
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                                   "[{elapsed}<{remaining}{postfix}]")
        self.start = time.monotonic()
        self.documents = self.tokens = self.text_bytes = 0

    def update(self, batch: TaskResult) -> None:
        self.documents += batch.documents
        self.tokens += sum(written.tokens for written in batch.keys.values())
        self.text_bytes += batch.text_bytes
        elapsed = max(time.monotonic() - self.start, 1e-9)
        self.bar.set_postfix_str(
            f"{self.documents / elapsed:,.0f} docs/s, {self.tokens / elapsed:,.0f} tokens/s, "
            f"{self.text_bytes / elapsed / 1e6:.1f} MB/s", refresh=False)
        self.bar.update(batch.disk_bytes)

    def close(self) -> None:
        self.bar.close()


def choose_encoder(tokenizer, requested: str) -> "GigatokenEncoder | str":
    """The gigatoken encoder (``--encoder``), or why gigatoken does not encode."""
    if requested == "reference":
        return "--encoder reference"
    made = gigatoken_encoder(tokenizer)
    if isinstance(made, str) and requested == "gigatoken":
        raise FlagError(f"--encoder gigatoken: {made}; pass --encoder auto or reference")
    return made


def reference_library(tokenizer) -> str:
    """The library whose ids are the reference for ``tokenizer``."""
    name = type(tokenizer).__name__
    return {"SentencePieceTokenizer": "sentencepiece", "HuggingFaceTokenizer": "tokenizers",
            "GPT2BPETokenizer": "tokenizers"}.get(name, name)


def _pool(config: PreprocessConfig, tokenizer, folder: str, gigatoken: bool,
          table: Optional[tuple[str, str]]):
    """The worker processes: ``--workers`` of them, each initialized to encode (with
    gigatoken's character table ``table``)."""
    # fork (as Megatron-LM's tool) from this tool's single-threaded process; a caller with
    # threads of its own (a notebook, the tests) gets a fork server: a child forked beside
    # other threads can inherit a lock one of them held and hang
    method = "fork" if threading.active_count() == 1 else "forkserver"
    eod = tokenizer.eod if config.append_eod else None
    return multiprocessing.get_context(method).Pool(
        config.workers, initializer=init_worker,
        initargs=(tokenizer, config.json_keys, eod, gigatoken, config.verify_fraction, folder,
                  table))


def _encode_parts(config: PreprocessConfig, paths: list[str], tokenizer, dtype, work: WorkDir,
                  done: list[dict], pool) -> list[dict]:
    """Encode the inputs after the complete parts ``done`` into new parts: their manifests."""
    start_input, after_line, after_offset = (
        (done[-1]["end_input"], done[-1]["end_line"], done[-1].get("end_offset")) if done
        else (0, 0, 0))
    manifests, index = [], len(done)
    part = work.new_part(config.json_keys, dtype)
    progress = _Progress(paths, start_input)
    size = task_bytes(sum(os.path.getsize(path) for path in paths[start_input:]),
                      config.workers, config.part_tokens)
    try:
        tasks = plan_tasks(paths, config.text_document, config.json_keys, start_input, after_line,
                           after_offset, size)
        for result in run_in_order(pool, tasks, window=2 * config.workers):
            if result.bad and not config.skip_bad_lines:
                input_index, *bad = result.bad[0]
                where = describe_bad_input(paths[input_index], *bad)
                raise DataError(f"{where}; fix it or pass --skip-bad-lines, and rerun "
                                "with --resume to keep the work done")
            if result.differences:
                input_index, line, key = result.differences[0]
                raise DataError(
                    f"{paths[input_index]}:{line}: gigatoken's ids differ from the "
                    f"reference library's ({reference_library(tokenizer)}) for key {key!r} "
                    "(--verify-fraction); nothing is published: rerun with --encoder reference "
                    "(and --resume to keep the work done), and please report the line")
            part.add(result)
            progress.update(result)
            if part.is_full(config.part_tokens):
                manifests.append(work.complete_part(index, part, result.end_input,
                                                    result.end_line, result.end_offset,
                                                    final=False))
                index += 1
                part = work.new_part(config.json_keys, dtype)
    finally:
        progress.close()
    manifests.append(work.complete_part(index, part, len(paths) - 1, 0, None, final=True))
    return manifests


def _summarize(config: PreprocessConfig, manifests: list[dict], resumed: int, tokenizer, dtype,
               gigatoken_note: Optional[str]) -> Summary:
    bad_lines = collections.Counter()
    for manifest in manifests:
        bad_lines.update(manifest["bad_lines"])
    try:
        check_vocab_fits(tokenizer.vocab_size, config.code_bits)
        code_warning = None
    except ValueError as e:
        code_warning = str(e)
    return Summary(
        outputs={key: dataset_prefix(config.output_prefix, key) for key in config.json_keys},
        dtype=dtype.__name__, documents=sum(m["documents"] for m in manifests),
        tokens={key: sum(m["tokens"][key] for m in manifests) for key in config.json_keys},
        max_token_id=max(m["max_token_id"] for m in manifests), bad_lines=dict(bad_lines),
        parts=len(manifests), resumed_documents=resumed, code_bits=config.code_bits,
        code_warning=code_warning, encoder=reference_library(tokenizer),
        gigatoken=None if gigatoken_note else gigatoken_version(), gigatoken_note=gigatoken_note,
        # parts written before gigatoken record no count: the reference encoded them
        reference_documents=sum(m.get("reference_documents", m["documents"]) for m in manifests),
        verified_documents=sum(m.get("verified_documents", 0) for m in manifests))


def check_inputs(paths: list[str], json_keys: tuple[str, ...]) -> None:
    """The checks of the flags that need the inputs found: a plain-text input has one text."""
    for path in paths:
        if input_kind(path) == "text" and len(json_keys) > 1:
            raise FlagError(f"--json-keys: plain-text input {path} has one text; "
                            "give one key")


def preprocess(config: PreprocessConfig) -> Summary:
    """Run the job ``config`` (tools/preprocess_data.py's flags) describes; what it produced."""
    config.validate()
    paths = expand_inputs(config.input)
    if config.shard is not None:
        paths = shard_inputs(paths, config.shard)
    check_inputs(paths, config.json_keys)
    tokenizer = tokenizer_from_args(config.tokenizer)
    dtype = optimal_dtype(tokenizer.vocab_size)
    made = choose_encoder(tokenizer, config.encoder)
    gigatoken_note = made if isinstance(made, str) else None
    table = None if gigatoken_note else character_table(
        made, tokenizer, config.tokenizer.tokenizer_model or config.tokenizer.vocab_file,
        compute=sum(map(os.path.getsize, paths)) >= TABLE_FROM_BYTES)

    work = WorkDir(config.output_prefix)
    settings = {"--tokenizer-type": config.tokenizer.tokenizer_type,
                "--vocab-size": config.tokenizer.vocab_size,
                **{flag: path and [os.path.abspath(path), file_fingerprint(path)]
                   for flag, path in (("--tokenizer-model", config.tokenizer.tokenizer_model),
                                      ("--vocab-file", config.tokenizer.vocab_file),
                                      ("--merge-file", config.tokenizer.merge_file))},
                "--append-eod": config.append_eod, "--json-keys": list(config.json_keys),
                "--text-document": config.text_document}
    inputs = [[os.path.abspath(path), file_fingerprint(path)] for path in paths]
    manifests = work.start(settings, inputs, config.resume)
    resumed = sum(m["documents"] for m in manifests)
    filled = None
    pool = _pool(config, tokenizer, work.path, gigatoken_note is None, table)
    try:
        if not (manifests and manifests[-1]["final"]):
            manifests += _encode_parts(config, paths, tokenizer, dtype, work, manifests, pool)
        filled = [manifest for manifest in manifests if manifest["documents"]]
        for key in config.json_keys if filled else []:
            merge_datasets([(work.part_prefix(m["part"], key),
                             [(os.path.join(work.path, name), offset, nbytes)
                              for name, offset, nbytes in work.segments(m, key)])
                            for m in filled], work.merged_prefix(key), pool.imap_unordered)
    finally:
        pool.terminate()
    if not filled:
        work.remove()
        raise DataError(f"the {len(paths)} input files hold no documents: nothing to "
                        "write")
    for key in config.json_keys:
        publish_dataset(work.merged_prefix(key), dataset_prefix(config.output_prefix, key))
    work.remove()

    return _summarize(config, manifests, resumed, tokenizer, dtype, gigatoken_note)
