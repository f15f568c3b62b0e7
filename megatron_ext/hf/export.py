"""Export a training checkpoint (any arm, saved at any TP/PP size) as a Hugging Face model:
safetensors, ``config.json``, ``generation_config.json`` and the tokenizer files, optionally
validated against the Megatron model. tools/convert_to_hf.py is its command line; a study
exports each checkpoint it scores on downstream tasks through :func:`export_checkpoint`.

The learned arm becomes a stock ``LlamaForCausalLM``; a fixed-code arm becomes a fixed-code
Llama loaded with ``trust_remote_code=True``, or with ``as_table`` a stock ``LlamaForCausalLM``
holding the code of every id as its input table (:mod:`.convert` has the weight mapping). The
folder gets a model card (:mod:`.model_card`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import os
import warnings
from typing import Callable, Optional

import psutil
import torch
import transformers
from packaging.version import Version

from ..codes.schemes import SCHEMES
from ..config.flag_fields import FlagConfig, flag
from ..datasets.tokenizer import check_training_tokenizer, tokenizer_from_args
from ..model.memory import stage_parameters
from ..model.param_count import count_parameters
from ..runtime.errors import ConversionError, DataError, DeviceError, FlagError
from ..runtime.initialize import destroy_distributed, initialize_distributed

from .convert import (DTYPES, check_mappable, hf_config, hf_state_dict, input_record,
                      save_hf_model)
from .megatron_checkpoint import SavedRun, load_model, read_checkpoint_common
from .model_card import card_metadata, check_license, write_card
from .parity import (PROBE_TEXTS, TOLERANCE, load_hf, max_logit_diff, megatron_logits,
                     probe_tokens, sample, tokenizer_mismatch)
from .tokenizer import hf_tokenizer, llama_cpp_note, write_tokenizer

# What the conversion holds besides the weights: the interpreter with torch, transformers and
# Megatron-Core imported (about 0.5 GiB measured, bench/RESULTS.md), with a margin.
PROCESS_BYTES = 2 ** 30
# The export's config class needs what transformers 5.24 does (pyproject.toml pins the same
# floor): 5.17 builds a config with no arguments on save, which a fixed-code config refuses.
TRANSFORMERS_MIN = "5.24"


def table_weights(run: SavedRun, as_table: bool) -> int:
    """The weights ``as_table`` adds to a fixed-code arm's export: its code as a V x h table
    (none for the table arms, which hold their table anyway)."""
    if not as_table or run.config.model.input_interface not in SCHEMES:
        return 0
    return run.padded_vocab_size * run.config.model.hidden_size


def memory_needed(run: SavedRun, dtype: torch.dtype, as_table: bool = False) -> int:
    """The bytes a conversion of the checkpoint of the training ``run`` needs at its peak:
    one fp32 copy of the weights (the model the checkpoint is read into, whose tensors the
    export writes, and later the export reloaded for ``--validate``, never both), a copy in
    ``dtype`` where it is 16-bit, half a copy in flight (the QKV split, the tensor being read
    or written), and the process. Never two fp32 copies: the tensors are streamed. A code
    written as a table (``as_table``) counts as weights."""
    whole = run.config.replace(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    n = stage_parameters(whole, run.padded_vocab_size, 0)
    fp32 = 4 * (n.trained + n.frozen + table_weights(run, as_table))
    return int(fp32 * (1.5 + (0 if dtype == torch.float32 else 0.5))) + PROCESS_BYTES


def check_memory(run: SavedRun, dtype: torch.dtype, path: str, as_table: bool = False) -> None:
    """Refuse, before any work, a conversion this machine lacks the memory for."""
    need, available = memory_needed(run, dtype, as_table), psutil.virtual_memory().available
    if need > available:
        raise DeviceError(f"converting {path} needs about {need / 2 ** 30:.1f} GiB of memory "
                          f"(one fp32 copy of its weights, half a copy in flight and the "
                          f"process), and this machine has {available / 2 ** 30:.1f} GiB "
                          f"available: free memory or convert on a larger machine")


def reference(model, seq_length: int, tokenizer, dtype: torch.dtype,
              input_table: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, logits)``: a probe batch of ``seq_length`` tokens and the Megatron model's
    logits of it, its
    weights first rounded to the export's ``dtype`` (the check is of the mapping, not of the
    rounding), and so its input where the export holds it as a table (``input_table``: a
    code with a scale that ``dtype`` rounds, a product of factors)."""
    if dtype != torch.float32:
        for p in model.parameters():
            p.data = p.data.to(dtype).float()
        if input_table:
            model.embedding.register_forward_hook(
                lambda module, inputs, output: output.to(dtype).float())
    tokens = probe_tokens(tokenizer.vocab_size, seq_length)
    return tokens, megatron_logits(model, tokens)


def validate(tokens: torch.Tensor, logits: torch.Tensor, hf_dir: str, tokenizer,
             has_tokenizer: bool, progress: Callable[[str], None] = print) -> dict:
    """Parity of the export with the Megatron model's ``logits`` of ``tokens``
    (:func:`reference`); a :class:`ConversionError` when it fails."""
    hf_model = load_hf(hf_dir)
    diff = max_logit_diff(logits, hf_model, tokens)
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


def _release_freed_memory() -> None:
    """Collect what is unreachable and hand the freed heap back to the system (glibc's
    ``malloc_trim``; elsewhere a no-op): tensors below glibc's mmap threshold are freed into
    the heap, which otherwise keeps them resident while the next model is built."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@dataclasses.dataclass(frozen=True)
class ExportSettings(FlagConfig):
    """How a checkpoint is written out (tools/convert_to_hf.py's own flags; the checkpoint
    and its iteration are the training flags ``--load`` and the tools' ``--iteration``)."""
    output: Optional[str] = flag(None, "new or empty output directory")
    dtype: str = flag("fp32", "dtype of the exported weights", choices=sorted(DTYPES))
    as_table: bool = flag(
        False, "write a fixed-code arm as a stock LlamaForCausalLM whose embed_tokens.weight "
               "is its code of every id (loads without trust_remote_code, serves where a "
               "Llama does; V x h more weights)")
    license: Optional[str] = flag(
        None, "the model's licence, a Hugging Face Hub identifier (apache-2.0, mit, "
              "cc-by-4.0, ..., other), written into the model card's metadata; default: none "
              "stated")
    validate: bool = flag(False, "reload the output and check it against the Megatron model")


def export_checkpoint(load: str, output: str, iteration: Optional[int] = None,
                      dtype: str = "fp32", tokenizer_model: Optional[str] = None,
                      check: bool = False, progress: Callable[[str], None] = print,
                      as_table: bool = False, license: Optional[str] = None) -> dict:
    """Write the checkpoint of ``load`` (``iteration``, default the latest) to the new or
    empty folder ``output`` in ``dtype`` (a key of :data:`.convert.DTYPES`), a fixed code as
    a stock Llama's input table with ``as_table``, with its model card (``license``: a Hub
    licence identifier, checked before any work, or None); with ``check``,
    reload it and validate it. Runs in this process (started as one process, not under
    torchrun); a process group already up (a caller's) is left up. Returns ``{"output",
    "arm", "iteration", "stock", "card", "llama_cpp_note"}`` (the note:
    :func:`.tokenizer.llama_cpp_note`, or None), and the validation's results."""
    if Version(transformers.__version__) < Version(TRANSFORMERS_MIN):
        raise DeviceError(f"the export needs transformers >= {TRANSFORMERS_MIN}, this "
                          f"environment has {transformers.__version__}: pip install "
                          f"'transformers>={TRANSFORMERS_MIN}'")
    if license is not None:
        check_license(license)
    path, run, common = read_checkpoint_common(str(load), iteration)
    fixed_code, iteration = common.get("fixed_code"), common.get("iteration")
    model_config = run.config.model
    check_mappable(model_config, fixed_code, path)
    check_memory(run, DTYPES[dtype], path, as_table)
    if os.path.exists(output) and (not os.path.isdir(output) or os.listdir(output)):
        raise FlagError(f"--output {output} exists and is not an empty directory")
    tokenizer = tokenizer_from_args(run.config.data, tokenizer_model)
    check_training_tokenizer(tokenizer, run.tokenizer_sha256, path)
    if tokenizer.vocab_size > run.padded_vocab_size:
        raise DataError(f"the tokenizer has {tokenizer.vocab_size} tokens, the model "
                        f"{run.padded_vocab_size}: not the checkpoint's tokenizer")
    torch_dtype = DTYPES[dtype]
    if model_config.fp32_residual_connection and torch_dtype != torch.float32:
        warnings.warn(f"{path} trained with --fp32-residual-connection; a Llama in {dtype} "
                      f"computes its residual stream in {dtype} (the loss docs/gpu.md describes "
                      f"for +-1 codes): export --dtype fp32 to keep it in fp32")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise DeviceError("the converter runs as one process; do not start it with torchrun")
    stock = model_config.input_interface not in SCHEMES or as_table
    started = not torch.distributed.is_initialized()  # else a caller's (tests): leave it up
    initialize_distributed("cpu")
    try:
        model = load_model(path, run, fixed_code)
        trainable = count_parameters(model)
        if check:  # the Megatron model's logits, before its tensors go to the export
            tokens, logits = reference(model, model_config.seq_length, tokenizer, torch_dtype,
                                       stock)
        # The code the model computes: the checkpoint's own (load_model never redraws it).
        code = getattr(model.embedding, "code", None) if as_table else None
        # One copy of the weights at a time: the state dict alone holds the Megatron
        # tensors, each freed as it is mapped; the export is reloaded only after it is saved.
        state = model.state_dict()
        del model
        gc.collect()
        weights = hf_state_dict(state, model_config, run.padded_vocab_size, torch_dtype, code)
        stored = sum(t.numel() for t in {t.data_ptr(): t for t in weights.values()}.values())
        hf_tok = hf_tokenizer(tokenizer, model_config.max_position_embeddings)
        # the ids config.json and generation_config.json name, the tokenizer's own
        ids = (dict(bos_token_id=None, eos_token_id=tokenizer.eod, pad_token_id=tokenizer.eod)
               if hf_tok is None else
               dict(bos_token_id=hf_tok.bos_token_id, eos_token_id=hf_tok.eos_token_id,
                    pad_token_id=hf_tok.pad_token_id))
        save_hf_model(hf_config(model_config, run.padded_vocab_size, fixed_code, torch_dtype,
                                ids, as_table), weights, output)
        del weights
        _release_freed_memory()  # the Megatron tensors, before the export is reloaded
        if hf_tok is not None:
            write_tokenizer(hf_tok, tokenizer, output)
        metadata = card_metadata(model_config, common, input_record(model_config, fixed_code),
                                 stock=stock, trainable=trainable, stored=stored,
                                 license=license)
        card = write_card(output, os.path.basename(os.path.abspath(output)), model_config,
                          run.padded_vocab_size, metadata)
        added = table_weights(run, as_table)
        progress(f"wrote the {model_config.input_interface} arm of {path} (iteration "
                 f"{iteration}) to {output} in {dtype}, as "
                 + (f"a stock LlamaForCausalLM; its code as the input table adds {added:,} "
                    f"weights ({added * torch_dtype.itemsize / 1e6:,.1f} MB)" if added else
                    "a stock LlamaForCausalLM" if stock else
                    "FixedCodeLlamaForCausalLM (load with trust_remote_code=True; "
                    "--as-table for a stock Llama)")
                 + f"; model card {card}")
        note = llama_cpp_note(hf_tok, tokenizer) if stock else None
        if note:
            progress(note)
        result = {"output": output, "arm": model_config.input_interface, "iteration": iteration,
                  "stock": stock, "card": card, "llama_cpp_note": note}
        if check:
            result.update(validate(tokens, logits, output, tokenizer, hf_tok is not None,
                                   progress))
        return result
    finally:
        if started:
            destroy_distributed()
