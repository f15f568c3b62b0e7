"""Recipes: files of pretrain_fixedcode.py flags shared by the runs of an experiment (model
shape, data, schedule), ``#`` starting a comment. tools/submit.py and tools/study.py read
them; each refuses the flags it sets itself for every run. :class:`RecipeFile` declares the
tools' ``--recipe``."""

from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path
from typing import Optional, Sequence

from ..runtime.errors import DataError, FlagError
from .flag_fields import FlagConfig, flag


@dataclasses.dataclass(frozen=True)
class RecipeFile(FlagConfig):
    """The recipe a tool reads (tools/plan.py, submit.py, study.py, build_data_cache.py)."""
    recipe: Optional[Path] = flag(None, "file of pretrain_fixedcode.py flags shared by the runs")


def read_recipe(path: Path, refused: Sequence[str], setter: str) -> list[str]:
    """The recipe's flags; a flag in ``refused`` is an error saying that ``setter`` sets
    it."""
    path = Path(path)
    if not path.is_file():
        raise FlagError(f"--recipe {path}: no such file")
    flags = shlex.split(path.read_text(), comments=True)
    if flags and not flags[0].startswith("--"):
        raise FlagError(f"recipe {path} must start with a --flag, not {flags[0]!r}")
    for token in flags:
        if token.split("=")[0] in refused:
            raise FlagError(f"recipe {path} sets {token.split('=')[0]}, which "
                            f"{setter}; remove it")
    return flags


TRAINING_DATA_FLAGS = ("--data-path", "--train-data-path")  # prefixes a run trains on


def training_prefixes(flags: Sequence[str]) -> list[str]:
    """The dataset prefixes that ``flags`` (a recipe, a run's flags) train on: those of
    ``--data-path`` (Megatron's split puts its first documents in the training split) and
    ``--train-data-path``, weights dropped."""
    prefixes, taking = [], False
    for token in flags:
        flag, eq, value = token.partition("=")
        if token.startswith("--"):
            taking = flag in TRAINING_DATA_FLAGS
            if taking and eq:
                prefixes.append(value)
            continue
        if taking and not is_weight(token):
            prefixes.append(token)
    return prefixes


def is_weight(token: str) -> bool:
    """Whether a value of a data-path flag is a blend weight (a number), not a prefix."""
    try:
        float(token)
    except ValueError:
        return False
    return True


def check_held_out(held_out: str, trained: Sequence[str], base: Path, what: str, whose: str,
                   allow: bool, override: str) -> bool:
    """Refuse a held-out prefix (``what``, e.g. a setting's name) that is one of the
    ``trained`` prefixes of ``whose`` (a recipe, a model; relative prefixes are taken from
    ``base``, the folder runs start in), naming both, unless ``allow`` (whose switch,
    ``override``, the error names); returns whether the held-out tokens are training text
    (then reported)."""
    same = [p for p in trained
            if os.path.realpath(Path(base) / p) == os.path.realpath(held_out)]
    if same and not allow:
        raise DataError(f"{what} {held_out} is a training prefix ({same[0]}) of "
                        f"{whose}: it would score training text. Build a held-out set "
                        f"from documents the training blend never reads (docs/studies.md), "
                        f"or give {override} to score it anyway (reported)")
    return bool(same)
