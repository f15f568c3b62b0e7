"""Validation during training: when (:meth:`Validator.should_validate`) and how
(:func:`validation_loss`), the policy object of the loop beside
:class:`~megatron_ext.checkpoint.saving.Checkpointer` and
:class:`~megatron_ext.train.exit_conditions.ExitConditions`.

The loop asks ``validator.should_validate(iteration)`` after each step: every
``--eval-interval`` iterations and at the last one, when there is a validation set. An exit
signal stops a validation after its current batch; the train state then records it as
pending (``validation_pending``, saved in the checkpoint) and the resumed run validates
first. When training reaches ``--train-iters``, after the final save, the test split is
evaluated once (:meth:`Validator.test`), as Megatron-LM does; a signal then ends it with
nothing pending.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Callable, ContextManager, Optional

import torch
from megatron.core.pipeline_parallel import get_forward_backward_func

from ..checkpoint.layout import TrainState
from ..config.run_config import LoggingConfig
from ..datasets.gpt_datasets import build_loader
from ..metrics.logger import MetricsLogger
from ..runtime.log import log
from ..runtime.reductions import reduce_losses
from .exit_conditions import ExitConditions
from .gc_policy import GarbageCollection


@dataclasses.dataclass(frozen=True)
class Batches:
    """How an evaluation reads its dataset: ``--eval-iters`` global batches of
    ``num_microbatches`` micro-batches of ``micro_batch_size`` sequences of ``seq_length``
    tokens per data-parallel rank, through ``num_workers`` loader workers."""
    global_batches: int
    num_microbatches: int
    micro_batch_size: int
    seq_length: int
    num_workers: int


def validation_loss(batches: Batches, forward_step, valid_dataset, ddp,
                    exits: ExitConditions) -> tuple[Optional[float], Optional[str]]:
    """``(mean validation loss over the first --eval-iters global batches, None)``, or
    ``(None, reason)`` when an exit signal stopped it after a batch."""
    ddp.eval()
    loader = iter(build_loader(valid_dataset, batches.micro_batch_size, batches.num_workers, 0))
    totals, reason = [], None
    with torch.no_grad():
        for batch in range(batches.global_batches):
            losses = get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=loader, model=[ddp],
                num_microbatches=batches.num_microbatches, seq_length=batches.seq_length,
                micro_batch_size=batches.micro_batch_size, forward_only=True)
            totals.extend(losses)
            if batch == 0:  # test hook: hold the validation open (a window for a signal)
                time.sleep(float(os.environ.get("FIXEDCODE_TEST_VALIDATION_SECONDS", "0")))
            reason = exits.signalled()
            if reason:
                break
    ddp.train()
    return (None, reason) if reason else (reduce_losses(totals), None)


class Validator:
    """Validates the model on ``valid_dataset`` (None: never) every ``--eval-interval``
    iterations and at the last of ``train_iters``, and evaluates it on ``test_dataset``
    (None: never) at the end; :attr:`last_loss` is the mean loss of the latest validation,
    :attr:`test_loss` the test's (None before any, when stopped, and on ranks other than the
    last pipeline stage). ``collector``: the run's garbage-collection policy, applied around
    each. ``gathered``: a context in which the model holds whole, current parameters
    (``--overlap-param-gather``)."""

    def __init__(self, config: LoggingConfig, batches: Batches, train_iters: int,
                 forward_step: Callable, valid_dataset, test_dataset, ddp, exits: ExitConditions,
                 metrics: MetricsLogger, collector: GarbageCollection,
                 gathered: Callable[[], ContextManager] = contextlib.nullcontext):
        """``config``: ``--eval-interval``; ``batches``: what each evaluation reads."""
        self.config, self.batches, self.train_iters = config, batches, train_iters
        self.gathered = gathered
        self.forward_step, self.ddp = forward_step, ddp
        self.valid_dataset, self.test_dataset = valid_dataset, test_dataset
        self.exits, self.metrics, self.collector = exits, metrics, collector
        self.last_loss: Optional[float] = None
        self.test_loss: Optional[float] = None

    def _loss(self, dataset) -> tuple[Optional[float], Optional[str]]:
        with self.gathered(), self.collector.around_validation():
            return validation_loss(self.batches, self.forward_step, dataset, self.ddp,
                                   self.exits)

    def should_validate(self, iteration: int) -> bool:
        return self.valid_dataset is not None and (
            iteration % self.config.eval_interval == 0 or iteration == self.train_iters)

    def validate(self, state: TrainState) -> Optional[str]:
        """Validate at ``state.iteration`` and log the loss; the exit reason if a signal
        stopped it (``state.validation_pending`` then says so). Without a validation set,
        nothing is pending."""
        if self.valid_dataset is None:
            state.validation_pending = False
            return None
        loss, reason = self._loss(self.valid_dataset)
        self.last_loss = loss
        state.validation_pending = bool(reason)
        if reason:
            log(f"[fixedcode] {reason}: validation at iteration {state.iteration} stopped; "
                f"the resumed run validates first")
        else:
            self.metrics.validation(state.iteration, loss,
                                    periodic=state.iteration % self.config.eval_interval == 0,
                                    final=state.iteration == self.train_iters)
        return reason

    def test(self, state: TrainState) -> Optional[str]:
        """Evaluate the test split at the end of training (``--train-iters`` reached) and log
        the loss; the exit reason if a signal stopped it (nothing is pending then: the
        checkpoint is saved)."""
        if self.test_dataset is None or state.iteration < self.train_iters:
            return None
        self.test_loss, reason = self._loss(self.test_dataset)
        if reason:
            log(f"[fixedcode] {reason}: the test evaluation at iteration {state.iteration} "
                f"stopped")
        else:
            self.metrics.test(state.iteration, self.test_loss)
        return reason
