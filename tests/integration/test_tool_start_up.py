"""The commands that plan and queue work (tools/plan.py, tools/submit.py, tools/study.py with the
Slurm launcher) import neither torch nor megatron-core, run as a user runs them: each starts and
plans in about 0.1 s, where importing torch took 1.4 s (the flag parser's arm names came with
the codes' torch module) and a study's fresh runs 3 s more (megatron-core, to read checkpoints
that are not there). tools/check_data.py and tools/preprocess_data.py have their own such test."""

from __future__ import annotations

import pytest

from conftest import REPO
from helpers.imports import run_importing

SMOLLM2 = "examples/smollm2_1p7b"
COMMANDS = {
    "plan": ["tools/plan.py", "--study", f"{SMOLLM2}/study_100b.toml", "--vocab-size", "49152",
             "--gpus-per-node", "8"],
    "submit": ["tools/submit.py", "--recipe", f"{SMOLLM2}/recipe.args", "--run-dir", "{tmp}",
               "--dry-run"],
    "study": ["tools/study.py", "run", "{tmp}", "--study", "examples/cpu_study/study.toml",
              "--launcher", "slurm", "--gpus-per-node", "0", "--ntasks-per-node", "2",
              "--dry-run"],
}


@pytest.mark.integration
@pytest.mark.parametrize("name", COMMANDS)
def test_the_command_imports_neither_torch_nor_megatron_core(name, tmp_path):
    done, imported = run_importing([a.format(tmp=tmp_path / "runs") for a in COMMANDS[name]],
                                   REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), "the command printed its plan or scripts"
    assert "megatron_ext" in imported
    assert not {"torch", "megatron.core"} & imported, sorted(
        m for m in imported if m.split(".")[0] in ("torch", "megatron"))
