"""The knobs of a probe run (tools/probe.py's flags, a study's ``[probes]`` section):
:class:`ProbeSettings`. Changing any of them changes the results, so a study's cached probes are
keyed by all of them (and by the selectivity's estimator). :class:`ProbeRun` holds
tools/probe.py's other flags: the text read besides an indexed dataset, the windows, the device,
the output."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from ..config.flag_fields import FlagConfig, flag
from ..runtime.errors import FlagError

HELD_OUT_GROUP = "held-out text (one of)"

# The selectivities each layer is read against the frequency-only baseline by.
SELECTIVITY = ("id_bits_selectivity", "prev_bits_selectivity")
# How they are estimated (megatron_ext.probes.scoring.held_out_types), recorded with every
# result: a study's cached probes made by another estimator are computed again.
ESTIMATOR = "held-out types, informedness, task minus control"


@dataclasses.dataclass(frozen=True)
class ProbeSettings(FlagConfig):
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
    FLAG_GROUP = "probes"
    data_path: Optional[str] = flag(None, "indexed dataset prefix (PREFIX.bin/.idx)",
                                    group=HELD_OUT_GROUP)
    tokens: int = flag(16384, "held-out tokens read")
    sample: int = flag(8192, "token positions whose hidden states are kept; memory grows "
                             "with it")
    top_k: int = flag(64, "classes of the token classifiers")
    ridge: Optional[float] = flag(
        None, "a fixed ridge penalty relative to the mean feature variance (default: chosen "
              "per layer by cross-validation over the training documents)")
    seed: int = flag(0, "the sample, the probe seeds (split, control task) and the random "
                        "initialisations", least=0)
    probe_seeds: int = flag(
        3, "probe seeds: the split into training and scoring documents, the control pairing "
           "and the folds are drawn anew for each, and every number is their mean with a 95%% "
           "interval over them; the hidden states are collected once")
    unigram_counts: Optional[str] = flag(
        None, "the training corpus's unigram counts that pair the control tasks and feed the "
              "frequency-only baseline: an indexed dataset prefix (counted, cached beside it) "
              "or a .npy of counts per id (default: counted from the checkpoints' training "
              "data; needed for Hugging Face exports and --mock-data runs)", metavar="PATH")
    batch_size: int = flag(16, "windows per forward pass")
    allow_train_text: bool = flag(
        False, "probe a --data-path that a checkpoint trained on (refused otherwise; the "
               "report then says so)")

    def check(self) -> None:
        for name in ("tokens", "sample", "top_k", "batch_size", "probe_seeds"):
            if getattr(self, name) < 1:
                raise FlagError(f"probes: {name} must be positive, got "
                                f"{getattr(self, name)}")
        if self.ridge is not None and not self.ridge > 0:
            raise FlagError(f"probes: ridge must be positive, got {self.ridge}")


@dataclasses.dataclass(frozen=True)
class ProbeRun(FlagConfig):
    """tools/probe.py's flags besides the settings: a JSONL file of held-out text (``jsonl``,
    its text under ``json_key``), the window length (None: the models' shortest training
    sequence length), CKA across the models or not, the device and the output folder."""
    FLAG_GROUP = "probes"
    jsonl: Optional[str] = flag(None, "JSONL file (.gz/.zst too), one document per line",
                                group=HELD_OUT_GROUP)
    json_key: str = flag("text", "the JSONL text key", group=HELD_OUT_GROUP)
    seq_length: Optional[int] = flag(
        None, "window length (default: the shortest training sequence length of the models)")
    cka: bool = flag(True, "skip CKA across models (needed for models whose vocabularies or "
                           "tokenizers differ)")
    device: str = flag("cpu", "cpu or cuda")
    output: Path = flag(Path("probes"), "output folder", group="output")
