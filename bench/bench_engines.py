"""The demo's exports in the engines themselves, each with its default options, against
transformers (5, this environment): for each arm (``learned`` as it is, ``binary`` and ``gf2``
``--as-table``), llama.cpp's own tokenization of six texts (BOS as the GGUF says) and its
logits of two rows of 64 ids from GGUFs in the converter's default type (``auto``: 16-bit),
f32 and q8_0, with the KV cache in f16 (llama.cpp's default) and f32; CTranslate2's
log-probabilities of the same rows in float32 (the converter's default: the weights' type) and
int8::

    make demo engines                       # the checkpoints; .venv-engines
    .venv/bin/python bench/bench_engines.py --workdir /tmp/engines

llama.cpp runs through llama-cpp-python 0.3.36, built from its sdist once into
``--llama-venv`` (about 11 minutes of two cores here; kept for later runs). Writes
``engines.json`` and ``engines.md`` in ``--workdir`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
ARMS = {"learned": [], "binary": ["--as-table"], "gf2": ["--as-table"]}
TEXTS = ["If music be the food of love, play on;",
         "To be, or not to be, that is the question:",
         "Now is the winter of our discontent\nMade glorious summer by this sun of York;",
         "The quick brown fox jumps over the lazy dog.",
         "  double  spaces, ünïcödé and digits 12345",
         "Naïve café — “quoted” 漢字 🎭 </s>"]
ROW_TEXT = ("What light through yonder window breaks? It is the east, and Juliet is the sun. "
            "Arise, fair sun, and kill the envious moon, who is already sick and pale with "
            "grief, that thou her maid art far more fair than she.")
ROW_LENGTH = 64


def llama_venv(path: Path) -> Path:
    """The Python of a venv with llama-cpp-python, built from its sdist when missing."""
    python = path / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import llama_cpp"]).returncode == 0:
        return python
    print(f"building {LLAMA_CPP_PYTHON} into {path} (about 11 minutes on 2 cores)", flush=True)
    start = time.time()
    subprocess.run([sys.executable, "-m", "venv", path], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-binary", "llama-cpp-python",
                    LLAMA_CPP_PYTHON], check=True,
                   env={"CMAKE_ARGS": "-DGGML_NATIVE=ON -DLLAMA_CURL=OFF", "MAKEFLAGS": "-j2",
                        **__import__("os").environ})
    print(f"built in {time.time() - start:.0f} s", flush=True)
    return python


def reference(hf_dir: Path) -> dict:
    """transformers' ids of the texts and logits of the rows (fp32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    ids = tokenizer(" ".join([ROW_TEXT] * 4))["input_ids"]
    rows = [ids[:ROW_LENGTH], ids[len(ids) - ROW_LENGTH:]]
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor(rows)).logits.float()
    return {"ids": [tokenizer(text)["input_ids"] for text in TEXTS], "rows": rows,
            "logits": logits, "bos": tokenizer.bos_token_id}


def compare(ref: dict, logits: list) -> dict:
    import torch
    got = torch.tensor(logits)
    return {"max_abs_logit_diff": float((got - ref["logits"]).abs().max()),
            "top1_agree": float((got.argmax(-1) == ref["logits"].argmax(-1)).float().mean())}


def compare_log_probs(ref: dict, log_probs: list) -> float:
    import torch
    logp = torch.log_softmax(ref["logits"], -1)
    want = torch.tensor([[float(logp[r, i, row[i + 1]]) for i in range(len(row) - 1)]
                         for r, row in enumerate(ref["rows"])])
    return float((torch.tensor(log_probs) - want).abs().max())


def bench_arm(arm: str, demo: Path, work: Path, engines: str, llama: Path) -> dict:
    hf_dir = work / "hf" / arm
    if not hf_dir.exists():
        subprocess.run([sys.executable, REPO / "tools/convert_to_hf.py", "--load",
                        demo / "checkpoints" / arm, "--output", hf_dir, *ARMS[arm]], check=True)
    ref = reference(hf_dir)
    (work / "texts.json").write_text(json.dumps(TEXTS), encoding="utf-8")
    (work / f"{arm}.ids.json").write_text(json.dumps(ref["rows"]))
    read = json.loads(subprocess.run(
        [engines, REPO / "bench/engines_worker.py", "--hf", hf_dir, "--work", work / arm,
         "--texts", work / "texts.json", "--ids", work / f"{arm}.ids.json", "--gguf",
         "--gguf-outtype", "f32", "q8_0", "--ct2", "--ct2-quantization", "int8"],
        check=True, capture_output=True, text=True).stdout)
    ggufs = {kind: read[key]["file"] for kind, key in
             (("auto", "gguf"), ("f32", "gguf_f32"), ("q8_0", "gguf_q8_0"))
             if read[key]["converted"]}
    ran = json.loads(subprocess.run(
        [llama, REPO / "bench/llama_cpp_worker.py", "--gguf", *ggufs.values(), "--texts",
         work / "texts.json", "--ids", work / f"{arm}.ids.json"],
        check=True, capture_output=True, text=True).stdout)
    first = ran[ggufs["auto"]]
    result = {"arm": arm, "export": "stock Llama" + (" (--as-table)" if ARMS[arm] else ""),
              "gguf_add_bos": read["gguf"]["add_bos_token"],
              "gguf_types": read["gguf"]["tensor_types"],
              "tokens_agree": sum(a == b for a, b in zip(first["tokens"], ref["ids"])),
              "texts": len(TEXTS), "bos_prepended": sum(bool(t) and t[0] == ref["bos"]
                                                         for t in first["tokens"])}
    for kind, path in ggufs.items():
        for kv in ("f16", "f32"):
            result[f"llama_{kind}_kv_{kv}"] = compare(ref, ran[path][f"logits_kv_{kv}"])
    for key in ("ct2", "ct2_int8"):
        result[key] = compare_log_probs(ref, read[key]["log_probs"])
    return result


def markdown(results: list, header: str) -> str:
    lines = [header, "",
             "| arm | export | llama.cpp tokens = transformers (BOS added) | GGUF auto, KV f16 "
             "(default) | GGUF f32, KV f32 | GGUF f32, KV f16 | q8_0, KV f16 | CTranslate2 "
             "float32 | CTranslate2 int8 |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        def cell(key):
            c = r[key]
            return f"{c['max_abs_logit_diff']:.2g} (top-1 {100 * c['top1_agree']:.0f}%)"
        lines.append(
            f"| {r['arm']} | {r['export']} | {r['tokens_agree']}/{r['texts']} "
            f"({r['bos_prepended']}) | {cell('llama_auto_kv_f16')} | {cell('llama_f32_kv_f32')} "
            f"| {cell('llama_f32_kv_f16')} | {cell('llama_q8_0_kv_f16')} | {r['ct2']:.2g} "
            f"| {r['ct2_int8']:.2g} |")
    lines += ["", "llama.cpp columns: max |logit − transformers' logit| over 2 rows × 64 ids "
              "(top-1: positions whose argmax agrees); CTranslate2: max |log-prob − "
              "transformers'| of each next id. GGUF `auto` is the converter's default type "
              f"({', '.join(results[0]['gguf_types'])} tensors here)."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", default=str(REPO / "demo"), help="the demo's folder "
                        "(make demo): its checkpoints are exported")
    parser.add_argument("--workdir", required=True, help="a folder for exports and GGUFs")
    parser.add_argument("--engines-python", default=str(REPO / ".venv-engines/bin/python"),
                        help="the Python of make engines' venv")
    parser.add_argument("--llama-venv", default=str(REPO / ".venv-llama-cpp"),
                        help="a venv with llama-cpp-python (built here when missing)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS),
                        help="the demo's arms to export and compare")
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    llama = llama_venv(Path(args.llama_venv))
    start = time.time()
    results = [bench_arm(arm, Path(args.demo), work, args.engines_python, llama)
               for arm in args.arms]
    from measure import machine
    header = (f"bench_engines: {machine().replace(', measured with OMP_NUM_THREADS=1', '')}, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {time.time() - start:.0f} s")
    (work / "engines.json").write_text(json.dumps({"header": header, "results": results},
                                                  indent=2))
    table = markdown(results, header)
    (work / "engines.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
