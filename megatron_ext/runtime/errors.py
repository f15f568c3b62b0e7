"""The errors the library raises, as types, and the one place they become an exit.

Every module of the package raises one of these (never ``SystemExit``): a caller (a study,
a test, another tool) can catch them and add context. The message is what the user reads
after ``error: `` (a message of several problems puts ``error: `` before each line after
the first itself, so every line reads as it always has). The command lines (tools/,
pretrain_fixedcode.py) turn them into that line on stderr and the exit status in
:func:`exits_on_error`, once.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator


class FixedcodeError(Exception):
    """What a user did or gave cannot run; ``exit_code`` is the command's exit status."""
    exit_code = 1


class FlagError(FixedcodeError, ValueError):
    """A flag's value, or a combination of flags, is refused (the message names the flag)."""


class DataError(FixedcodeError, ValueError):
    """A data file, tokenizer or held-out set is missing, damaged or does not fit the run
    (the message names the file)."""


class CheckpointError(FixedcodeError, RuntimeError):
    """A checkpoint cannot be found, read, trusted or resumed by this run."""


class DeviceError(FixedcodeError, RuntimeError):
    """The machine lacks what the run needs (a GPU feature, a library, an environment)."""


class StudyError(FixedcodeError, ValueError):
    """A study file, its runs or its evaluations are refused (the message names the file)."""


class ConversionError(FixedcodeError, RuntimeError):
    """A checkpoint cannot be exported, or its export does not reproduce it."""


class LaunchError(FixedcodeError, RuntimeError):
    """A job cannot be submitted or launched."""


class TrainingError(FixedcodeError, RuntimeError):
    """Training cannot go on (the message says why and what of the run is intact)."""


class Interrupted(FixedcodeError, RuntimeError):
    """The user stopped a command (Ctrl-C, SIGTERM) after what it was doing was saved; the
    message says how to continue."""


def joined(problems: list[str]) -> str:
    """Several problems in one message: each line after the first with its own
    ``error: ``, as the command line prints the first."""
    return "\nerror: ".join(problems)


def message(error: FixedcodeError) -> str:
    """The text the command line prints for ``error``."""
    return f"error: {error}"


@contextlib.contextmanager
def exits_on_error() -> Iterator[None]:
    """Around a command line's ``main``: a :class:`FixedcodeError` becomes ``error: ...`` on
    stderr and the error's exit status, with no traceback. Status 1 is ``SystemExit`` with
    the message itself (the interpreter prints it), as the command lines have always ended;
    another status prints the message first."""
    try:
        yield
    except FixedcodeError as error:
        if error.exit_code == 1:
            raise SystemExit(message(error)) from None
        print(message(error), file=sys.stderr, flush=True)
        raise SystemExit(error.exit_code) from None
