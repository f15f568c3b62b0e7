"""Megatron-LM's ``--use-checkpoint-args`` (``load_args_from_checkpoint`` in its
``megatron/training/checkpointing.py``): the model and input flags of a run taken from the
checkpoint in ``--load`` (``--ckpt-step``, else its latest), before the flags are validated.
As there, the shape flags are filled only where the command line leaves them unset
(:data:`UNSET_ONLY`) and the others always (:data:`ALWAYS`), as each flag's field declares
(``checkpoint_args=``); the fixed code's flags are ours.
Part of parsing, as ``--preset`` is: the result is the run's flags. Reads the checkpoint's
common objects only (the resume verifies and loads the save later)."""

from __future__ import annotations

import os

from ..config.run_config import RunConfig, fields_where
from ..runtime.log import log
from ..runtime.megatron_compat import read_common_objects
from .manifest import written_by
from .layout import existing_save, latest_iteration

# What each flag's field declares for --use-checkpoint-args (flag_fields.CHECKPOINT_ARGS).
# Taken from the checkpoint where the command line does not give them (Megatron-LM's
# ``_set_arg(name)``): the shape.
UNSET_ONLY = tuple(f.name for _, f in fields_where(checkpoint_args="unset_only"))
# Always taken from the checkpoint (Megatron-LM's ``force=True``, and what else defines the
# model's function that it leaves to the command line: RoPE base, norm epsilon, dropouts),
# and the fixed code's flags.
ALWAYS = tuple(f.name for _, f in fields_where(checkpoint_args="always"))


def with_checkpoint_args(config: RunConfig) -> RunConfig:
    """With ``--use-checkpoint-args`` (and ``--load``: without it the flags' own check
    refuses), ``config`` with the flags of :data:`UNSET_ONLY` and :data:`ALWAYS` from the
    checkpoint in ``--load``, each one logged; without a checkpoint there, the flags stay as
    given (as in Megatron-LM), and the log says so."""
    checkpoint = config.checkpoint
    if not (checkpoint.use_checkpoint_args and checkpoint.load):
        return config
    if checkpoint.ckpt_step is None and (not os.path.isdir(checkpoint.load)
                                         or latest_iteration(checkpoint.load) is None):
        log(f"[fixedcode] --use-checkpoint-args: no checkpoint in --load {checkpoint.load}, "
            f"using the flags as given")
        return config
    path, _ = existing_save(checkpoint.load, checkpoint.ckpt_step)
    saved = read_common_objects(path, written_by(path))["args"]
    given, taken, changes = config.record(), [], {}
    for name in UNSET_ONLY + ALWAYS:
        if name in saved and (name in ALWAYS or given[name] is None):
            if given[name] != saved[name]:
                taken.append(f"--{name.replace('_', '-')} {saved[name]}")
            changes[name] = saved[name]
    log(f"[fixedcode] --use-checkpoint-args: from {path}: "
        + (", ".join(taken) if taken else "the flags as given already"))
    return config.replace(**changes)
