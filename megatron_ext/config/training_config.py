"""The schedule and the optimizer as flags: :class:`TrainingConfig`, one field per flag
(Megatron-LM's names), with the checks of the run's length and of the schedule that need only
these flags. The schedule's arithmetic in samples is ``schedule.py``'s."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..runtime.errors import FlagError
from .flag_fields import FlagConfig, flag, flag_name

SPIKE_ACTIONS = ("log", "skip", "stop")  # --spiky-loss-action (train/spikes.py acts on them)


@dataclasses.dataclass(frozen=True)
class TrainingConfig(FlagConfig):
    """The schedule and the optimizer: the batch and the run's length, the learning-rate
    schedule (in samples, as Megatron-LM counts it: ``schedule.py``), AdamW, the input
    table's own rate and decay; the seed and the device; the step's guards (non-finite
    steps, spiky losses) and the garbage-collection policy."""
    FLAG_GROUP = "training"
    micro_batch_size: int = flag(1, "sequences per micro-batch per data-parallel rank",
                                 resume="free", megatron_lm=(None, "required"))
    # resume free as flags: the global batch (this, or the micro batch x data-parallel size)
    # and the decay length --train-iters defaults are derived, and the schedule's
    # reconciliation compares those (compatibility.reconcile_schedule)
    global_batch_size: Optional[int] = flag(
        None, "default micro batch x data-parallel size; accumulation is derived",
        resume="free", study="arm_fixed")
    train_iters: Optional[int] = flag(None, "training steps (or --train-samples)", resume="free")
    train_samples: Optional[int] = flag(
        None, "training sequences; steps = this / --global-batch-size", resume="free")
    lr: float = flag(3e-4, "peak learning rate", resume="schedule", megatron_lm=(None, "required"))
    min_lr: float = flag(0.0, "learning rate at the end of the decay", resume="schedule")
    lr_warmup_iters: int = flag(0, "linear warm-up steps", least=0, resume="schedule")
    lr_warmup_init: float = flag(0.0, "learning rate at the start of the warm-up",
                                 resume="schedule", added=True)
    lr_warmup_fraction: Optional[float] = flag(
        None, "warm-up as a fraction of the decay length (--lr-decay-iters or "
              "--lr-decay-samples), instead of --lr-warmup-iters/--lr-warmup-samples",
        resume="schedule")
    lr_warmup_samples: int = flag(
        0, "--train-samples runs: linear warm-up over this many samples", least=0,
        resume="schedule", added=True)
    lr_decay_iters: Optional[int] = flag(None, "default --train-iters", resume="schedule")
    lr_decay_samples: Optional[int] = flag(
        None, "--train-samples runs: decay over this many samples (default --train-samples)",
        resume="schedule")
    rampup_batch_size: Optional[tuple[int, ...]] = flag(
        None, "--train-samples runs: grow the global batch from START by INCREMENT over "
              "SAMPLES samples up to --global-batch-size, as in Megatron-LM",
        nargs=3, metavar=("START", "INCREMENT", "SAMPLES"), resume="free")
    lr_decay_style: str = flag(
        "cosine", "decay after the warm-up (WSD: constant, then --lr-wsd-decay-iters of decay)",
        choices=("constant", "linear", "cosine", "WSD"),
        resume="schedule", megatron_lm=("linear", "linear decay"))
    lr_wsd_decay_iters: Optional[int] = flag(None, "WSD: length of the final decay phase",
                                             resume="schedule")
    lr_wsd_decay_samples: Optional[int] = flag(
        None, "--train-samples runs: WSD's final decay in samples", resume="schedule")
    lr_wsd_decay_style: str = flag(
        "exponential", "WSD: shape of the final decay (as in Megatron-LM)",
        choices=("linear", "cosine", "exponential", "minus_sqrt"), resume="schedule")
    optimizer: str = flag(
        "adam", "Adam with decoupled weight decay (Megatron-LM's adam; its others are not "
                "supported)", choices=("adam",), resume="free")
    weight_decay: float = flag(0.1, "AdamW weight decay",
                               resume="schedule", megatron_lm=(0.01, "weight decay 0.01"))
    input_table_lr_mult: float = flag(
        1.0, "learned, factorized: the input table's learning rate is the schedule's times "
             "this (0 freezes it; the head and backbone keep the schedule's)",
        resume="schedule", added=True)
    input_table_weight_decay: Optional[float] = flag(
        None, "learned, factorized: the input table's AdamW weight decay (default "
              "--weight-decay)", resume="schedule", added=True)
    adam_beta1: float = flag(0.9, "Adam beta1", resume="free")
    adam_beta2: float = flag(0.95, "Adam beta2",
                             resume="free", megatron_lm=(0.999, "Adam beta2 0.999"))
    adam_eps: float = flag(1e-8, "Adam epsilon", resume="free")
    clip_grad: float = flag(1.0, "0 disables clipping", resume="free")
    seed: int = flag(1234, "seed of the backbone initialisation and the data order (the same "
                           "backbone in every arm)", least=0, resume="said", study="per_run")
    device: str = flag("auto", "auto: GPU when one is visible, else CPU over gloo",
                       choices=("auto", "cuda", "cpu"), resume="free")
    manual_gc: bool = flag(
        False, "turn Python's automatic garbage collector off and collect at fixed points "
               "(before and after validation, every --manual-gc-interval steps) so that ranks "
               "pause together, as in Megatron-LM", resume="free")
    manual_gc_interval: int = flag(
        0, "--manual-gc: collect every this many steps (0: not between steps)", least=0,
        resume="free")
    manual_gc_eval: bool = flag(True, "--manual-gc: no collection around validation",
                                resume="free")
    check_for_spiky_loss: bool = flag(
        False, "flag a step whose loss is --spiky-loss-factor x the largest of the first "
               "--spiky-loss-samples steps', as Megatron-LM (without its rerun); logged, or "
               "acted on with --spiky-loss-action", resume="free")
    spiky_loss_factor: float = flag(
        10.0, "--check-for-spiky-loss: Megatron-LM's SPIKY_LOSS_FACTOR", resume="free")
    spiky_loss_samples: int = flag(
        100, "--check-for-spiky-loss: the first steps whose largest loss is the reference",
        resume="free")
    spiky_loss_action: str = flag(
        "log", "--check-for-spiky-loss: log the spike (Megatron-LM's fatal=False), skip its "
               "update, or skip it and save and stop", choices=SPIKE_ACTIONS, resume="free")
    max_nonfinite_steps: int = flag(
        10, "stop with an error after this many updates in a row skipped for a non-finite "
            "loss, non-finite gradients, or an fp16 overflow at the minimum loss scale "
            "(overflows above it only lower the scale)", resume="free")

    def validate(self) -> None:
        """The run's length is given one way, and the schedule flags go together: the
        sample-based ones need ``--train-samples`` (as in Megatron-LM), a warm-up is given
        one way, and under a batch ramp the schedule is in samples."""
        if (self.train_iters is None) == (self.train_samples is None):
            raise FlagError("give exactly one of --train-iters and --train-samples")
        sample_flags = {"--lr-warmup-samples": self.lr_warmup_samples,
                        "--lr-decay-samples": self.lr_decay_samples,
                        "--lr-wsd-decay-samples": self.lr_wsd_decay_samples,
                        "--rampup-batch-size": self.rampup_batch_size}
        given = [name for name, value in sample_flags.items() if value]
        if self.train_iters is not None and given:
            raise FlagError(f"{', '.join(given)} count samples: use them with --train-samples, "
                            f"not --train-iters (as in Megatron-LM)")
        if self.lr_warmup_fraction is not None:
            if self.lr_warmup_iters or self.lr_warmup_samples:
                raise FlagError("give one of --lr-warmup-fraction, --lr-warmup-iters and "
                                "--lr-warmup-samples")
            if not 0 <= self.lr_warmup_fraction <= 1:
                raise FlagError(f"--lr-warmup-fraction {self.lr_warmup_fraction} is outside "
                                f"[0, 1]")
        if self.lr_warmup_iters and self.lr_warmup_samples:
            raise FlagError("give one of --lr-warmup-iters and --lr-warmup-samples")
        if self.lr_decay_iters is not None and self.lr_decay_samples is not None:
            raise FlagError("give one of --lr-decay-iters and --lr-decay-samples")
        if self.lr_wsd_decay_iters is not None and self.lr_wsd_decay_samples is not None:
            raise FlagError("give one of --lr-wsd-decay-iters and --lr-wsd-decay-samples")
        if self.rampup_batch_size:
            iteration_flags = [name for name, value in (
                ("--lr-warmup-iters", self.lr_warmup_iters),
                ("--lr-decay-iters", self.lr_decay_iters),
                ("--lr-wsd-decay-iters", self.lr_wsd_decay_iters)) if value]
            if iteration_flags:
                raise FlagError(f"{', '.join(iteration_flags)}: under --rampup-batch-size an "
                                f"iteration has no fixed size; give the schedule in samples "
                                f"(--lr-warmup-samples, --lr-decay-samples, "
                                f"--lr-warmup-fraction)")
        for name in ("input_table_lr_mult", "input_table_weight_decay"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise FlagError(f"{flag_name(name)} {value} is below 0")

    def input_table_flags(self) -> list[str]:
        """The input table's own optimizer flags given (not their declared defaults: the
        recipe's rate and decay)."""
        defaults = TrainingConfig()
        return [flag_name(name) for name in ("input_table_lr_mult", "input_table_weight_decay")
                if getattr(self, name) != getattr(defaults, name)]
