"""Hugging Face model of an exported fixed-code checkpoint: Llama with a fixed-code input.

``FixedCodeLlamaForCausalLM`` is transformers' ``LlamaForCausalLM`` whose ``embed_tokens``
table is replaced by :class:`FixedCodeInput`, which computes the code of each token id from
``config.fixed_code`` in every forward: no parameters and no table in the weights (with
``config.code_projection``, the n-bit code times the trained map ``projection``). Copied
next to the weights (``trust_remote_code``), so it imports nothing from megatron_ext;
:func:`tiled_code` equals ``megatron_ext.codes.schemes.FixedCode.encode`` (a test checks it).
"""

from typing import Optional

import torch
from torch import nn
from transformers import LlamaForCausalLM

from .configuration_fixedcode import FixedCodeLlamaConfig


def _affine(bits: torch.Tensor, A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``A·bits ⊕ b`` over GF(2) for each map stacked in ``A [*S, m, n]``: ``bits [..., n]``
    -> ``[..., *S, m]`` (one exact float matmul of 0/1 values, then mod 2)."""
    *stack, m, n = A.shape
    sums = bits.to(torch.float32).reshape(-1, n) @ A.to(torch.float32).reshape(-1, n).t()
    return (sums.to(torch.int64).view(*bits.shape[:-1], *stack, m) + b) & 1


def tiled_code(ids: torch.Tensor, num_bits: int, hidden_size: int, values: str, scale: float,
               dtype: torch.dtype, A: Optional[torch.Tensor] = None,
               b: Optional[torch.Tensor] = None, table: Optional[torch.Tensor] = None,
               recode_A: Optional[torch.Tensor] = None,
               recode_b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``ids [...]`` -> ``[..., hidden_size]``: code input ``x = table[id]`` (or the id), its
    bits least significant first, ``A·bits ⊕ b`` for gf2; then ⌈h/n⌉ blocks, each the code
    (or ``recode_A[r]·code ⊕ recode_b[r]``), the last truncated; value map ``pm1`` (bit 1 ->
    ``scale``, 0 -> ``-scale``) or ``01`` (1 -> ``scale``, 0 -> 0). Tensors int64, ids' device."""
    x = ids.to(torch.int64) if table is None else table[ids]
    shifts = torch.arange(num_bits, device=ids.device, dtype=torch.int64)
    c = (x.unsqueeze(-1) >> shifts) & 1
    if A is not None:
        c = _affine(c, A, b)
    blocks = -(-hidden_size // num_bits)
    if recode_A is None:
        rows = c.repeat(*([1] * ids.dim()), blocks)
    else:
        rows = _affine(c, recode_A, recode_b).flatten(-2)
    high = torch.tensor(scale, dtype=dtype, device=ids.device)
    low = -high if values == "pm1" else torch.zeros_like(high)
    return torch.where(rows[..., :hidden_size].bool(), high, low)


class FixedCodeInput(nn.Module):
    """Drop-in for ``nn.Embedding``: ids ``[b, s]`` -> the tiled code ``[b, s, h]``.

    The code comes out in the model's dtype, read from ``dtype_anchor``: an empty buffer that
    ``.to()``, ``.half()`` and ``from_pretrained(dtype=...)`` convert along with the weights.
    The code's integer parts stay the config's lists (never weights, never on the meta device
    ``from_pretrained`` builds on), made tensors once per device."""

    def __init__(self, config: FixedCodeLlamaConfig):
        super().__init__()
        code = config.fixed_code
        self.num_bits = int(code["num_bits"])
        self.values = code["values"]
        self.scale = float(code["scale"])
        self.parts = {k: code[k] for k in ("A", "b", "table", "recode_A", "recode_b")
                      if code.get(k) is not None}
        self.on_device = {}
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        self.register_buffer("dtype_anchor", torch.empty(0), persistent=False)
        self.projection = None
        if config.code_projection:
            # Initialised as training initialises it, the tiling (position j reads bit j mod
            # n), and marked so that Hugging Face's initialisation leaves it so.
            self.projection = nn.Linear(self.num_bits, self.hidden_size, bias=False)
            weight = self.projection.weight
            if weight.device.type != "meta":
                with torch.no_grad():
                    weight.zero_()
                    rows = torch.arange(self.hidden_size, device=weight.device)
                    weight[rows, rows % self.num_bits] = 1.0
            self.projection._is_hf_initialized = True

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if not bool(((input_ids >= 0) & (input_ids < self.vocab_size)).all()):
            raise ValueError(f"token id outside the vocabulary [0, {self.vocab_size})")
        device = input_ids.device
        if device not in self.on_device:
            self.on_device[device] = {k: torch.tensor(v, dtype=torch.int64, device=device)
                                      for k, v in self.parts.items()}
        if self.projection is None:
            return tiled_code(input_ids, self.num_bits, self.hidden_size, self.values,
                              self.scale, self.dtype_anchor.dtype, **self.on_device[device])
        code = tiled_code(input_ids, self.num_bits, self.num_bits, self.values, self.scale,
                          self.projection.weight.dtype, **self.on_device[device])
        return self.projection(code)


class FixedCodeLlamaForCausalLM(LlamaForCausalLM):
    config_class = FixedCodeLlamaConfig
    _tied_weights_keys = {}  # there is no input table to tie the head to

    def __init__(self, config: FixedCodeLlamaConfig):
        super().__init__(config)
        self.model.embed_tokens = FixedCodeInput(config)
