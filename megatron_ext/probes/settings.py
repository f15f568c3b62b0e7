"""The knobs of a probe run (tools/probe.py's flags, a study's ``[probes]`` section). Changing
any of them changes the results, so a study's cached probes are keyed by all of them (and by
the selectivity's estimator)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..runtime.errors import FlagError

# The selectivities each layer is read against the frequency-only baseline by.
SELECTIVITY = ("id_bits_selectivity", "prev_bits_selectivity")
# How they are estimated (megatron_ext.probes.run.held_out_types), recorded with every
# result: a study's cached probes made by another estimator are computed again.
ESTIMATOR = "held-out types, informedness, task minus control"


@dataclasses.dataclass(frozen=True)
class ProbeSettings:
    """``tokens`` held-out tokens (the first of ``data_path``, an indexed dataset, when
    given) are cut into windows of the models' sequence length; the hidden states of
    ``sample`` token positions drawn from them (seed ``seed``) are kept. Half of the
    documents train the probes, the other half score them, drawn anew (with the control
    pairing) for each of ``probe_seeds`` probe seeds: every number is their mean, with a
    95% interval over them. ``unigram_counts``: the training corpus's unigram counts that
    pair the control tasks (an indexed dataset prefix or a ``.npy``; None: counted from the
    models' training data). ``top_k``: classes of the token
    classifiers; ``ridge``: the ridge penalty, relative to the mean eigenvalue of the
    features' covariance (None: chosen per layer by cross-validation over the training
    documents); ``batch_size``: windows per forward pass; ``allow_train_text``: probe a
    held-out prefix that is also a training prefix of the recipe (refused otherwise, and
    reported when allowed)."""
    data_path: Optional[str] = None
    tokens: int = 16384
    sample: int = 8192
    top_k: int = 64
    ridge: Optional[float] = None
    seed: int = 0
    probe_seeds: int = 3
    unigram_counts: Optional[str] = None
    batch_size: int = 16
    allow_train_text: bool = False

    def check(self) -> None:
        for name in ("tokens", "sample", "top_k", "batch_size", "probe_seeds"):
            if getattr(self, name) < 1:
                raise FlagError(f"probes: {name} must be positive, got "
                                f"{getattr(self, name)}")
        if self.ridge is not None and not self.ridge > 0:
            raise FlagError(f"probes: ridge must be positive, got {self.ridge}")
