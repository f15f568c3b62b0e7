"""What a command imports, as a user runs it: the command in a process of its own under
``python -X importtime``, and the names of the modules that process imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_importing(argv: list, cwd: Path) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``(the finished command, the modules it imported)``: ``argv`` is a script and its
    arguments, run by this interpreter in ``cwd``."""
    done = subprocess.run([sys.executable, "-X", "importtime", *map(str, argv)], cwd=cwd,
                          capture_output=True, text=True, timeout=60)
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    return done, imported
