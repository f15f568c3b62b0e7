"""The training corpus's unigram frequencies: what the control tasks are paired by and what
the frequency-only baseline reads.

The counts of every token id in the indexed datasets a checkpoint trained on (its
``--data-path`` and ``--train-data-path`` prefixes, summed, weights dropped; a checkpoint's prefixes are
taken from the folder its run started in, and the relative ones of a checkpoint too old to
record it from the repository root, where the launchers start runs), counted by
``np.bincount`` over the memory-mapped ``.bin`` (:func:`megatron_ext.datasets.indexed.
unigram_counts`) and cached beside it (``PREFIX.unigram_counts.npz``, with the ``.bin``'s
size and modification time: a changed ``.bin`` is recounted; a folder that cannot be written
is counted again each time). ``unigram_counts`` (``--unigram-counts``) names them instead:
an indexed dataset prefix or a ``.npy`` of counts per id. A model that names no training
data (a Hugging Face export, a ``--mock-data`` run) needs it; unreadable training data is a
:class:`DataError` naming the path, never a silent fallback to the sample's own counts
(which pair a frequency-only representation's control task badly: +0.21 to +0.25 of id
selectivity).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from ..datasets.indexed import IndexCheckError, read_index, unigram_counts
from ..runtime.errors import DataError, FlagError
from ..runtime.files import file_fingerprint, publish, temporary_name

BINS = 16  # frequency classes the baseline's one-hot features distinguish


@dataclasses.dataclass(frozen=True)
class Unigrams:
    """``counts[id]``: occurrences of each token id in the training corpus; ``source``: where
    they were counted (for the report)."""
    counts: np.ndarray
    source: str

    def of(self, ids: np.ndarray) -> np.ndarray:
        """The counts of ``ids`` (0 for an id beyond the counted ones)."""
        padded = np.pad(self.counts, (0, max(0, int(ids.max()) + 1 - len(self.counts))))
        return padded[ids]


def training_unigrams(models: Sequence, explicit: Optional[str]) -> Unigrams:
    """The unigram counts of the models' training data (the union of their prefixes), or of
    ``explicit``."""
    if explicit:
        return Unigrams(counts_of(explicit), f"--unigram-counts {explicit}")
    from ..launch.slurm import REPO
    prefixes = []
    for info in models:
        if not info.trained_on:
            raise FlagError(f"model {info.name} names no training data (a Hugging Face "
                            f"export or a --mock-data run): the control tasks are paired by "
                            f"the training corpus's unigram frequencies; give them with "
                            f"--unigram-counts (a study: unigram_counts in [probes])")
        prefixes += [str(REPO / p) for p in info.trained_on if str(REPO / p) not in prefixes]
    counts = [counts_of(p) for p in prefixes]
    total = np.zeros(max(len(c) for c in counts), dtype=np.int64)
    for c in counts:
        total[:len(c)] += c
    return Unigrams(total, "the training data " + ", ".join(prefixes))


def counts_of(path: str) -> np.ndarray:
    """Counts per id: a ``.npy`` file's, or an indexed dataset prefix's (cached)."""
    if path.endswith(".npy"):
        try:
            return np.asarray(np.load(path), dtype=np.int64)
        except (OSError, ValueError) as e:
            raise DataError(f"unigram counts {path}: not readable ({e})") from e
    try:
        index = read_index(path)
    except IndexCheckError as e:
        raise DataError(f"training data {path} is not readable for its unigram counts: {e}; "
                        f"give them with --unigram-counts") from e
    cache = Path(f"{path}.unigram_counts.npz")
    fingerprint = np.asarray(file_fingerprint(f"{path}.bin"), dtype=np.int64)
    if cache.exists():
        with np.load(cache) as saved:
            if np.array_equal(saved["bin_fingerprint"], fingerprint):
                return saved["counts"]
    counts = unigram_counts(index)
    tmp = temporary_name(cache)
    try:
        with open(tmp, "wb") as f:
            np.savez(f, counts=counts, bin_fingerprint=fingerprint)
        publish(tmp, cache)
    except OSError:  # a read-only data folder: counted again next time
        if os.path.exists(tmp):
            os.remove(tmp)
    return counts


def features(unigrams: Unigrams, current: np.ndarray, previous: np.ndarray) -> torch.Tensor:
    """The frequency-only representation of each sampled position (``[n, 2 (BINS + 1)]``,
    fp64): for the current and the previous token, the standardised log count and a one-hot
    of its frequency class (:data:`BINS` classes of equal size over the sample's log counts),
    so that a linear probe reads any step function of the two frequencies."""
    blocks = []
    for ids in (current, previous):
        log = np.log1p(unigrams.of(ids).astype(float))
        edges = np.quantile(log, np.linspace(0, 1, BINS + 1)[1:-1])
        bins = np.digitize(log, edges)
        blocks += [((log - log.mean()) / max(log.std(), 1e-12))[:, None],
                   np.eye(BINS)[bins]]
    return torch.from_numpy(np.concatenate(blocks, axis=1))
