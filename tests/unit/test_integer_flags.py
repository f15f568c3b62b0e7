"""Every integer flag of the training entry point has a least value, checked when the flags
are parsed: ``--log-interval 0`` or ``--eval-interval 0`` (a division by zero in the loop)
is refused with ``error:`` naming the flag, as is any other integer flag below its least
value (0 where 0 has a meaning its help states, else 1)."""

from __future__ import annotations

import pytest

from conftest import TINY_RUN
from megatron_ext.config.arguments import add_training_args, build_parser, parse_model_config
from megatron_ext.config.flag_types import nonnegative_int, positive_int


def integer_flags() -> list[tuple[str, object, int]]:
    """``(flag, type, values)`` of every flag of the entry point's parser that takes integers
    (``values``: how many it takes)."""
    parser = build_parser("test")
    add_training_args(parser)
    return [(action.option_strings[0], action.type,
             action.nargs if isinstance(action.nargs, int) else 1)
            for action in parser._actions if action.type in (int, positive_int, nonnegative_int)]


def test_no_integer_flag_is_unbounded():
    flags = integer_flags()
    assert len(flags) > 30  # the parser was read
    assert [flag for flag, kind, _ in flags if kind is int] == []


@pytest.mark.parametrize("flag, kind, values", integer_flags(),
                         ids=[f for f, _, _ in integer_flags()])
def test_an_integer_flag_below_its_least_value_is_refused(flag, kind, values, capsys):
    least = 1 if kind is positive_int else 0
    with pytest.raises(SystemExit) as refused:
        parse_model_config(TINY_RUN + ["--train-iters", "2", flag, *[str(least - 1)] * values],
                           "test", add_training_args)
    assert refused.value.code == 2
    assert f"error: argument {flag}: must be at least {least}, got {least - 1}" \
        in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--log-interval", "--eval-interval"])
def test_the_issues_intervals_accept_one(flag):
    args = parse_model_config(TINY_RUN + ["--train-iters", "2", flag, "1"], "test",
                              add_training_args)[1]
    assert getattr(args, flag[2:].replace("-", "_")) == 1
