"""Values derived once at start-up from the run's config, the world and the tokenizer, never
written into the config: :class:`Derived` (built by :func:`derive`): the world layout, the
batch, the number of iterations and the padded vocabulary. Frozen and passed explicitly;
checkpoints and trackers store the run's config with them (:func:`run_record`), as
Megatron-LM's saved arguments hold them. Its place: between ``run_config.py`` (the flags) and
``train/`` (the loop).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..runtime.errors import FlagError
from .model_config import padded_vocab_size
from .run_config import RunConfig
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


def derive(config: RunConfig, world: int, vocab_size: int,
           tokenizer_sha256: Optional[str] = None) -> Derived:
    """The values of a job of ``world`` ranks whose tokenizer has ``vocab_size`` tokens
    (padded as Megatron-LM pads it) and files of ``tokenizer_sha256``; a clear error where the
    batch flags do not fit the world (the flags' own checks are ``RunConfig.validate``'s)."""
    training, parallel = config.training, config.parallel
    data_parallel = world // parallel.model_parallel_size
    global_batch = training.global_batch_size
    if global_batch is None:
        global_batch = training.micro_batch_size * data_parallel
    per_step = training.micro_batch_size * data_parallel
    if global_batch % per_step:
        raise FlagError(f"--global-batch-size {global_batch} is not a multiple "
                        f"of --micro-batch-size {training.micro_batch_size} x data-parallel "
                        f"size {data_parallel}")
    rampup = training.rampup_batch_size
    ramp = BatchRamp(global_batch, per_step, rampup and list(rampup))  # checks the ramp
    train_iters = training.train_iters
    if train_iters is None:
        train_iters = (ramped_train_iters(ramp, training.train_samples) if rampup
                       else train_iters_of_samples(training.train_samples, global_batch))
        if not train_iters:
            raise FlagError(f"--train-samples {training.train_samples} is not one batch of "
                            f"--global-batch-size {global_batch}")
    return Derived(world_size=world, data_parallel_size=data_parallel,
                   global_batch_size=global_batch, num_microbatches=global_batch // per_step,
                   train_iters=train_iters, padded_vocab_size=padded_vocab_size(
                       vocab_size, config.model.make_vocab_size_divisible_by,
                       parallel.tensor_model_parallel_size), rampup_batch_size=rampup,
                   tokenizer_sha256=tokenizer_sha256)


def run_record(config: RunConfig, derived: Derived) -> dict:
    """The run's arguments as a checkpoint and a tracker store them: every flag (as the run
    applies them), with the derived values under the flags' names (``train_iters``,
    ``global_batch_size``, ...)."""
    return {**config.record(), **dataclasses.asdict(derived)}
