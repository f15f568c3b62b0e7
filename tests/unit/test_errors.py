"""The typed errors of megatron_ext/runtime/errors.py and the one place they become an exit:
the command lines' ``exits_on_error``. The package itself never exits (read from the source
text)."""

from __future__ import annotations

import ast
import re

import pytest

from conftest import REPO
from megatron_ext.runtime.errors import (CheckpointError, ConversionError, DataError, DeviceError,
                                         FixedcodeError, FlagError, Interrupted, LaunchError,
                                         StudyError, TrainingError, exits_on_error, joined)

TYPED = [FlagError, DataError, CheckpointError, DeviceError, StudyError, ConversionError,
         LaunchError, TrainingError, Interrupted]


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
EXITS = re.compile(r"raise SystemExit\b|sys\.exit\(")


def test_only_the_errors_module_exits():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "runtime" / "errors.py":
            continue
        found += [f"{path.relative_to(REPO).as_posix()}:{n}" for n, line in
                  enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                  if EXITS.search(line)]
    assert not found, found


def exception_classes():
    """``(module path, class name, its base names)`` of every class of the package whose
    name or bases say it is an exception, read from the source text."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b) for b in node.bases]
                if any(re.search(r"Error|Exception|Failed|Deleted|Damaged|BadInput|Interrupted",
                                 name) for name in [node.name, *bases]):
                    yield path.relative_to(REPO).as_posix(), node.name, bases


def test_every_exception_of_the_package_is_a_typed_error():
    """An exception the library raises can be caught as a :class:`FixedcodeError` and ends a
    command with its ``error:`` line and status (the six that once stood outside: the
    non-finite stop, a failed save, a damaged or deleted save, a bad index, a bad input
    line)."""
    import importlib
    found = list(exception_classes())
    assert len(found) >= 15, found  # the hierarchy and its subclasses, read
    for path, name, _ in found:
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        cls = getattr(module, name)
        assert issubclass(cls, FixedcodeError) or cls is FixedcodeError, f"{path}: {name}"


def test_the_exit_statuses_slurm_reads_come_from_the_error_types():
    """slurm/fixedcode.sbatch does not requeue exit 4 (a failed save) and reports exit 3 (the
    non-finite stop) as a crash: both are their error types' status."""
    from megatron_ext.checkpoint.saving import SaveFailed
    from megatron_ext.train.step import NonFiniteLossError
    assert (NonFiniteLossError.exit_code, SaveFailed.exit_code) == (3, 4)
    assert "(( rc == 4 ))" in (REPO / "slurm" / "fixedcode.sbatch").read_text()
    for cls in (NonFiniteLossError, SaveFailed):
        with pytest.raises(SystemExit) as e:
            with exits_on_error():
                raise cls("stopped")
        assert e.value.code == cls.exit_code
    assert "exit(3)" not in (REPO / "pretrain_fixedcode.py").read_text()
