"""Checks that an exported HF model is the Megatron model it came from (``--validate``).

Logits of the same batch, both in fp32, must agree to :data:`TOLERANCE` (max abs diff);
``generate()`` must produce new tokens; the exported tokenizer must encode probe texts to the
training tokenizer's ids.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, PreTrainedModel,
                          PreTrainedTokenizerBase)

from ..runtime.errors import ConversionError

TOLERANCE = 1e-4
PROBE_TEXTS = ("The quick brown fox jumps over the lazy dog.",
               "Question: How do you boil water?\nAnswer: Heat it to 100 °C, 2 min.",
               "  double  spaces, ünïcödé and digits 12345")


def probe_tokens(vocab_size: int, seq_length: int, seed: int = 0) -> torch.Tensor:
    """A fixed batch ``[2, min(seq_length, 64)]`` of ids in ``[0, vocab_size)``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (2, min(seq_length, 64)), generator=gen)


def needs_remote_code(hf_dir: str) -> bool:
    """Whether the model in ``hf_dir`` is custom code from its folder (``auto_map`` in its
    ``config.json``: the fixed-code export), which loads only with ``trust_remote_code``; a
    stock Llama is loaded without it."""
    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
        return "auto_map" in json.load(f)


def load_hf(hf_dir: str) -> PreTrainedModel:
    """The exported model as a user loads it (``trust_remote_code`` only for the custom
    code), in fp32."""
    return AutoModelForCausalLM.from_pretrained(
        hf_dir, trust_remote_code=needs_remote_code(hf_dir), dtype=torch.float32).eval()


def load_tokenizer(hf_dir: str) -> PreTrainedTokenizerBase:
    """The exported tokenizer; ``trust_remote_code`` for the custom code only because
    AutoTokenizer first reads ``config.json``, which names it."""
    return AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=needs_remote_code(hf_dir))


@torch.no_grad()
def megatron_logits(megatron_model, tokens: torch.Tensor) -> torch.Tensor:
    """The Megatron model's fp32 logits ``[b, s, V]`` of a batch: the reference, computed
    before the model is let go (the export holds one copy of the weights at a time)."""
    return megatron_model(tokens, None, None).float()


@torch.no_grad()
def max_logit_diff(reference: torch.Tensor, hf_model: PreTrainedModel,
                   tokens: torch.Tensor) -> float:
    """``max |logits_hf - logits_megatron|`` over a batch (:func:`megatron_logits`)."""
    return (hf_model(tokens).logits.float() - reference).abs().max().item()


@torch.no_grad()
def sample(hf_model: PreTrainedModel, hf_dir: str, prompt_ids: list[int],
           has_tokenizer: bool, new_tokens: int = 8) -> str:
    """Greedy continuation of ``prompt_ids``: text with a tokenizer, else the ids."""
    out = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=new_tokens,
                            min_new_tokens=new_tokens, do_sample=False)[0, len(prompt_ids):]
    if len(out) != new_tokens:
        raise ConversionError(f"generate() gave {len(out)} new tokens, not {new_tokens}")
    if has_tokenizer:
        return load_tokenizer(hf_dir).decode(out)
    return " ".join(str(int(i)) for i in out)


def tokenizer_mismatch(training_tokenizer, hf_dir: str) -> Optional[str]:
    """The first probe text that the exported tokenizer encodes differently, or None."""
    hf = load_tokenizer(hf_dir)
    for text in PROBE_TEXTS:
        if hf(text)["input_ids"] != training_tokenizer.tokenize(text):
            return text
    return None
