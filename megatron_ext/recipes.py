"""Recipes: files of pretrain_fixedcode.py flags shared by the runs of an experiment (model
shape, data, schedule), ``#`` starting a comment. tools/submit.py and tools/study.py read
them; each refuses the flags it sets itself for every run."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence


def read_recipe(path: Path, refused: Sequence[str], setter: str) -> list[str]:
    """The recipe's flags; a flag in ``refused`` is an error saying that ``setter`` sets
    it."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"error: --recipe {path}: no such file")
    flags = shlex.split(path.read_text(), comments=True)
    if flags and not flags[0].startswith("--"):
        raise SystemExit(f"error: recipe {path} must start with a --flag, not {flags[0]!r}")
    for token in flags:
        if token.split("=")[0] in refused:
            raise SystemExit(f"error: recipe {path} sets {token.split('=')[0]}, which "
                             f"{setter}; remove it")
    return flags
