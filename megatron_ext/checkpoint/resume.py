"""The resume policy: which checkpoint a run starts from and what of it applies
(:func:`resolve_checkpoint`), settled once at start-up, before the model is built.

* ``--save`` against ``--load``: a ``--save`` directory that holds a checkpoint is the run's
  own (:func:`own_saves`, the one definition), resumed even when ``--load`` names another
  directory (a requeued branch continues rather than starting over from where it branched);
  a run without ``--load`` refuses to overwrite it.
* ``--finetune``, ``--no-load-optim`` and ``--no-load-rng`` apply to ``--load``'s checkpoint,
  and need one there; a run that turned to its own saves resumes them whole.
* The checkpoint must fit the run (:func:`.compatibility.check_compatible`); the flags changed
  since it was saved are said; the learning-rate schedule is reconciled
  (:func:`.compatibility.reconcile_schedule`), unless the optimizer's state is not loaded.
* The run's fixed code: the checkpoint's (its A and b are never redrawn), else one drawn from
  the flags.

Loading the save itself is :mod:`.loading`'s; ``train/setup.py`` calls both."""

from __future__ import annotations

import os
from typing import NamedTuple, Optional

from ..codes.schemes import FixedCode, build_code
from ..config.checkpoint_config import LOAD_ONLY_FLAGS
from ..config.derived import Derived, run_record
from ..config.run_config import RunConfig
from ..runtime.errors import FlagError
from ..runtime.log import log
from . import compatibility, layout, loading


def own_saves(directory: Optional[str], save: Optional[str]) -> bool:
    """Whether ``directory`` (a checkpoint's folder) is the run's ``--save``: the run's own
    saves."""
    return bool(directory and save) and os.path.realpath(directory) == os.path.realpath(save)


class Resume(NamedTuple):
    """What a run starts from: the save to resume (``path`` and its common objects; None for a
    fresh run), the run's fixed code (None for a table arm), the run's config as the resume
    settles it (``config``), and whether the save is one of the run's own
    (:func:`own_saves`)."""
    path: Optional[str]
    common: Optional[dict]
    code: Optional[FixedCode]
    config: RunConfig
    own: bool = False


def resolve_checkpoint(config: RunConfig, derived: Derived) -> Resume:
    """The checkpoint to resume and the run's fixed code, resolved once (the caller passes
    the code to the model provider and to saving); ``config`` (the run's, settled for the
    machine) with whether the load-only flags apply and the schedule the run keeps (the
    checkpoint's, with ``--use-checkpoint-opt_param-scheduler``). Without the optimizer's
    state the schedule is the flags', from its step 0."""
    flags = config.checkpoint
    load = flags.load
    saved = layout.latest_iteration(flags.save) if flags.save else None
    if flags.finetune and saved is not None and own_saves(load, flags.save):
        raise FlagError(f"--finetune from --load {load} into the same --save: a --save "
                        f"directory that holds checkpoints is resumed as the run's own; "
                        f"save the fine-tuning to another directory")
    if saved is not None and not own_saves(load, flags.save):
        if not load:
            raise FlagError(f"--save {flags.save} already holds checkpoints (latest: "
                            f"iteration {saved}); resume them with --load {flags.save}, or "
                            f"save to another directory")
        log(f"[fixedcode] --save {flags.save} holds iteration {saved}: resuming from it, not "
            f"from --load {load}")
        load = flags.save
    step = flags.ckpt_step if load == flags.load else None
    if load != flags.load:  # turned to the run's own saves: resumed whole
        config = config.replace(**dict.fromkeys(LOAD_ONLY_FLAGS, False))
    flags = config.checkpoint
    latest = layout.latest_iteration(load) if load else None
    asked = [f"--{flag.replace('_', '-')}" for flag in LOAD_ONLY_FLAGS if getattr(flags, flag)]
    own = own_saves(load, flags.save)
    if asked and step is None and latest is None and own and not flags.finetune:
        # Megatron-LM's first launch of a job that resumes its own saves (--load = --save):
        # nothing to load yet, so it starts anew; the flags apply to the saves it resumes
        log(f"[fixedcode] --load {load} holds no checkpoint yet: starting from a random "
            f"initialisation ({' '.join(asked)} apply when it resumes its saves)")
    elif asked and step is None and latest is None:
        raise FlagError(f"{' '.join(asked)}: --load {load} holds no checkpoint (no "
                        f"{layout.MARKER}); without one the run would start from a random "
                        f"initialisation")
    if not (load and (step is not None or latest is not None)):
        return Resume(None, None, build_code(config.model, derived.padded_vocab_size), config)
    path, common = loading.load_common(load, step)
    current = run_record(config, derived)
    compatibility.check_compatible(common["args"], current, path)
    changed = compatibility.changed_on_resume(common["args"], current)
    if changed and not flags.finetune:
        log(f"[fixedcode] WARNING: resuming {path} with flags changed since it was saved "
            f"(from here the data order, or what the model computes, is not the "
            f"uninterrupted run's):\n  " + "\n  ".join(changed))
    code = None if common["fixed_code"] is None else FixedCode.from_dict(common["fixed_code"])
    if not (flags.finetune or flags.no_load_optim):
        compatibility.check_optimizer_resharding(common, config.parallel, path)
        changes, schedule = compatibility.reconcile_schedule(
            common["args"], config, derived.train_iters, derived.global_batch_size, path)
        config = config.replace(**schedule)
        if changes:
            log("[fixedcode] learning-rate schedule " + (
                "from these flags, not the checkpoint's: " if flags.override_opt_param_scheduler
                else "kept from the checkpoint; ignored: ") + ", ".join(changes))
    return Resume(path, common, code, config, own)
