"""The names of the arms and codes, and the rules a fixed code's flags and vocabulary must follow
(megatron_ext/codes/schemes.py), without torch: the data tools and the run config check them at
start-up, before any tensor is needed, and a tool that only reads a run's files imports no torch."""

from __future__ import annotations

from typing import Optional

from ..runtime.errors import FlagError

# The fixed codes (--input-interface).
SCHEMES = ("binary", "gf2", "permuted", "random")
# The input tables (--input-interface): the learned table, the control; Megatron's initial
# table, never trained; a learned table of rank --input-table-rank (V x r, then r x h).
TABLES = ("learned", "frozen", "factorized")
# The arms (--input-interface): an input table or a fixed code.
ARMS = (*TABLES, *SCHEMES)
PAPER_ARMS = ("learned", "binary", "gf2")  # the paper's comparison (submit's, the demo's)
TABLE_SCHEMES = ("permuted", "random")  # the code input x(t) is a stored per-id table
TILINGS = ("repeat", "recode")
VALUE_MAPS = ("pm1", "01")

MAX_BITS = 62


def check_options(num_bits: int, scale: float, hidden_size: Optional[int] = None) -> None:
    """The rules on the code's flags themselves; :class:`FlagError` naming the flag."""
    if not 1 <= num_bits <= MAX_BITS:
        raise FlagError(f"--code-bits must be in [1, {MAX_BITS}], got {num_bits}")
    if not scale > 0:
        raise FlagError(f"--code-scale must be positive, got {scale}")
    if hidden_size is not None and hidden_size < num_bits:
        raise FlagError(f"--hidden-size {hidden_size} is smaller than --code-bits {num_bits}: "
                        f"the first copy of the code must fit whole")


def check_vocab_fits(vocab_size: int, num_bits: int, tokens: Optional[int] = None) -> None:
    """Every id in ``[0, vocab_size)`` needs its own n-bit code: ``vocab_size <= 2^n``. The
    one rule, for every caller: training checks the padded vocabulary (the ids the model's
    code serves), ``tokens`` being the tokenizer's size before the padding; the data tools,
    which know no padding, check the tokenizer's. :class:`FlagError` naming the flags that
    fix it."""
    if vocab_size > 2 ** num_bits:
        padded = tokens is not None and tokens != vocab_size
        raise FlagError(
            f"vocabulary of {vocab_size} tokens"
            + (f" (the tokenizer's {tokens}, padded by --make-vocab-size-divisible-by)"
               if padded else "")
            + f" does not fit a {num_bits}-bit code (at most 2^{num_bits} = {2 ** num_bits}); "
            f"raise --code-bits to at least {max(vocab_size - 1, 1).bit_length()}"
            + (" or lower --make-vocab-size-divisible-by"
               if padded and tokens <= 2 ** num_bits else ""))

