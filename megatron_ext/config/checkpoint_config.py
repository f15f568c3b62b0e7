"""Saving, loading, resuming and exiting as flags: :class:`CheckpointConfig`, one field per
flag (Megatron-LM's names), with the checks that need only these flags; what needs the
checkpoint itself is checked when it is resolved (``checkpoint/resume.py``)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..runtime.errors import FlagError
from .flag_fields import FlagConfig, flag, flag_name

# The flags that apply to the checkpoint of --load only, not to the run's own saves.
LOAD_ONLY_FLAGS = ("finetune", "no_load_optim", "no_load_rng")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(FlagConfig):
    """Saving (where, when, which saves are kept), loading and resuming (what is loaded,
    which schedule continues), and exiting (signals, a wall-clock budget, an interval)."""
    FLAG_GROUP = "checkpointing and exit"
    save: Optional[str] = flag(None, "checkpoint directory", resume="free", study="per_run")
    save_interval: Optional[int] = flag(
        None, "save a checkpoint every this many steps (and at the end)", resume="free")
    async_save: bool = flag(
        False, "write each save in the background (megatron-core's asynchronous "
               "dist-checkpointing); the marker moves once every rank has written, and the "
               "next save, an exit and the last iteration wait for it", resume="free")
    keep_last_checkpoints: Optional[int] = flag(
        None, "after each completed save, delete the older saves but the newest N (default: "
              "keep every save); never the marker's, a .partial, or one a study's evaluation "
              "is reading", metavar="N", resume="free")
    keep_checkpoints_every: Optional[int] = flag(
        None, "with --keep-last-checkpoints: keep every save whose iteration is a multiple of "
              "K for good (a study's curves)", metavar="K", resume="free")
    ckpt_format: str = flag(
        "torch_dist", "Megatron-Core dist_checkpointing (Megatron-LM's torch_dist), the only "
                      "format", choices=("torch_dist",), resume="free")
    save_lease_timeout: int = flag(
        300, "a run holds a lease on --save (.locks/run.lease, a heartbeat every tenth of "
             "this) and another run refuses that directory; a lease without a heartbeat for "
             "this long is taken over (at once: one of this Slurm job, or of a gone process "
             "on this host)", metavar="SECS", resume="free")
    load: Optional[str] = flag(
        None, "resume from the latest checkpoint here (none yet: start fresh)",
        resume="free", study="per_run")
    ckpt_step: Optional[int] = flag(
        None, "load this iteration of --load, not the latest", least=0, resume="free")
    use_checkpoint_args: bool = flag(
        False, "take the model and input flags from the checkpoint in --load, as in "
               "Megatron-LM: the shape flags where not given here, the others (--swiglu, "
               "--normalization, --input-interface, --code-*, ...) always", resume="free")
    no_load_optim: bool = flag(
        False, "on resume: load neither the optimizer state nor the learning-rate "
               "scheduler's (the schedule restarts from its step 0), as in Megatron-LM; the "
               "iteration and data position continue", resume="free")
    no_load_rng: bool = flag(
        False, "on resume: do not load the random-number states (re-seeded from --seed)",
        resume="free")
    finetune: bool = flag(
        False, "load only the model weights from --load: iteration 0, fresh optimizer, "
               "schedule and data order, as in Megatron-LM (a --save directory holding this "
               "run's own saves still resumes them fully)", resume="free")
    override_opt_param_scheduler: bool = flag(
        False, "on resume: continue with the schedule these flags give (--lr, "
               "--lr-decay-iters, ...) where it differs from the checkpoint's",
        names=("--override-opt_param-scheduler", "--override-opt-param-scheduler"), resume="free")
    use_checkpoint_opt_param_scheduler: bool = flag(
        False, "on resume: keep the checkpoint's schedule whatever these flags say",
        names=("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler"),
        resume="free")
    dist_ckpt_optim_fully_reshardable: bool = flag(
        False, "--use-distributed-optimizer: save the optimizer state gathered per parameter "
               "on data-parallel rank 0, so it resumes at any TP/PP size (default: "
               "dp_reshardable, written by every rank in parallel, resumes at another "
               "data-parallel size only), as in Megatron-LM", resume="free")
    exit_signal_handler: bool = flag(
        False, "on SIGTERM/SIGUSR1: finish the step, save, exit 0", resume="free", study="per_run")
    exit_duration_in_mins: Optional[float] = flag(
        None, "save and exit after this many minutes of wall time", resume="free")
    exit_interval: Optional[int] = flag(
        None, "save and exit when the iteration is a multiple of this", resume="free")

    def validate(self) -> None:
        if self.use_checkpoint_args and not self.load:
            raise FlagError("--use-checkpoint-args needs --load (the checkpoint to read)")
        for name in LOAD_ONLY_FLAGS:
            if getattr(self, name) and not self.load:
                raise FlagError(f"{flag_name(name)} needs --load (the checkpoint it reads)")
        if self.ckpt_step is not None and not self.load:
            raise FlagError("--ckpt-step needs --load")
        for name in ("save_interval", "async_save", "keep_last_checkpoints"):
            if getattr(self, name) and not self.save:
                raise FlagError(f"{flag_name(name)} needs --save")
        if self.keep_checkpoints_every and not self.keep_last_checkpoints:
            raise FlagError("--keep-checkpoints-every applies with --keep-last-checkpoints "
                            "only (without it every save is kept)")
        if self.override_opt_param_scheduler and self.use_checkpoint_opt_param_scheduler:
            raise FlagError("--override-opt_param-scheduler and "
                            "--use-checkpoint-opt_param-scheduler are exclusive")


@dataclasses.dataclass(frozen=True)
class SavedIteration(FlagConfig):
    """Which save of a ``--save`` folder a tool reads (tools/check_checkpoint.py,
    tools/convert_to_hf.py): ``--iteration`` in every tool. Training's flag for it stays
    Megatron-LM's ``--ckpt-step`` (:class:`CheckpointConfig`)."""
    iteration: Optional[int] = flag(
        None, "the save of this iteration (default: the latest completed one, the marker's)",
        least=0)
