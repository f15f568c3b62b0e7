"""Read a Hugging Face export with other people's programs, in their own environment (the
`.venv-engines` of `make engines`: transformers 4.57, llama.cpp's `convert_hf_to_gguf.py` and
gguf-py from the llama-cpp-python sdist, CTranslate2), each with its default options, and print
what they made of it as JSON. Run by the engine tests (tests/integration/test_engines.py) and
bench/bench_engines.py with that environment's Python; it imports nothing of fixedcode:

    .venv-engines/bin/python bench/engines_worker.py --hf HF_DIR --work DIR \\
        --texts texts.json --ids ids.json [--transformers] [--gguf] [--gguf-outtype f32 q8_0] \\
        [--ct2] [--ct2-quantization int8]

* ``transformers``: AutoTokenizer's ids of each text (transformers 4) and, for a stock Llama,
  AutoModelForCausalLM's log-probability of each next id of each ``--ids`` row.
* ``gguf``: llama.cpp's converter run as its README gives it (no options: its default type),
  then the GGUF's tokenizer metadata read back with gguf; or the converter's exit status and
  last message where it refuses.
* ``ct2``: ``ct2-transformers-converter --model HF_DIR --output_dir DIR`` (no options), then
  ``Generator.score_batch``'s log-probabilities of the same rows, or the converter's message.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

# The converter lies beside gguf-py where `make engines` extracted llama.cpp.
LLAMA_CPP = Path(sys.prefix) / "llama.cpp"


def _tail(text: str, lines: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def read_transformers(hf_dir: str, texts: list, rows: list) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    out = {"version": transformers.__version__, "tokenizer_class": type(tokenizer).__name__,
           "ids": [tokenizer(text)["input_ids"] for text in texts],
           "bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token}
    config = json.loads(Path(hf_dir, "config.json").read_text())
    if config["architectures"] == ["LlamaForCausalLM"]:
        model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
        out["rope_theta"] = float(model.config.rope_theta)
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor(rows)).logits.float(), dim=-1)
        out["log_probs"] = [[float(logp[r, i, row[i + 1]]) for i in range(len(row) - 1)]
                            for r, row in enumerate(rows)]
    return out


def _field(reader, name: str):
    field = reader.fields.get(name)
    if field is None:
        return None
    values = [field.parts[i] for i in field.data]
    decoded = [bytes(v).decode("utf-8") if field.types and field.types[-1].name == "STRING"
               else v.tolist()[0] for v in values]
    return decoded if len(field.types) > 1 and field.types[0].name == "ARRAY" else decoded[0]


def read_gguf(hf_dir: str, work: Path, outtype: str = None) -> dict:
    out_file = work / f"model{'-' + outtype if outtype else ''}.gguf"
    proc = subprocess.run([sys.executable, str(LLAMA_CPP / "convert_hf_to_gguf.py"), hf_dir,
                           "--outfile", str(out_file)]
                          + (["--outtype", outtype] if outtype else []),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {"converted": False, "returncode": proc.returncode,
                "message": _tail(proc.stderr, 20)}
    import gguf
    reader = gguf.GGUFReader(str(out_file))
    scores = _field(reader, "tokenizer.ggml.scores") or []
    tensor_types = sorted({t.tensor_type.name for t in reader.tensors})
    return {"converted": True, "file": str(out_file),
            "tokenizer_model": _field(reader, "tokenizer.ggml.model"),
            "tokens": len(_field(reader, "tokenizer.ggml.tokens") or []),
            "scores": scores, "scores_at_minus_1000": sum(s == -1000.0 for s in scores),
            "add_bos_token": _field(reader, "tokenizer.ggml.add_bos_token"),
            "add_eos_token": _field(reader, "tokenizer.ggml.add_eos_token"),
            "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
            "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
            "unknown_token_id": _field(reader, "tokenizer.ggml.unknown_token_id"),
            "padding_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
            "rope_freq_base": _field(reader, "llama.rope.freq_base"),
            "license": _field(reader, "general.license"),
            "tensor_types": tensor_types}


def read_ct2(hf_dir: str, work: Path, rows: list, quantization: str = None) -> dict:
    out_dir = work / ("ct2" + (f"-{quantization}" if quantization else ""))
    cmd = [str(Path(sys.prefix) / "bin" / "ct2-transformers-converter"), "--model", hf_dir,
           "--output_dir", str(out_dir)] + (["--quantization", quantization] if quantization
                                            else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"converted": False, "returncode": proc.returncode,
                "message": _tail(proc.stderr, 20)}
    import ctranslate2
    vocabulary = json.loads((out_dir / "vocabulary.json").read_text(encoding="utf-8"))
    config = json.loads((out_dir / "config.json").read_text())
    generator = ctranslate2.Generator(str(out_dir), device="cpu")
    results = generator.score_batch([[vocabulary[i] for i in row] for row in rows])
    return {"converted": True, "version": ctranslate2.__version__,
            "bos_token": config.get("bos_token"), "eos_token": config.get("eos_token"),
            "unk_token": config.get("unk_token"),
            "log_probs": [list(map(float, r.log_probs)) for r in results]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf", required=True, help="the export (a Hugging Face folder)")
    parser.add_argument("--work", required=True, help="a folder for the engines' files")
    parser.add_argument("--texts", required=True, help="a JSON list of texts to tokenize")
    parser.add_argument("--ids", required=True, help="a JSON list of id rows to score")
    parser.add_argument("--transformers", action="store_true", help="read with transformers")
    parser.add_argument("--gguf", action="store_true", help="convert with llama.cpp's converter")
    parser.add_argument("--gguf-outtype", nargs="*", default=[],
                        help="also convert with these --outtype values (f32, q8_0, ...)")
    parser.add_argument("--ct2", action="store_true", help="convert and score with CTranslate2")
    parser.add_argument("--ct2-quantization", help="also convert with this --quantization")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    texts = json.loads(Path(args.texts).read_text(encoding="utf-8"))
    rows = json.loads(Path(args.ids).read_text())
    out = {}
    if args.transformers:
        out["transformers"] = read_transformers(args.hf, texts, rows)
    if args.gguf:
        out["gguf"] = read_gguf(args.hf, work)
    for outtype in args.gguf_outtype:
        out[f"gguf_{outtype}"] = read_gguf(args.hf, work, outtype)
    if args.ct2:
        out["ct2"] = read_ct2(args.hf, work, rows)
    if args.ct2_quantization:
        out[f"ct2_{args.ct2_quantization}"] = read_ct2(args.hf, work, rows, args.ct2_quantization)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
