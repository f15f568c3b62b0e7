"""Run GGUF files in llama.cpp itself (llama-cpp-python's bindings, built from its sdist by
bench/bench_engines.py) and print, as JSON, its default tokenization of each text (BOS as the
file says) and its logits of each id row, with the KV cache in f16 (llama.cpp's default) and
in f32. Imports nothing of fixedcode; run with that environment's Python:

    LLAMA_VENV/bin/python bench/llama_cpp_worker.py --gguf F.gguf [F2.gguf ...] \\
        --texts texts.json --ids ids.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

F32 = 0  # GGML_TYPE_F32


def run(path: str, texts: list, rows: list) -> dict:
    from llama_cpp import Llama

    out = {}
    for kv, types in (("f16", {}), ("f32", {"type_k": F32, "type_v": F32})):
        llm = Llama(model_path=path, n_ctx=max(64, max(map(len, rows)) + 1), logits_all=True,
                    verbose=False, n_threads=2, **types)
        if kv == "f16":
            out["tokens"] = [llm.tokenize(text.encode("utf-8")) for text in texts]
        logits = []
        for row in rows:
            llm.reset()
            llm.eval(row)
            logits.append(llm.scores[:len(row)].tolist())
        out[f"logits_kv_{kv}"] = logits
        del llm
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", nargs="+", required=True, help="GGUF files to run")
    parser.add_argument("--texts", required=True, help="a JSON list of texts to tokenize")
    parser.add_argument("--ids", required=True, help="a JSON list of id rows to run")
    args = parser.parse_args()
    texts = json.loads(Path(args.texts).read_text(encoding="utf-8"))
    rows = json.loads(Path(args.ids).read_text())
    json.dump({path: run(path, texts, rows) for path in args.gguf}, sys.stdout)


if __name__ == "__main__":
    main()
