"""Megatron-LM's ``--check-for-spiky-loss`` without its rerun state machine: a step's loss is
a spike when it is at least ``--spiky-loss-factor`` (Megatron-LM's ``SPIKY_LOSS_FACTOR``,
10) times the largest of the first ``--spiky-loss-samples`` (100) finite losses, as
megatron.core's ``RerunStateMachine.is_unexpectedly_large`` estimates it. Megatron-LM reruns
the step to tell a hardware fault from the data; here a spike is logged and, with
``--spiky-loss-action``, its update skipped (``skip``), or skipped and the run saved and
stopped (``stop``). The estimate starts again after a resume."""

from __future__ import annotations

import math
from typing import Optional


class SpikeDetector:
    """Flags a step loss far above the largest of the first ones (on the last pipeline
    stage, which has the loss; the step agrees on the outcome over all ranks)."""

    def __init__(self, factor: float, samples: int):
        self.factor, self.samples = factor, samples
        self.seen, self.largest = 0, 0.0
        self.last: Optional[str] = None  # why the last spike was one

    def log_line(self, iteration: int, action: str) -> str:
        what = self.last or "spiky loss (seen on the last pipeline stage)"
        done = {"log": "update applied", "skip": "update skipped",
                "stop": "update skipped; saving and stopping"}[action]
        return f"[fixedcode] iteration {iteration}: {what}: {done} (--spiky-loss-action {action})"

    def check(self, loss: Optional[float]) -> Optional[str]:
        """Why ``loss`` is a spike, or None (also while the first losses are gathered)."""
        if loss is None or not math.isfinite(loss):  # non-finite steps are checked apart
            return None
        if self.seen < self.samples:
            self.seen += 1
            self.largest = max(self.largest, abs(loss))
            return None
        if abs(loss) >= self.largest * self.factor:
            self.last = (f"spiky loss {loss:.4E}: at least {self.factor:g} x "
                         f"{self.largest:.4E}, the largest of the first {self.samples} steps")
            return self.last
        return None
