"""The run's one garbage-collection policy (``--manual-gc``, Megatron-LM's flags): Python's
collector pauses each rank at its own moment, so it is turned off for the loop and run at
known points instead: once before the first step, every ``--manual-gc-interval`` iterations,
around each validation (unless ``--no-manual-gc-eval``); on again when the loop ends."""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

from ..config.run_config import TrainingConfig


class GarbageCollection:
    """``--manual-gc``'s policy; without the flag every method does nothing."""

    def __init__(self, config: TrainingConfig):
        self.manual, self.interval = config.manual_gc, config.manual_gc_interval
        self.around_eval = config.manual_gc and config.manual_gc_eval

    def start(self) -> None:
        if self.manual:
            gc.disable()
            gc.collect()

    def after_step(self, iteration: int) -> None:
        if self.manual and self.interval and iteration % self.interval == 0:
            gc.collect()

    @contextlib.contextmanager
    def around_validation(self) -> Iterator[None]:
        if self.around_eval:
            gc.collect()
        yield
        if self.around_eval:
            gc.collect()

    def close(self) -> None:
        if self.manual:
            gc.enable()
