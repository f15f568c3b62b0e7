"""Convert a training checkpoint (any arm, saved at any TP/PP size) to Hugging Face format.

Writes safetensors, ``config.json``, ``generation_config.json`` and tokenizer files. The
learned arm becomes a stock ``LlamaForCausalLM``; a fixed-code arm becomes a fixed-code Llama loaded
with ``trust_remote_code=True`` (see megatron_ext/hf/convert.py for the weight mapping)::

    python tools/convert_to_hf.py --load CKPT_DIR [--iteration N] --output HF_DIR \\
        [--dtype fp32|bf16|fp16] [--tokenizer-model PATH] [--validate]

``--dtype`` defaults to fp32: lossless for any training precision (bf16 weights upcast
exactly) and the precision of the parity check; bf16 halves the files. ``--validate``
reloads the output and checks fp32 logits against the Megatron model (max abs diff <= 1e-4;
with a bf16/fp16 export the Megatron weights are rounded the same way first), the tokenizer
against the training one, and that ``generate()`` produces tokens.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

import torch
import transformers
from packaging.version import Version

from megatron_ext.hf.convert import (DTYPES, check_mappable, hf_config, hf_state_dict,
                                     save_hf_model)
from megatron_ext.hf.megatron_checkpoint import load_model, read_checkpoint
from megatron_ext.hf.parity import (PROBE_TEXTS, TOLERANCE, load_hf, max_logit_diff,
                                    probe_tokens, sample, tokenizer_mismatch)
from megatron_ext.hf.tokenizer import hf_tokenizer
from megatron_ext.initialize import destroy_distributed, initialize_distributed
from megatron_ext.tokenizer import build_tokenizer


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
    parser.add_argument("--validate", action="store_true",
                        help="reload the output and check it against the Megatron model")
    return parser.parse_args(argv)


def validate(model, hf_dir: str, train: argparse.Namespace, tokenizer, has_tokenizer: bool,
             dtype: torch.dtype) -> dict:
    """Parity of the export with ``model``; exits with an error when it fails."""
    if dtype != torch.float32:  # check the mapping, not the rounding
        for p in model.parameters():
            p.data = p.data.to(dtype).float()
    hf_model = load_hf(hf_dir)
    tokens = probe_tokens(tokenizer.vocab_size, train.seq_length)
    diff = max_logit_diff(model, hf_model, tokens)
    print(f"validate: max |logits_hf - logits_megatron| = {diff:.3g} on a "
          f"{list(tokens.shape)} batch (limit {TOLERANCE:g})")
    if not diff <= TOLERANCE:
        raise SystemExit(f"error: --validate: {hf_dir} does not reproduce the Megatron logits")
    if has_tokenizer:
        text = tokenizer_mismatch(tokenizer, hf_dir)
        if text is not None:
            raise SystemExit(f"error: --validate: the tokenizer in {hf_dir} encodes {text!r} "
                             f"differently from the training tokenizer")
        print(f"validate: tokenizer encodes {len(PROBE_TEXTS)} probe texts like training")
    prompt = tokenizer.tokenize(PROBE_TEXTS[0])[:4] if has_tokenizer else tokens[0, :4].tolist()
    generated = sample(hf_model, hf_dir, prompt, has_tokenizer)
    print(f"validate: generate() continues the prompt with {generated!r}")
    return {"max_abs_diff": diff, "generated": generated}


# The export's config class needs what transformers 5.24 does (pyproject.toml pins the same
# floor): 5.17 builds a config with no arguments on save, which a fixed-code config refuses.
TRANSFORMERS_MIN = "5.24"


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    if Version(transformers.__version__) < Version(TRANSFORMERS_MIN):
        raise SystemExit(f"error: the export needs transformers >= {TRANSFORMERS_MIN}, this "
                         f"environment has {transformers.__version__}: pip install "
                         f"'transformers>={TRANSFORMERS_MIN}'")
    path, train, fixed_code, iteration = read_checkpoint(args.load, args.iteration)
    check_mappable(train, fixed_code, path)
    if os.path.exists(args.output) and (not os.path.isdir(args.output) or os.listdir(args.output)):
        raise SystemExit(f"error: --output {args.output} exists and is not an empty directory")
    tokenizer = build_tokenizer(train.tokenizer_type, args.tokenizer_model or train.tokenizer_model,
                                train.vocab_size)
    if tokenizer.vocab_size > train.padded_vocab_size:
        raise SystemExit(f"error: the tokenizer has {tokenizer.vocab_size} tokens, the model "
                         f"{train.padded_vocab_size}: not the checkpoint's tokenizer")
    dtype = DTYPES[args.dtype]
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise SystemExit("error: the converter runs as one process; do not start it with torchrun")
    started = not torch.distributed.is_initialized()  # else a caller's (tests): leave it up
    initialize_distributed("cpu")
    try:
        model = load_model(path, train, fixed_code)
        save_hf_model(hf_config(train, fixed_code, dtype, tokenizer.eod),
                      hf_state_dict(model.state_dict(), train, dtype), args.output)
        hf_tok = hf_tokenizer(tokenizer, train.max_position_embeddings)
        if hf_tok is not None:
            hf_tok.save_pretrained(args.output)
        print(f"wrote the {train.input_interface} arm of {path} (iteration {iteration}) to "
              f"{args.output} in {args.dtype}")
        result = {"output": args.output, "arm": train.input_interface, "iteration": iteration}
        if args.validate:
            result.update(validate(model, args.output, train, tokenizer, hf_tok is not None,
                                   dtype))
        return result
    finally:
        if started:
            destroy_distributed()


if __name__ == "__main__":
    main(sys.argv[1:])
