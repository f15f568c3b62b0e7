"""The rules a fixed code's flags and vocabulary must follow (megatron_ext/codes.py), without
torch: the data tools check them at start-up, before any tensor is needed."""

from __future__ import annotations

from typing import Optional

MAX_BITS = 62


def check_options(num_bits: int, scale: float, hidden_size: Optional[int] = None) -> None:
    """The rules on the code's flags themselves; ``ValueError`` naming the flag."""
    if not 1 <= num_bits <= MAX_BITS:
        raise ValueError(f"--code-bits must be in [1, {MAX_BITS}], got {num_bits}")
    if not scale > 0:
        raise ValueError(f"--code-scale must be positive, got {scale}")
    if hidden_size is not None and hidden_size < num_bits:
        raise ValueError(f"--hidden-size {hidden_size} is smaller than --code-bits {num_bits}: "
                         f"the first copy of the code must fit whole")


def check_vocab_fits(vocab_size: int, num_bits: int) -> None:
    """Every id in ``[0, vocab_size)`` needs its own n-bit code: ``vocab_size <= 2^n``."""
    if vocab_size > 2 ** num_bits:
        raise ValueError(
            f"vocabulary of {vocab_size} tokens does not fit a {num_bits}-bit code "
            f"(at most 2^{num_bits} = {2 ** num_bits}); raise --code-bits to at least "
            f"{max(vocab_size - 1, 1).bit_length()}")
