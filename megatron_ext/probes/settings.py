"""The knobs of a probe run (tools/probe.py's flags, a study's ``[probes]`` section). Changing
any of them changes the results, so a study's cached probes are keyed by all of them."""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class ProbeSettings:
    """``tokens`` held-out tokens (the first of ``data_path``, an indexed dataset, when
    given) are cut into windows of the models' sequence length; the hidden states of
    ``sample`` token positions drawn from them (seed ``seed``) are kept. Half of the windows
    train the probes, the other half score them. ``top_k``: classes of the token classifiers;
    ``ridge``: the ridge penalty, relative to the mean eigenvalue of the features' covariance;
    ``batch_size``: windows per forward pass."""
    data_path: Optional[str] = None
    tokens: int = 16384
    sample: int = 8192
    top_k: int = 64
    ridge: float = 1e-3
    seed: int = 0
    batch_size: int = 16

    def check(self) -> None:
        for name in ("tokens", "sample", "top_k", "batch_size"):
            if getattr(self, name) < 1:
                raise SystemExit(f"error: probes: {name} must be positive, got "
                                 f"{getattr(self, name)}")
        if not self.ridge > 0:
            raise SystemExit(f"error: probes: ridge must be positive, got {self.ridge}")
