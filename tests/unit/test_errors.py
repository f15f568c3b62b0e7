"""The typed errors of megatron_ext/runtime/errors.py and the one place they become an exit:
the command lines' ``exits_on_error``. The package itself never exits (read from the source
text)."""

from __future__ import annotations

import re

import pytest

from conftest import REPO
from megatron_ext.runtime.errors import (CheckpointError, ConversionError, DataError, DeviceError,
                                         FixedcodeError, FlagError, LaunchError, StudyError,
                                         exits_on_error, joined)

TYPED = [FlagError, DataError, CheckpointError, DeviceError, StudyError, ConversionError,
         LaunchError]


def test_an_error_becomes_its_error_line_as_a_system_exit():
    with pytest.raises(SystemExit) as e:
        with exits_on_error():
            raise FlagError("--lr -1 is negative")
    assert e.value.code == "error: --lr -1 is negative"


def test_an_error_with_another_status_prints_its_line_and_exits_with_it(capsys):
    class Busy(FixedcodeError):
        exit_code = 3

    with pytest.raises(SystemExit) as e:
        with exits_on_error():
            raise Busy("the queue is full")
    assert e.value.code == 3
    assert capsys.readouterr().err == "error: the queue is full\n"


def test_other_exits_and_exceptions_pass_through():
    with pytest.raises(SystemExit) as e:
        with exits_on_error():
            raise SystemExit(4)
    assert e.value.code == 4
    with pytest.raises(KeyError):
        with exits_on_error():
            raise KeyError("x")


def test_several_problems_read_one_error_line_each():
    with pytest.raises(SystemExit) as e:
        with exits_on_error():
            raise DataError(joined(["a", "b"]))
    assert e.value.code == "error: a\nerror: b"


@pytest.mark.parametrize("cls", TYPED, ids=lambda c: c.__name__)
def test_each_typed_error_is_a_value_or_runtime_error(cls):
    assert issubclass(cls, FixedcodeError)
    assert issubclass(cls, (ValueError, RuntimeError))
    assert cls.exit_code == 1


PACKAGE = REPO / "megatron_ext"
# Deliberate exits that are not errors, by path, with why.
NOT_ERRORS = {
    # Ctrl-C of `tools/study.py run`: the run saved its checkpoint; the message says how to
    # continue, not an "error: " line.
    "megatron_ext/study/launch.py",
}
EXITS = re.compile(r"raise SystemExit\b|sys\.exit\(")


def test_only_the_errors_module_exits():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        if path == PACKAGE / "runtime" / "errors.py" or relative in NOT_ERRORS:
            continue
        found += [f"{relative}:{n}" for n, line in
                  enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                  if EXITS.search(line)]
    assert not found, found


def test_the_kept_exits_are_the_ones_named():
    """A path in NOT_ERRORS keeps exactly its one non-error exit."""
    for relative in NOT_ERRORS:
        text = (REPO / relative).read_text(encoding="utf-8")
        assert len(EXITS.findall(text)) == 1, relative
