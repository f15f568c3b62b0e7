"""The preprocessing job of tools/preprocess_data.py (which describes what it writes and
guarantees): inputs encoded in order by a pool of worker processes (:mod:`.encode`: gigatoken
where it gives the reference library's ids, ``--encoder``) into the parts of a resumable work
folder (:mod:`.parts`), then merged and published under the final names (:mod:`.merge`). Neither
megatron.core nor torch is imported.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import multiprocessing
import os
import sys
import threading
import time
from typing import Iterator, Optional

from tqdm import tqdm

from ..codes.limits import check_options, check_vocab_fits
from ..datasets.tokenizer import tokenizer_from_args
from ..runtime.errors import DataError, FlagError
from ..runtime.files import file_fingerprint

from ..datasets.indexed import optimal_dtype
from .encode import EncodedBatch, encode_batch, gigatoken_encoder, init_worker
from .gigatoken_encoder import gigatoken_version
from .merge import merge_datasets, publish_dataset
from .parts import WorkDir, dataset_prefix
from .readers import describe_bad_input, expand_inputs, input_kind, iter_batches

ENCODERS = ("auto", "gigatoken", "reference")  # --encoder


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


def _in_order(pool, batches: Iterator, window: int) -> Iterator[EncodedBatch]:
    """encode_batch over ``batches`` in order, with at most ``window`` batches in flight, input
    and results alike (Pool.imap would let results pile up whenever writing lags behind)."""
    pending = collections.deque()
    for batch in batches:
        pending.append(pool.apply_async(encode_batch, (batch,)))
        if len(pending) >= window:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


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

    def update(self, batch: EncodedBatch) -> None:
        self.documents += batch.documents
        self.tokens += sum(len(encoded.tokens) for encoded in batch.keys.values())
        self.text_bytes += batch.text_bytes
        elapsed = max(time.monotonic() - self.start, 1e-9)
        self.bar.set_postfix_str(
            f"{self.documents / elapsed:,.0f} docs/s, {self.tokens / elapsed:,.0f} tokens/s, "
            f"{self.text_bytes / elapsed / 1e6:.1f} MB/s", refresh=False)
        self.bar.update(batch.disk_bytes)

    def close(self) -> None:
        self.bar.close()


def choose_encoder(tokenizer, requested: str) -> tuple[Optional[bool], Optional[str]]:
    """Whether gigatoken encodes (``--encoder``): None if not, else whether in batches (which
    return awkward arrays); and why not."""
    if requested == "reference":
        return None, "--encoder reference"
    made = gigatoken_encoder(tokenizer)
    if isinstance(made, str) and requested == "gigatoken":
        raise FlagError(f"--encoder gigatoken: {made}; pass --encoder auto or reference")
    return (None, made) if isinstance(made, str) else (made.batched, None)


def reference_library(tokenizer) -> str:
    """The library whose ids are the reference for ``tokenizer``."""
    name = type(tokenizer).__name__
    return {"SentencePieceTokenizer": "sentencepiece", "HuggingFaceTokenizer": "tokenizers",
            "GPT2BPETokenizer": "tokenizers"}.get(name, name)


def _encode_parts(args, paths: list[str], tokenizer, dtype, work: WorkDir,
                  done: list[dict], batched: Optional[bool]) -> list[dict]:
    """Encode the inputs after the complete parts ``done`` into new parts: their manifests
    (gigatoken encodes unless ``batched`` is None)."""
    start_input, after_line = (done[-1]["end_input"], done[-1]["end_line"]) if done else (0, 0)
    eod = tokenizer.eod if args.append_eod else None
    manifests, index = [], len(done)
    part = work.new_part(index, args.json_keys, dtype)
    # fork (as Megatron-LM's tool) from this tool's single-threaded process; a caller with
    # threads of its own (a notebook, the tests) gets a fork server: a child forked beside
    # other threads can inherit a lock one of them held and hang
    method = "fork" if threading.active_count() == 1 else "forkserver"
    if batched and method == "fork":
        # imported once, before the workers fork: each would import it at its first batch
        # (awkward, which gigatoken's batches return, is 0.3 s of CPU)
        import awkward  # noqa: F401
    pool = multiprocessing.get_context(method).Pool(
        args.workers, initializer=init_worker,
        initargs=(tokenizer, args.json_keys, eod, batched is not None, args.verify_fraction))
    progress = _Progress(paths, start_input)
    try:
        batches = iter_batches(paths, args.text_document, args.json_keys, start_input, after_line)
        for encoded in _in_order(pool, batches, window=2 * args.workers):
            if encoded.bad and not args.skip_bad_lines:
                where = describe_bad_input(paths[encoded.input_index], *encoded.bad[0])
                raise DataError(f"{where}; fix it or pass --skip-bad-lines, and rerun "
                                "with --resume to keep the work done")
            if encoded.differences:
                line, key = encoded.differences[0]
                raise DataError(
                    f"{paths[encoded.input_index]}:{line}: gigatoken's ids differ from the "
                    f"reference library's ({reference_library(tokenizer)}) for key {key!r} "
                    "(--verify-fraction); nothing is published: rerun with --encoder reference "
                    "(and --resume to keep the work done), and please report the line")
            part.write(encoded)
            progress.update(encoded)
            if part.is_full(args.part_tokens):
                manifests.append(work.complete_part(index, part, encoded.input_index,
                                                    encoded.end_line, final=False))
                index += 1
                part = work.new_part(index, args.json_keys, dtype)
    finally:
        pool.terminate()
        progress.close()
        part.close()
    manifests.append(work.complete_part(index, part, len(paths) - 1, 0, final=True))
    return manifests


def _summarize(args, manifests: list[dict], resumed: int, tokenizer, dtype,
               gigatoken_note: Optional[str]) -> Summary:
    bad_lines = collections.Counter()
    for manifest in manifests:
        bad_lines.update(manifest["bad_lines"])
    try:
        check_vocab_fits(tokenizer.vocab_size, args.code_bits)
        code_warning = None
    except ValueError as e:
        code_warning = str(e)
    return Summary(
        outputs={key: dataset_prefix(args.output_prefix, key) for key in args.json_keys},
        dtype=dtype.__name__, documents=sum(m["documents"] for m in manifests),
        tokens={key: sum(m["tokens"][key] for m in manifests) for key in args.json_keys},
        max_token_id=max(m["max_token_id"] for m in manifests), bad_lines=dict(bad_lines),
        parts=len(manifests), resumed_documents=resumed, code_bits=args.code_bits,
        code_warning=code_warning, encoder=reference_library(tokenizer),
        gigatoken=None if gigatoken_note else gigatoken_version(), gigatoken_note=gigatoken_note,
        # parts written before gigatoken record no count: the reference encoded them
        reference_documents=sum(m.get("reference_documents", m["documents"]) for m in manifests),
        verified_documents=sum(m.get("verified_documents", 0) for m in manifests))


def preprocess(args: argparse.Namespace) -> Summary:
    """Run the job the flags of tools/preprocess_data.py describe; what it produced."""
    check_options(args.code_bits, scale=1.0)
    if not 0 <= args.verify_fraction <= 1:
        raise FlagError(f"--verify-fraction {args.verify_fraction}: a share of the documents, "
                        "from 0 to 1")
    if len(set(args.json_keys)) < len(args.json_keys):
        raise FlagError(f"--json-keys {' '.join(args.json_keys)}: a key is given "
                        "twice")
    paths = expand_inputs(args.input)
    for path in paths:
        if input_kind(path) == "text" and len(args.json_keys) > 1:
            raise FlagError(f"--json-keys: plain-text input {path} has one text; "
                            "give one key")
    tokenizer = tokenizer_from_args(args)
    dtype = optimal_dtype(tokenizer.vocab_size)
    batched, gigatoken_note = choose_encoder(tokenizer, args.encoder)

    work = WorkDir(args.output_prefix)
    settings = {"--tokenizer-type": args.tokenizer_type, "--vocab-size": args.vocab_size,
                **{flag: path and [os.path.abspath(path), file_fingerprint(path)]
                   for flag, path in (("--tokenizer-model", args.tokenizer_model),
                                      ("--vocab-file", args.vocab_file),
                                      ("--merge-file", args.merge_file))},
                "--append-eod": args.append_eod, "--json-keys": args.json_keys,
                "--text-document": args.text_document}
    inputs = [[os.path.abspath(path), file_fingerprint(path)] for path in paths]
    manifests = work.start(settings, inputs, args.resume)
    resumed = sum(m["documents"] for m in manifests)
    if not (manifests and manifests[-1]["final"]):
        manifests += _encode_parts(args, paths, tokenizer, dtype, work, manifests, batched)

    filled = [i for i, manifest in enumerate(manifests) if manifest["documents"]]
    if not filled:
        work.remove()
        raise DataError(f"the {len(paths)} input files hold no documents: nothing to "
                        "write")
    for key in args.json_keys:
        merge_datasets([work.part_prefix(i, key) for i in filled], work.merged_prefix(key))
    for key in args.json_keys:
        publish_dataset(work.merged_prefix(key), dataset_prefix(args.output_prefix, key))
    work.remove()

    return _summarize(args, manifests, resumed, tokenizer, dtype, gigatoken_note)
