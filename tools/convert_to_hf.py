"""Convert a training checkpoint (any arm, saved at any TP/PP size) to Hugging Face format.

Writes safetensors, ``config.json``, ``generation_config.json``, tokenizer files and a model
card, ``README.md`` (megatron_ext/hf/export.py). The learned arm becomes a stock
``LlamaForCausalLM``; a fixed-code arm becomes a fixed-code Llama loaded with
``trust_remote_code=True``, or with ``--as-table`` a stock ``LlamaForCausalLM`` whose input
table is the checkpoint's code of every id (V x h more weights)::

    python tools/convert_to_hf.py --load CKPT_DIR [--iteration N] --output HF_DIR \\
        [--dtype fp32|bf16|fp16] [--tokenizer-model PATH] [--as-table] [--license ID] \\
        [--validate]

``--dtype`` defaults to fp32: lossless for any training precision (bf16 weights upcast
exactly) and the precision of the parity check; bf16 halves the files. ``--validate``
reloads the output and checks fp32 logits against the Megatron model (max abs diff <= 1e-4;
with a bf16/fp16 export the Megatron weights are rounded the same way first), the tokenizer
against the training one, and that ``generate()`` produces tokens.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from megatron_ext.hf.convert import DTYPES
from megatron_ext.hf.export import export_checkpoint
from megatron_ext.runtime.errors import exits_on_error


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Convert a checkpoint to Hugging Face format",
                                     allow_abbrev=False)
    parser.add_argument("--load", required=True, help="the training run's --save directory")
    parser.add_argument("--iteration", type=int, help="default: the latest completed save")
    parser.add_argument("--output", required=True, help="new or empty output directory")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32",
                        help="dtype of the exported weights (default fp32)")
    parser.add_argument("--tokenizer-model",
                        help="the tokenizer file, when the checkpoint's path is not valid here")
    parser.add_argument("--as-table", action="store_true",
                        help="write a fixed-code arm as a stock LlamaForCausalLM whose "
                             "embed_tokens.weight is its code of every id (loads without "
                             "trust_remote_code, serves where a Llama does; V x h more weights)")
    parser.add_argument("--license",
                        help="the model's licence, a Hugging Face Hub identifier (apache-2.0, "
                             "mit, cc-by-4.0, ..., other), written into the model card's "
                             "metadata; default: none stated")
    parser.add_argument("--validate", action="store_true",
                        help="reload the output and check it against the Megatron model")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    with exits_on_error():
        args = parse_args(argv)
        result = export_checkpoint(args.load, args.output, args.iteration, args.dtype,
                                   args.tokenizer_model, check=args.validate,
                                   as_table=args.as_table, license=args.license)
        if args.license is None:
            print(f"before publishing {args.output}, state its licence: --license, or "
                  f"license: in {result['card']}")
        return result


if __name__ == "__main__":
    main(sys.argv[1:])
