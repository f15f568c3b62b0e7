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

from megatron_ext.config.checkpoint_config import CheckpointConfig, SavedIteration
from megatron_ext.config.data_config import DataConfig
from megatron_ext.config.flag_fields import ShowDefaults, add_flags
from megatron_ext.hf.export import ExportSettings, export_checkpoint
from megatron_ext.runtime.errors import exits_on_error


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Convert a checkpoint to Hugging Face format",
                                     allow_abbrev=False, formatter_class=ShowDefaults)
    add_flags(parser, CheckpointConfig, only=("load",), required=("load",),
              helps={"load": "the training run's --save directory"})
    add_flags(parser, SavedIteration)
    add_flags(parser, ExportSettings, only=("output",), required=("output",))
    add_flags(parser, ExportSettings, only=("dtype",))
    add_flags(parser, DataConfig, only=("tokenizer_model",), helps={
        "tokenizer_model": "the tokenizer file, when the checkpoint's path is not valid here"})
    add_flags(parser, ExportSettings, only=("as_table", "license", "validate"))
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    with exits_on_error():
        args = parse_args(argv)
        export = ExportSettings.from_flags(args)
        result = export_checkpoint(
            CheckpointConfig.from_flags(args).load, export.output,
            SavedIteration.from_flags(args).iteration, export.dtype,
            DataConfig.from_flags(args).tokenizer_model, check=export.validate,
            as_table=export.as_table, license=export.license)
        if export.license is None:
            print(f"before publishing {export.output}, state its licence: --license, or "
                  f"license: in {result['card']}")
        return result


if __name__ == "__main__":
    main(sys.argv[1:])
