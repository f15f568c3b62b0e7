"""A fixed code as a run draws it: the ``--code-*`` flags' declared defaults
(``config.model_config.ModelConfig``) for the options a test does not give."""

from __future__ import annotations

from typing import Optional

from megatron_ext.codes.schemes import FixedCode
from megatron_ext.config.model_config import ModelConfig


def new_code(scheme: str, vocab_size: Optional[int] = None, hidden_size: Optional[int] = None,
             **options) -> FixedCode:
    """``FixedCode.create(scheme, ...)`` with ``options`` (its keywords) over the flags'
    defaults."""
    flags = ModelConfig()
    given = {"num_bits": flags.code_bits, "values": flags.code_values,
             "scale": flags.code_scale, "seed": flags.code_seed, "tiling": flags.code_tiling,
             **options}
    return FixedCode.create(scheme, vocab_size=vocab_size, hidden_size=hidden_size, **given)
