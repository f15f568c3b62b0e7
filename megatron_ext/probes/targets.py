"""What the probes are fitted to under one probe seed (:class:`Draw`): the split of the
sample by document and its cross-validation folds (:class:`Split`), and the labels
(:class:`Targets`): the current and previous ids' bits, their ``top_k`` classes, and the
calibrated control tasks, whose labels are swapped between types of about the same training
frequency (:func:`control_types`), with the halves of the types that the held-out-type
selectivity reads (:func:`type_halves`). :mod:`.scoring` fits and scores the probes on
them; :mod:`.run` draws them for every probe seed."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Optional, Sequence

import numpy as np
import torch

from ..codes.schemes import bits_of
from .collect import Sample
from .frequency import Unigrams

BIT_TASKS = ("id_bits", "id_bits_control", "prev_bits", "prev_bits_control")
CLASS_TASKS = ("id_topk", "prev_topk")
CONTROL_BIN = 2     # types of about the same frequency whose labels a control task permutes
CV_FOLDS = 3        # folds of training documents that choose the ridge penalty
SCORED = ("id_bits", "id_topk", "prev_bits", "prev_topk")  # compared with the random init


def control_bins(types: np.ndarray, counts: np.ndarray, seed: int
                 ) -> tuple[np.ndarray, np.ndarray, np.random.Generator]:
    """The control tasks' bins: ``(order, bin of each place in it, the generator)``: the
    positions of ``types`` sorted by ``counts`` (their training-corpus counts; ties in random
    order), cut into consecutive bins of :data:`CONTROL_BIN` (the first bin longer by a random
    0 .. CONTROL_BIN - 1, so that the bins vary with ``seed``; a last bin of one joins the one
    before it). The generator, drawn from ``seed``, continues for the pairing."""
    rng = np.random.default_rng([seed, 1])
    order = np.lexsort((rng.random(len(types)), -counts))
    n = len(order)
    edges = [0, *range(CONTROL_BIN + int(rng.integers(CONTROL_BIN)), n, CONTROL_BIN), n]
    if len(edges) > 2 and edges[-1] - edges[-2] == 1:
        del edges[-2]
    starts, stops = np.asarray(edges[:-1]), np.asarray(edges[1:])
    return order, np.repeat(np.arange(len(starts)), stops - starts), rng


def control_types(types: np.ndarray, counts: np.ndarray, seed: int) -> np.ndarray:
    """Each type's control type: within each bin of :func:`control_bins` every type takes
    the next one's place in a random cycle (no type keeps its own label: that would leak the
    task into the control). Bins of 2 (swaps of neighbours in frequency) match frequencies
    best: on a random table over a Zipf vocabulary, bins of 32 make the control easier by
    0.02."""
    order, bin_of, rng = control_bins(types, counts, seed)
    n = len(order)
    starts = np.flatnonzero(np.r_[True, bin_of[1:] != bin_of[:-1]])
    stops = np.r_[starts[1:], n]
    cycle = order[np.lexsort((rng.random(n), bin_of))]   # each bin's types in random order
    following = np.arange(1, n + 1)
    following[stops - 1] = starts                        # the last of a bin: its first
    out = np.empty_like(types)
    out[cycle] = types[cycle[following]]
    return out


def type_halves(types: np.ndarray, counts: np.ndarray, seed: int) -> np.ndarray:
    """Which half of the types each of ``types`` is in (bool), for the held-out-type
    selectivity: whole bins of :func:`control_bins` (a type with its control partners, so
    that each half's control labels are its own task labels relabelled), of every two
    consecutive bins one in each half at random (the halves alike in frequency). A
    function of the counts and ``seed`` only, never of a representation."""
    order, bin_of, _ = control_bins(types, counts, seed)
    out = np.empty(len(types), dtype=bool)
    if len(order):
        flip = np.random.default_rng([seed, 4]).random(bin_of[-1] // 2 + 1) < 0.5
        out[order] = (bin_of % 2 == 1) ^ flip[bin_of // 2]
    return out


class Split:
    """One probe seed's split of the sample, by document: the rows of half of the documents
    (drawn with ``seed``) train, the others score (as boolean tensors; ``train_rows``
    numpy), and the cross-validation folds (whole training documents) that choose the ridge
    penalty; ``document_folds``: every row's fold, all documents in :data:`CV_FOLDS` folds
    (for the held-out-type fits, which read every document)."""

    def __init__(self, sample: Sample, seed: int):
        names = np.unique(sample.document)
        rng = np.random.default_rng([seed, 3])
        train = np.isin(sample.document, rng.permutation(names)[: len(names) // 2])
        self.train_rows = train
        self.train, self.score = torch.from_numpy(train), torch.from_numpy(~train)
        self.early_train = torch.from_numpy(train & sample.early)
        self.late_score = torch.from_numpy(~train & ~sample.early)
        self.following = torch.from_numpy(sample.following)
        docs = np.unique(sample.document[train])
        fold_of = dict(zip(np.random.default_rng([seed, 2]).permutation(docs).tolist(),
                           itertools.cycle(range(min(CV_FOLDS, len(docs))))))
        self.folds = np.array([fold_of[d] for d in sample.document[train].tolist()])
        fold_of = dict(zip(np.random.default_rng([seed, 5]).permutation(names).tolist(),
                           itertools.cycle(range(min(CV_FOLDS, len(names))))))
        self.document_folds = np.array([fold_of[d] for d in sample.document.tolist()])


class Targets:
    """The labels of the sampled tokens under one probe seed's ``split``: ``matrix`` [n,
    columns] (±1 bits, one-hot classes), each task's ``columns`` slice, the training
    majority of every column (``majority``), the bits that vary in the training rows
    (``varying``) and the classes. The control pairing orders the types by ``unigrams``
    (the training corpus's counts), drawn with ``seed``; ``halves``: the rows whose current
    and previous tokens are both of the first half of the types, and those whose are both
    of the second (:func:`type_halves`, from the same counts and ``seed``)."""

    def __init__(self, sample: Sample, split: Split, unigrams: Unigrams, top_k: int,
                 bits: int, seed: int):
        train = split.train_rows
        types = np.unique(np.concatenate([sample.current, sample.previous]))
        shuffled = control_types(types, unigrams.of(types), seed)
        control = lambda ids: shuffled[np.searchsorted(types, ids)]  # noqa: E731
        second = type_halves(types, unigrams.of(types), seed)
        current, previous = (second[np.searchsorted(types, ids)]
                             for ids in (sample.current, sample.previous))
        self.halves = [~current & ~previous, current & previous]
        self.tokens = {"id_bits": sample.current, "prev_bits": sample.previous}
        ids = {"id_bits": sample.current, "id_bits_control": control(sample.current),
               "prev_bits": sample.previous, "prev_bits_control": control(sample.previous)}
        self.classes, self.top = {}, {}
        for task, tokens in (("id_topk", sample.current), ("prev_topk", sample.previous)):
            kinds, kind_counts = np.unique(tokens[train], return_counts=True)
            top = kinds[np.argsort(-kind_counts, kind="stable")[:top_k]]
            self.top[task] = top
            by_id = np.argsort(top)
            place = by_id[np.minimum(np.searchsorted(top[by_id], tokens), len(top) - 1)]
            self.classes[task] = np.where(top[place] == tokens, place, len(top))
        blocks = {task: 2.0 * bits_of(torch.from_numpy(v), bits).double() - 1
                  for task, v in ids.items()}
        for task in CLASS_TASKS:
            blocks[task] = torch.nn.functional.one_hot(torch.from_numpy(self.classes[task]),
                                                       len(self.top[task]) + 1).double()
        self.columns, start = {}, 0
        for task, block in blocks.items():
            self.columns[task] = slice(start, start + block.shape[1])
            start += block.shape[1]
        self.matrix = torch.cat(list(blocks.values()), dim=1)
        rows = torch.from_numpy(train)
        self.majority = self.matrix[rows].mean(0)
        self.varying = {task: (self.matrix[rows, self.columns[task]].std(0) > 0)
                        for task in BIT_TASKS}
        self.unseen = {task: torch.from_numpy(~train & ~np.isin(v, v[train]))
                       for task, v in self.tokens.items()}

    def score(self, task: str, predicted: torch.Tensor, rows: torch.Tensor
              ) -> Optional[float]:
        """Accuracy of ``predicted`` (all columns, for ``rows``) on ``task``."""
        if not bool(rows.any()):
            return None
        if task in BIT_TASKS:
            correct = self._bits_correct(task, predicted, rows)
            return None if correct is None else float(correct.mean())
        truth, guess = self.matrix[rows, self.columns[task]], predicted[:, self.columns[task]]
        k = len(self.top[task])
        inside = torch.from_numpy(self.classes[task])[rows] < k
        if not bool(inside.any()):
            return None
        return float((guess[inside, :k].argmax(-1) == truth[inside, :k].argmax(-1))
                     .double().mean())

    def corrected(self, task: str, predicted: torch.Tensor, rows: torch.Tensor
                  ) -> Optional[float]:
        """The chance-corrected bit accuracy: ``(acc - chance) / (1 - chance)`` per bit
        (chance: the training majority of the bit, scored on ``rows``), averaged over the
        bits whose chance is below 1."""
        correct = self._bits_correct(task, predicted, rows)
        base = self._bits_correct(task, self.guess(rows), rows)
        if correct is None:
            return None
        acc, chance = correct.mean(0), base.mean(0)
        room = chance < 1
        if not bool(room.any()):
            return None
        return float(((acc - chance)[room] / (1 - chance[room])).mean())

    def guess(self, rows: torch.Tensor) -> torch.Tensor:
        """The chance predictor: every column's training mean, for ``rows``."""
        return self.majority.expand(int(rows.sum()), -1)

    def chance(self, rows: torch.Tensor, tasks: Sequence[str] = BIT_TASKS + CLASS_TASKS
               ) -> dict:
        """Each task's accuracy when always guessing its most frequent training label."""
        return {task: self.score(task, self.guess(rows), rows) for task in tasks}

    def all_chances(self, split: Split) -> dict:
        """Every chance the report prints: on the scoring tokens, the unseen types and the
        late positions."""
        chance = self.chance(split.score)
        chance.update({f"{t}_unseen": self.chance(self.unseen[t], (t,))[t] for t in self.unseen})
        chance.update({f"{t}_position_transfer": c for t, c in
                       self.chance(split.late_score, SCORED).items()})
        return chance

    def _bits_correct(self, task: str, predicted: torch.Tensor, rows: torch.Tensor
                      ) -> Optional[torch.Tensor]:
        varying = self.varying[task]
        if not bool(varying.any()) or not bool(rows.any()):
            return None
        truth, guess = self.matrix[rows, self.columns[task]], predicted[:, self.columns[task]]
        return ((guess > 0) == (truth > 0))[:, varying].double()


@dataclasses.dataclass
class Draw:
    """One probe seed: its seed, split and targets."""
    seed: int
    split: Split
    targets: Targets


def make_draws(sample: Sample, unigrams: Unigrams, top_k: int, bits: int,
               seeds: Sequence[int]) -> list[Draw]:
    """The split and the targets of each probe seed."""
    out = []
    for seed in seeds:
        split = Split(sample, seed)
        out.append(Draw(seed, split, Targets(sample, split, unigrams, top_k, bits, seed)))
    return out
