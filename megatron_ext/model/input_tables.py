"""The input tables beside the learned one (``--input-interface frozen``, ``factorized``): what
the model provider makes of GPTModel's embedding for those arms. (The trainable map over a
fixed code, ``--code-projection``, is the fixed-code embedding's: megatron_ext/codes/embedding.py.)

- ``frozen``: GPTModel's own table, initialised as the learned arm's (the same draw for one
  ``--seed``), then never trained (``requires_grad`` off: no gradient, no optimizer state).
  It is a model weight, so checkpoints store it and a resumed or exported model reads it.
- ``factorized``: a learned table of rank r, ``E = T·P`` with ``T`` (V x r, Megatron's
  vocabulary-parallel table, N(0, std)) and ``P`` (r x h, N(0, 1/r): the product starts at
  the learned table's RMS, std).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from megatron.core.tensor_parallel import VocabParallelEmbedding
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig


class FactorizedWordEmbedding(MegatronModule):
    """Stands in for ``LanguageModelEmbedding.word_embeddings``: ids ``[b, s]`` -> ``[b, s, h]``,
    ``table(ids) @ projection.T``. The table is vocabulary-parallel (sharded and reduced
    over tensor-parallel ranks as Megatron's); the projection is replicated, and its gradient
    is the same on every tensor-parallel rank (the embedding's output gradient is)."""

    def __init__(self, config: TransformerConfig, vocab_size: int, rank: int,
                 tp_group: Optional[torch.distributed.ProcessGroup] = None):
        super().__init__(config=config)
        self.table = VocabParallelEmbedding(num_embeddings=vocab_size, embedding_dim=rank,
                                            init_method=config.embedding_init_method,
                                            reduce_scatter_embeddings=False, config=config,
                                            tp_group=tp_group)
        # Drawn on the CPU from the process's generator, which every tensor-parallel rank
        # seeds alike (--seed), after the backbone: the same map on every rank.
        projection = torch.empty(config.hidden_size, rank, device="cpu").normal_(0.0, rank ** -0.5)
        self.projection = torch.nn.Parameter(
            projection.to(device=self.table.weight.device, dtype=config.params_dtype))

    def forward(self, input_ids: Tensor) -> Tensor:
        return torch.nn.functional.linear(self.table(input_ids), self.projection)


def factorize(model: torch.nn.Module, config: TransformerConfig, vocab_size: int,
              rank: int) -> None:
    """Make GPTModel ``model``'s input table factorised, of rank ``rank``."""
    embedding = model.embedding
    embedding.word_embeddings = FactorizedWordEmbedding(config, vocab_size, rank,
                                                        embedding.tp_group)
    # The factorised table returns [b, s, h]: the embedding transposes and scatters it for
    # sequence parallelism itself (Megatron's table would reduce-scatter in its lookup).
    embedding.reduce_scatter_embeddings = False


def freeze(model: torch.nn.Module) -> None:
    """Make GPTModel ``model``'s input table fixed: never trained, no gradient allocated."""
    model.embedding.word_embeddings.weight.requires_grad_(False)
