"""Export a training checkpoint (any arm, saved at any TP/PP size) as a Hugging Face model:
safetensors, ``config.json``, ``generation_config.json`` and the tokenizer files, optionally
validated against the Megatron model. tools/convert_to_hf.py is its command line; a study
exports each checkpoint it scores on downstream tasks through :func:`export_checkpoint`.

The learned arm becomes a stock ``LlamaForCausalLM``; a fixed-code arm becomes a fixed-code
Llama loaded with ``trust_remote_code=True`` (:mod:`.convert` has the weight mapping).
"""

from __future__ import annotations

import argparse
import os
import warnings
from typing import Callable, Optional

import torch
import transformers
from packaging.version import Version

from ..datasets.tokenizer import check_training_tokenizer, tokenizer_from_args
from ..runtime.errors import ConversionError, DataError, DeviceError, FlagError
from ..runtime.initialize import destroy_distributed, initialize_distributed

from .convert import DTYPES, check_mappable, hf_config, hf_state_dict, save_hf_model
from .megatron_checkpoint import load_model, read_checkpoint
from .parity import (PROBE_TEXTS, TOLERANCE, load_hf, max_logit_diff, probe_tokens, sample,
                     tokenizer_mismatch)
from .tokenizer import hf_tokenizer

# The export's config class needs what transformers 5.24 does (pyproject.toml pins the same
# floor): 5.17 builds a config with no arguments on save, which a fixed-code config refuses.
TRANSFORMERS_MIN = "5.24"


def validate(model, hf_dir: str, train: argparse.Namespace, tokenizer, has_tokenizer: bool,
             dtype: torch.dtype, progress: Callable[[str], None] = print) -> dict:
    """Parity of the export with ``model``; exits with an error when it fails."""
    if dtype != torch.float32:  # check the mapping, not the rounding
        for p in model.parameters():
            p.data = p.data.to(dtype).float()
    hf_model = load_hf(hf_dir)
    tokens = probe_tokens(tokenizer.vocab_size, train.seq_length)
    diff = max_logit_diff(model, hf_model, tokens)
    progress(f"validate: max |logits_hf - logits_megatron| = {diff:.3g} on a "
             f"{list(tokens.shape)} batch (limit {TOLERANCE:g})")
    if not diff <= TOLERANCE:
        raise ConversionError(f"--validate: {hf_dir} does not reproduce the Megatron logits")
    if has_tokenizer:
        text = tokenizer_mismatch(tokenizer, hf_dir)
        if text is not None:
            raise ConversionError(f"--validate: the tokenizer in {hf_dir} encodes {text!r} "
                                  f"differently from the training tokenizer")
        progress(f"validate: tokenizer encodes {len(PROBE_TEXTS)} probe texts like training")
    prompt = tokenizer.tokenize(PROBE_TEXTS[0])[:4] if has_tokenizer else tokens[0, :4].tolist()
    generated = sample(hf_model, hf_dir, prompt, has_tokenizer)
    progress(f"validate: generate() continues the prompt with {generated!r}")
    return {"max_abs_diff": diff, "generated": generated}


def export_checkpoint(load: str, output: str, iteration: Optional[int] = None,
                      dtype: str = "fp32", tokenizer_model: Optional[str] = None,
                      check: bool = False, progress: Callable[[str], None] = print) -> dict:
    """Write the checkpoint of ``load`` (``iteration``, default the latest) to the new or
    empty folder ``output`` in ``dtype`` (a key of :data:`.convert.DTYPES`); with ``check``,
    reload it and validate it. Runs in this process (started as one process, not under
    torchrun); a process group already up (a caller's) is left up. Returns ``{"output",
    "arm", "iteration"}`` (and the validation's results)."""
    if Version(transformers.__version__) < Version(TRANSFORMERS_MIN):
        raise DeviceError(f"the export needs transformers >= {TRANSFORMERS_MIN}, this "
                          f"environment has {transformers.__version__}: pip install "
                          f"'transformers>={TRANSFORMERS_MIN}'")
    path, train, fixed_code, iteration = read_checkpoint(str(load), iteration)
    check_mappable(train, fixed_code, path)
    if os.path.exists(output) and (not os.path.isdir(output) or os.listdir(output)):
        raise FlagError(f"--output {output} exists and is not an empty directory")
    tokenizer = tokenizer_from_args(train, tokenizer_model)
    check_training_tokenizer(tokenizer, getattr(train, "tokenizer_sha256", None), path)
    if tokenizer.vocab_size > train.padded_vocab_size:
        raise DataError(f"the tokenizer has {tokenizer.vocab_size} tokens, the model "
                        f"{train.padded_vocab_size}: not the checkpoint's tokenizer")
    torch_dtype = DTYPES[dtype]
    if getattr(train, "fp32_residual_connection", False) and torch_dtype != torch.float32:
        warnings.warn(f"{path} trained with --fp32-residual-connection; a Llama in {dtype} "
                      f"computes its residual stream in {dtype} (the loss docs/gpu.md describes "
                      f"for +-1 codes): export --dtype fp32 to keep it in fp32")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise DeviceError("the converter runs as one process; do not start it with torchrun")
    started = not torch.distributed.is_initialized()  # else a caller's (tests): leave it up
    initialize_distributed("cpu")
    try:
        model = load_model(path, train, fixed_code)
        save_hf_model(hf_config(train, fixed_code, torch_dtype, tokenizer.eod),
                      hf_state_dict(model.state_dict(), train, torch_dtype), output)
        hf_tok = hf_tokenizer(tokenizer, train.max_position_embeddings)
        if hf_tok is not None:
            hf_tok.save_pretrained(output)
        progress(f"wrote the {train.input_interface} arm of {path} (iteration {iteration}) to "
                 f"{output} in {dtype}")
        result = {"output": output, "arm": train.input_interface, "iteration": iteration}
        if check:
            result.update(validate(model, output, train, tokenizer, hf_tok is not None,
                                   torch_dtype, progress))
        return result
    finally:
        if started:
            destroy_distributed()
