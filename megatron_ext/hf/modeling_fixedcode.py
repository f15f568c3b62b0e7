"""Hugging Face model of an exported binary/gf2 checkpoint: Llama with a fixed-code input.

``FixedCodeLlamaForCausalLM`` is transformers' ``LlamaForCausalLM`` whose ``embed_tokens``
table is replaced by :class:`FixedCodeInput`, which computes the code of each token id from
``config.fixed_code`` in every forward: no parameters and no table in the weights. Copied
next to the weights (``trust_remote_code``), so it imports nothing from megatron_ext;
:func:`tiled_code` equals ``megatron_ext.codes.tiled_code`` (a test checks it).
"""

from typing import Optional

import torch
from torch import nn
from transformers import LlamaForCausalLM

from .configuration_fixedcode import FixedCodeLlamaConfig


def tiled_code(ids: torch.Tensor, num_bits: int, hidden_size: int, values: str, scale: float,
               dtype: torch.dtype, A: Optional[torch.Tensor] = None,
               b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``ids [...]`` -> ``[..., hidden_size]``: bits least significant first, ``A·bits ⊕ b``
    for gf2, value map ``pm1`` (``2c-1``) or ``01``, times ``scale``, repeated to the width."""
    shifts = torch.arange(num_bits, device=ids.device, dtype=torch.int64)
    c = (ids.to(torch.int64).unsqueeze(-1) >> shifts) & 1
    if A is not None:
        c = ((c.unsqueeze(-2) * A).sum(-1) + b) & 1
    c = c.to(dtype)
    if values == "pm1":
        c = 2 * c - 1
    return (c * scale).repeat(*([1] * ids.dim()), hidden_size // num_bits)


class FixedCodeInput(nn.Module):
    """Drop-in for ``nn.Embedding``: ids ``[b, s]`` -> the tiled code ``[b, s, h]``.

    The code comes out in the model's dtype, read from ``dtype_anchor``: an empty buffer that
    ``.to()``, ``.half()`` and ``from_pretrained(dtype=...)`` convert along with the weights."""

    def __init__(self, config: FixedCodeLlamaConfig):
        super().__init__()
        code = config.fixed_code
        self.num_bits = int(code["num_bits"])
        self.values = code["values"]
        self.scale = float(code["scale"])
        self.A = code["A"]
        self.b = code["b"]
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        self.register_buffer("dtype_anchor", torch.empty(0), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if not bool(((input_ids >= 0) & (input_ids < self.vocab_size)).all()):
            raise ValueError(f"token id outside the vocabulary [0, {self.vocab_size})")
        A = b = None
        if self.A is not None:
            A = torch.tensor(self.A, dtype=torch.int64, device=input_ids.device)
            b = torch.tensor(self.b, dtype=torch.int64, device=input_ids.device)
        return tiled_code(input_ids, self.num_bits, self.hidden_size, self.values, self.scale,
                          self.dtype_anchor.dtype, A, b)


class FixedCodeLlamaForCausalLM(LlamaForCausalLM):
    config_class = FixedCodeLlamaConfig
    _tied_weights_keys = {}  # there is no input table to tie the head to

    def __init__(self, config: FixedCodeLlamaConfig):
        super().__init__(config)
        self.model.embed_tokens = FixedCodeInput(config)
