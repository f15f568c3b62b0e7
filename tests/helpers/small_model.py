"""The small model of the embedding and GPU-readiness tests, as parsed flags."""

from __future__ import annotations

from megatron_ext.config.arguments import padded_vocab_size, parse_model_args

VOCAB = 500
SMALL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
         "--seq-length", "16", "--vocab-size", str(VOCAB)]
SMALL_VOCAB = padded_vocab_size(VOCAB, 128, 1)


def small_args(arm: str, *extra: str):
    return parse_model_args(SMALL + ["--input-interface", arm, *extra], "test")
