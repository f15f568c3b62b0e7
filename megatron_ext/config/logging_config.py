"""Validation, logging and profiling as flags: :class:`LoggingConfig`, one field per flag
(Megatron-LM's names), with the checks that need only these flags and the one that needs the
run's device (:meth:`LoggingConfig.check_device`)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..runtime.errors import FlagError
from .flag_fields import FlagConfig, flag

PROFILING_GROUP = "profiling (see megatron_ext/train/profiling.py)"


@dataclasses.dataclass(frozen=True)
class LoggingConfig(FlagConfig):
    """Validation, the log line and the metrics' sinks (metrics file, TensorBoard, wandb),
    and profiling."""
    FLAG_GROUP = "validation and logging"
    eval_interval: int = flag(1000, "validate every this many steps (and at the last)",
                              resume="free", megatron_lm=(None, "no validation during training"))
    eval_iters: int = flag(10, "global batches per validation (0: no validation)", least=0,
                           resume="free", megatron_lm=(100, "100 batches per validation"))
    log_interval: int = flag(100, "log (and record) every this many steps", resume="free")
    tensorboard_dir: Optional[str] = flag(None, "write the metrics as TensorBoard scalars here",
                                          resume="free", study="per_run")
    tensorboard_log_interval: int = flag(
        1, "TensorBoard and wandb: the iteration's loss, learning rate, batch size and grad "
           "norm every this many iterations (as in Megatron-LM); the rest every "
           "--log-interval", resume="free")
    metrics_file: Optional[str] = flag(
        None, "append one JSON line per log interval and validation here (default: "
              "metrics.jsonl in --save)", resume="free", study="per_run")
    log_params_norm: bool = flag(
        False, "log the L2 norm of all parameters (one extra reduction per log interval)",
        resume="free")
    log_num_zeros_in_grad: bool = flag(
        False, "log the number of zero gradient entries (counted at every step)", resume="free")
    log_layer_norms: bool = flag(
        False, "log gradient and parameter norms of the input table, the first, middle and "
               "last layer and the output head (one extra reduction per log interval)",
        resume="free")
    wandb_project: Optional[str] = flag(
        None, "log to this Weights & Biases project (needs the wandb extra; WANDB_MODE=offline "
              "on clusters without internet, then wandb sync)", resume="free")
    wandb_exp_name: Optional[str] = flag(None, "the wandb run's name", resume="free")
    wandb_entity: Optional[str] = flag(None, "the wandb team or user", resume="free")
    wandb_save_dir: Optional[str] = flag(
        None, "where wandb writes its run files (default: --save/wandb)", resume="free")
    profile: bool = flag(
        False, "record iterations --profile-step-start+1 .. --profile-step-end: for Nsight "
               "Systems (GPU), or with --use-pytorch-profiler", group=PROFILING_GROUP,
        resume="free")
    use_pytorch_profiler: bool = flag(
        False, "a PyTorch profiler trace per rank in --tensorboard-dir", group=PROFILING_GROUP,
        resume="free")
    profile_step_start: int = flag(10, "profile from the step after this one", least=0,
                                   group=PROFILING_GROUP, resume="free")
    profile_step_end: int = flag(12, "profile up to and including this step", least=0,
                                 group=PROFILING_GROUP, resume="free")
    profile_ranks: tuple[int, ...] = flag((0,), "ranks to profile", least=0, nargs="+",
                                          group=PROFILING_GROUP, resume="free")

    def validate(self) -> None:
        if not self.profile:
            return
        if not 0 <= self.profile_step_start < self.profile_step_end:
            raise FlagError(f"--profile-step-start {self.profile_step_start} must be >= 0 "
                            f"and below --profile-step-end {self.profile_step_end}")
        if self.use_pytorch_profiler and not self.tensorboard_dir:
            raise FlagError("--use-pytorch-profiler writes its trace to --tensorboard-dir; "
                            "give one")

    def check_device(self, device: str) -> None:
        """The check that needs the run's device (``--device auto`` settled)."""
        if self.profile and not self.use_pytorch_profiler and device != "cuda":
            raise FlagError("--profile without --use-pytorch-profiler is for Nsight Systems "
                            "and needs a GPU; add --use-pytorch-profiler on CPU")
