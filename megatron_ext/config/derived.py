"""Values settled once at start-up, never written into the parsed flags (``args`` stays the
command line):

* :class:`Derived` (built by :func:`derive`): values derived from the flags, the world and
  the tokenizer: the world layout, the batch, the number of iterations and the padded
  vocabulary;
* :class:`Resolved` (built by ``train.setup.check_flags`` and
  ``checkpoint.resume.resolve_checkpoint``): flags whose value this machine or the checkpoint
  settles: ``--device auto``, the default ``--transformer-impl``, ``--sequence-parallel`` at
  TP=1, the learning-rate schedule a resumed run keeps
  (``--use-checkpoint-opt_param-scheduler``), and whether ``--finetune``, ``--no-load-optim``
  and ``--no-load-rng`` apply (to ``--load``'s checkpoint, not the run's own saves).

Both are frozen and passed explicitly. What reads the flags as the run applies them (the
model provider, the loop's parts) gets :meth:`Resolved.applied_to`, a copy; checkpoints and
trackers store the applied flags with the derived values (:func:`run_record`), as
Megatron-LM's saved arguments hold them. Its place: between ``arguments.py`` (the flags) and
``train/`` (the loop).
"""

from __future__ import annotations

import argparse
import dataclasses

from typing import Optional

from ..runtime.errors import FlagError
from .arguments import padded_vocab_size
from .schedule import BatchRamp, ramped_train_iters, train_iters_of_samples


@dataclasses.dataclass(frozen=True)
class Derived:
    world_size: int
    data_parallel_size: int
    global_batch_size: int  # --global-batch-size, else micro-batch x data-parallel size
    num_microbatches: int  # per step and data-parallel rank, at the full global batch
    train_iters: int  # --train-iters, else --train-samples over the global batch (or ramp)
    padded_vocab_size: int
    rampup_batch_size: Optional[tuple] = None  # --rampup-batch-size, as given
    tokenizer_sha256: Optional[str] = None  # the tokenizer files' (tokenizer.tokenizer_digest)

    def batch_ramp(self) -> BatchRamp:
        """Each update's global batch size (constant without ``--rampup-batch-size``)."""
        return BatchRamp(self.global_batch_size,
                         self.global_batch_size // self.num_microbatches,
                         self.rampup_batch_size and list(self.rampup_batch_size))

    @property
    def train_samples(self) -> int:
        """The samples the ``train_iters`` updates consume."""
        if self.rampup_batch_size is None:
            return self.train_iters * self.global_batch_size
        ramp, consumed = self.batch_ramp(), 0
        for _ in range(self.train_iters):
            consumed += ramp.batch_size(consumed)
        return consumed


@dataclasses.dataclass(frozen=True)
class Resolved:
    device: str  # --device: "cuda" or "cpu" ("auto" settled)
    transformer_impl: str  # --transformer-impl: its default settled for the device
    sequence_parallel: bool  # --sequence-parallel: off at TP=1
    schedule: dict  # the learning-rate schedule flags (checkpointing.SCHEDULE_FLAGS): the
    # flags', or the checkpoint's with --use-checkpoint-opt_param-scheduler
    # --finetune, --no-load-optim, --no-load-rng: they apply to the checkpoint of --load, not
    # when the run resumes its own --save (a requeued fine-tuning continues)
    finetune: bool = False
    no_load_optim: bool = False
    no_load_rng: bool = False

    def applied_to(self, args: argparse.Namespace) -> argparse.Namespace:
        """A copy of ``args`` with the resolved values under the flags' names: the flags as
        the run applies them. ``args`` itself is left as parsed."""
        return argparse.Namespace(**{
            **vars(args), "device": self.device, "transformer_impl": self.transformer_impl,
            "sequence_parallel": self.sequence_parallel, **self.schedule,
            "finetune": self.finetune, "no_load_optim": self.no_load_optim,
            "no_load_rng": self.no_load_rng})


def derive(args: argparse.Namespace, world: int, vocab_size: int,
           tokenizer_sha256: Optional[str] = None) -> Derived:
    """The values of a job of ``world`` ranks whose tokenizer has ``vocab_size`` tokens
    (padded as Megatron-LM pads it) and files of ``tokenizer_sha256``; a clear error where the
    batch flags do not fit the world (the flags' own checks are ``RunConfig.validate``'s)."""
    data_parallel = world // (args.tensor_model_parallel_size * args.pipeline_model_parallel_size)
    global_batch = args.global_batch_size
    if global_batch is None:
        global_batch = args.micro_batch_size * data_parallel
    per_step = args.micro_batch_size * data_parallel
    if global_batch % per_step:
        raise FlagError(f"--global-batch-size {global_batch} is not a multiple "
                        f"of --micro-batch-size {args.micro_batch_size} x data-parallel size "
                        f"{data_parallel}")
    rampup = tuple(args.rampup_batch_size) if args.rampup_batch_size else None
    ramp = BatchRamp(global_batch, per_step, rampup and list(rampup))  # checks the ramp
    train_iters = args.train_iters
    if train_iters is None:
        train_iters = (ramped_train_iters(ramp, args.train_samples) if rampup
                       else train_iters_of_samples(args.train_samples, global_batch))
        if not train_iters:
            raise FlagError(f"--train-samples {args.train_samples} is not one batch of "
                            f"--global-batch-size {global_batch}")
    return Derived(world_size=world, data_parallel_size=data_parallel,
                   global_batch_size=global_batch, num_microbatches=global_batch // per_step,
                   train_iters=train_iters, padded_vocab_size=padded_vocab_size(
                       vocab_size, args.make_vocab_size_divisible_by,
                       args.tensor_model_parallel_size), rampup_batch_size=rampup,
                   tokenizer_sha256=tokenizer_sha256)


def run_record(args: argparse.Namespace, derived: Derived) -> dict:
    """The run's arguments as a checkpoint and a tracker store them: every flag (as applied,
    :meth:`Resolved.applied_to`), with the derived values under the flags' names
    (``train_iters``, ``global_batch_size``, ...)."""
    return {**vars(args), **dataclasses.asdict(derived)}
