"""The model and budget a study's scaling fit extrapolates to: the paper's, the
``smollm2-1.7b`` preset (:data:`megatron_ext.config.model_config.PRESETS`: the shape of the
paper's recipe, ``examples/smollm2_1p7b/recipe.args``, held the same by
``tests/integration/test_scaling.py``) trained on :data:`PAPER_TOKENS`. In compute, its
FLOPs as the training log counts them; in model size and budget, its non-embedding
parameters and the tokens."""

from __future__ import annotations

from ...config.arguments import parse_flags
from ...config.model_config import padded_vocab_size
from ...config.run_config import RunConfig
from ...metrics.flops import flops_per_token

PAPER_PRESET = "smollm2-1.7b"  # the shape and the SmolLM2 vocabulary
PAPER_TOKENS = 100e9


def paper_config() -> RunConfig:
    """The paper's model: the :data:`PAPER_PRESET` shape with its vocabulary."""
    return RunConfig.from_flags(parse_flags(["--preset", PAPER_PRESET], ""))


def paper_compute() -> float:
    """The paper's training FLOPs: its model's FLOPs per token (the log's count) times
    :data:`PAPER_TOKENS`."""
    config = paper_config()
    vocab = padded_vocab_size(config.data.vocab_size, config.model.make_vocab_size_divisible_by,
                              1)
    return flops_per_token(config.model, vocab) * PAPER_TOKENS


def paper_parameters() -> int:
    """The paper's non-embedding parameters (all but the input table, as the evaluation
    records count them): its model counted on the meta device (the local implementation:
    the same parameters as Transformer Engine's)."""
    from ...model.param_count import count_arms  # torch and megatron-core: only L(N, D) counts
    counts = count_arms(paper_config().replace(transformer_impl="local"), ["learned"])["learned"]
    return counts["total"] - counts["input"]
