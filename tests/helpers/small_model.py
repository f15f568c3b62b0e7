"""The small model of the embedding and GPU-readiness tests, as its run's config."""

from __future__ import annotations

from megatron_ext.config.arguments import parse_model_config
from megatron_ext.config.model_config import padded_vocab_size

VOCAB = 500
SMALL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
         "--seq-length", "16", "--vocab-size", str(VOCAB)]
SMALL_VOCAB = padded_vocab_size(VOCAB, 128, 1)


def small_args(arm: str, *extra: str):
    return parse_model_config(SMALL + ["--input-interface", arm, *extra], "test")[0]
