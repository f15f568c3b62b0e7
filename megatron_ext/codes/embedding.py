"""FixedCodeEmbedding: a drop-in replacement for Megatron's LanguageModelEmbedding in GPTModel.

The input of the model is the fixed code of each token id (see :mod:`megatron_ext.codes.schemes`),
tiled to the hidden size, in the model's dtype, with zero trainable parameters. Under tensor
parallelism every rank computes the same code locally: no communication. Under sequence
parallelism each rank computes only its own slice of the sequence, exactly the slice
Megatron's ``scatter_to_sequence_parallel_region`` would have given it.

With ``projection`` (``--code-projection``) the n-bit code ``c(t)`` is mapped to the width by a
trainable linear map (``projection.weight``, h x n) instead of tiled; it starts as the tiling
matrix (:func:`tiling_matrix`), so the first step's input is the fixed arm's, bit for bit.
Under sequence parallelism each rank's gradient of the map is its slice's: the map is marked
``sequence_parallel``, which Megatron's ``finalize_model_grads`` sums over tensor-parallel ranks.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
from torch import Tensor

from megatron.core import tensor_parallel
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import get_tensor_model_parallel_group_if_none

from .kernels import fixed_code_forward, lookup_tables
from .schemes import FixedCode


def tiling_matrix(num_bits: int, hidden_size: int) -> Tensor:
    """``[h, n]`` 0/1: row j has its one at column ``j mod n`` (the ``repeat`` tiling)."""
    matrix = torch.zeros(hidden_size, num_bits)
    matrix[torch.arange(hidden_size), torch.arange(hidden_size) % num_bits] = 1.0
    return matrix


class FixedCodeEmbedding(MegatronModule):
    """Same constructor and forward signature as ``LanguageModelEmbedding``, plus ``code``,
    ``impl`` (``auto``, ``torch`` or ``cuda``: see :mod:`megatron_ext.codes.kernels`) and
    ``projection`` (a trainable map from the n-bit code, ``repeat`` tiling only).

    Only ``position_embedding_type`` ``'rope'`` or ``'none'`` and no token types: a learned
    position table would reintroduce trainable input parameters.
    """

    def __init__(
        self,
        config: TransformerConfig,
        vocab_size: int,
        max_sequence_length: int,
        position_embedding_type: Literal['learned_absolute', 'rope', 'none'] = 'rope',
        num_tokentypes: int = 0,
        scatter_to_sequence_parallel: bool = True,
        tp_group: Optional[torch.distributed.ProcessGroup] = None,
        *,
        code: FixedCode,
        impl: str = "auto",
        projection: bool = False,
    ):
        super().__init__(config=config)
        if position_embedding_type == 'learned_absolute':
            raise ValueError(
                "a fixed-code input has no trainable parameters; use --position-embedding-type "
                "rope (or none), not learned_absolute")
        if num_tokentypes:
            raise ValueError("a fixed-code input supports no token types (num_tokentypes=0)")
        code.check_vocab(vocab_size)
        code.check_width(config.hidden_size)
        if projection and code.tiling != "repeat":
            raise ValueError("a code projection maps the n-bit code in place of the tiling: "
                             f"use the repeat tiling, not {code.tiling}")
        self.code = code
        self.impl = impl  # see megatron_ext.codes.kernels.IMPLS
        self.vocab_size = vocab_size
        self.max_sequence_length = max_sequence_length
        self.scatter_to_sequence_parallel = scatter_to_sequence_parallel
        self.tp_group = get_tensor_model_parallel_group_if_none(tp_group)
        self.embedding_dropout = torch.nn.Dropout(config.hidden_dropout)
        # What the fast paths read (megatron_ext.codes.kernels), on the module's device: they travel
        # with .cuda()/.to(); the code's own copies are what checkpoints and exported configs
        # store. `code_table` is empty for codes without a per-id table.
        table = code.table if code.table is not None else torch.zeros(0, dtype=torch.int64)
        self.register_buffer("code_table", table.clone(), persistent=False)
        # With a projection, the code is computed at width n (the repeat tiling's block 0).
        self.code_width = code.num_bits if projection else config.hidden_size
        self.register_buffer("code_lookup", lookup_tables(code, self.code_width),
                             persistent=False)
        self.projection = None
        if projection:
            self.projection = torch.nn.Linear(code.num_bits, config.hidden_size, bias=False,
                                              dtype=config.params_dtype)
            with torch.no_grad():
                self.projection.weight.copy_(tiling_matrix(code.num_bits, config.hidden_size))
            self.projection.weight.sequence_parallel = config.sequence_parallel

    def _check_ids(self, input_ids: Tensor) -> None:
        in_range = ((input_ids >= 0) & (input_ids < self.vocab_size)).all()
        if input_ids.is_cuda:  # no host sync on the GPU: fails at the next kernel launch
            torch._assert_async(in_range, f"token id outside [0, {self.vocab_size})")
        elif not bool(in_range):
            bad = input_ids[(input_ids < 0) | (input_ids >= self.vocab_size)][0].item()
            raise ValueError(
                f"token id {bad} is outside the vocabulary [0, {self.vocab_size}) of the "
                f"{self.code.scheme} input code")

    def forward(self, input_ids: Tensor, position_ids: Tensor = None,
                tokentype_ids: int = None) -> Tensor:
        """``input_ids [b, s]`` -> embeddings ``[s, b, h]`` (``[s/tp, b, h]`` under SP)."""
        assert tokentype_ids is None, "a fixed-code input supports no token types"
        self._check_ids(input_ids)
        ids = input_ids.t()  # [s, b]
        sequence_parallel = self.config.sequence_parallel and self.scatter_to_sequence_parallel
        if sequence_parallel:
            tp_size = self.tp_group.size()
            if ids.shape[0] % tp_size:
                raise ValueError(f"sequence length {ids.shape[0]} is not divisible by the "
                                 f"tensor-parallel size {tp_size} (sequence parallelism)")
            local = ids.shape[0] // tp_size
            ids = ids[self.tp_group.rank() * local:(self.tp_group.rank() + 1) * local]
        dtype = torch.float32 if self.config.fp32_residual_connection else self.config.params_dtype
        if self.projection is None:
            embeddings = fixed_code_forward(self.code, ids, self.code_table, self.code_lookup,
                                            self.config.hidden_size, dtype, self.impl)
        else:
            weight = self.projection.weight
            code = fixed_code_forward(self.code, ids, self.code_table, self.code_lookup,
                                      self.code_width, weight.dtype, self.impl)
            embeddings = self.projection(code).to(dtype)
        full_recompute = self.config.recompute_granularity == "full"
        if self.training and self.projection is None and full_recompute:
            # Recomputed layers run inside an autograd Function, which passes gradients to
            # the layers' parameters only when one of its inputs requires grad.
            embeddings.requires_grad_(True)
        if sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                return self.embedding_dropout(embeddings)
        return self.embedding_dropout(embeddings)
