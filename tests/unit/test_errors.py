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


TOOLS = sorted((REPO / "tools").glob("*.py"))


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: p.name)
def test_no_tool_exits_with_a_message_of_its_own(path):
    """A tool's refusal is a typed error its ``exits_on_error`` turns into ``error: ...``
    (``SystemExit`` with a status alone stays: a tool that printed its problems already)."""
    calls = [node for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Call) and ast.unparse(node.func) == "SystemExit"]
    messages = [ast.unparse(call) for call in calls if call.args and not (
        isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, int))]
    assert not messages, messages


def test_the_errors_a_user_meets_in_the_codes_and_the_split_are_typed():
    """``--split`` that names no split, ``--fixed-code-impl cuda`` without the ids on a GPU,
    the CUDA extension where it cannot be built: typed, so a command ends with its
    ``error:`` line (they were a ValueError and RuntimeErrors)."""
    import torch
    from megatron_ext.codes import cuda_extension, kernels
    from helpers.codes import new_code
    from megatron_ext.datasets.split_checks import split_ranges
    with pytest.raises(FlagError, match=re.escape("--split 0,0: give one to three")):
        split_ranges("0,0", 10)
    code = new_code("binary")
    inputs = (code, torch.arange(4), torch.zeros(0, dtype=torch.int64),
              kernels.lookup_tables(code, 16), 16, torch.float32)
    with pytest.raises(DeviceError, match="--fixed-code-impl cuda needs the token ids on a GPU"):
        kernels.fixed_code_forward(*inputs, "cuda")  # the ids on the CPU
    with pytest.raises(FlagError, match="unknown fixed-code implementation 'fast'"):
        kernels.fixed_code_forward(*inputs, "fast")
    if torch.version.cuda is None:  # this machine's CPU build: no extension to build
        with pytest.raises(DeviceError, match="the fixed-code CUDA extension is unavailable"):
            cuda_extension.load()


@pytest.mark.parametrize("flags, message", [
    (["--data-path", "d"],
     "give --data-cache-path: the directory the training job loads the caches from"),
    (["--data-cache-path", "c", "--mock-data"], "--mock-data: nothing to build ahead"),
    (["--data-cache-path", "c", "--data-path", "d"],
     "give --global-batch-size, or the training job's --world-size"),
    (["--data-cache-path", "c", "--data-path", "d", "--world-size", "3",
      "--tensor-model-parallel-size", "2"],
     "--world-size 3 is not a multiple of --tensor-model-parallel-size 2 x "
     "--pipeline-model-parallel-size 1"),
])
def test_the_cache_builder_refuses_with_typed_errors(flags, message):
    """tools/build_data_cache.py's refusals are ``error: ...`` lines of typed errors, and its
    flags are left as parsed."""
    from tools import build_data_cache
    shape = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
             "--seq-length", "32", "--vocab-size", "511", "--train-iters", "2"]
    with pytest.raises(SystemExit) as e:
        build_data_cache.main(shape + flags)
    assert e.value.code.startswith(f"error: {message}"), e.value.code
