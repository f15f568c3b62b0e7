"""Every probe and control of one or more models on one token sample: :func:`run_probes`.

Per model and per layer (0 = the input to the first layer, ``l`` = after layer ``l``), each
probe fitted on the training documents' sampled tokens and scored on the other documents':

* **token identity**: ridge probes of the bits of the current token id (as many bits as
  the models' vocabulary needs; accuracy averaged over the bits that vary in the training
  rows) and a ``top_k``-way classifier over the most frequent current tokens (fitted with one
  more class, "any other token", and scored on the top-``k`` tokens); **context**: the same
  for the previous token;
* **prediction**: next-token loss and top-1 accuracy read out by the model's own final norm
  and head (the logit lens), and by a trained linear read-out (a ridge map from the layer's
  states to the last layer's, then the model's norm and head: a closed-form tuned lens);
* **similarity**: debiased linear CKA between every two models at each layer, on the same
  scoring tokens (those of the first probe seed), with its noise floor
  (:func:`fit.cka_floor`); refused for models whose token ids mean different text
  (:func:`models.difference`).

**Probe seeds**: the hidden states are collected once, on one sample of positions; then for
each of ``settings.probe_seeds`` probe seeds the split into training and scoring documents,
the control pairing and the cross-validation folds are drawn anew and every probe is fitted
and scored again. Each number of a row is the mean over the probe seeds, and
``over_probe_seeds`` holds its values and their 95% t interval: the variation of the probe's
own randomness given the model and the sample (not of training). The sample and the probe
seeds are drawn from ``settings.seed`` and ``run_key`` (:func:`draws`): a study passes each
run's training seed, so that runs of different seeds draw their own (and the between-seed
spread carries the probe's randomness) while the arms of one seed share them (paired).

The ridge penalty is chosen per layer and probe seed by cross-validation over the training
documents (:func:`fit.choose_penalty`, three folds of whole documents) unless
``settings.ridge`` fixes it; the chosen values are in every row.

Controls, computed with every score:

* a randomly initialised model of the same arm and shape (:func:`models.random_twin`,
  drawn from a checkpoint's training seed, else from the probes' seed);
* **calibrated control tasks** (after Hewitt & Liang 2019): each token type gets the id
  bits of the type next to it in the **training corpus's unigram frequency**
  (:mod:`.frequency`; the sample's types sorted by it and swapped in pairs,
  :func:`control_types`), so the control labels keep the task's frequency structure (BPE
  ids are ordered by frequency: the high bits of frequent tokens are skewed). Every bit
  accuracy stands next to its own chance (the training majority of each bit, scored);
* **selectivity on held-out types** (:func:`held_out_types`): the types are cut into two
  halves alike in frequency (:func:`type_halves`, whole control pairs), and each half's
  rows (current and previous token both of it) are scored by a probe fitted on the other
  half's, every document; ``selectivity`` is the task's informedness there (true-positive
  minus false-positive rate per bit, each type counted once: :func:`informedness`) minus
  the control task's. A representation that holds only the types of the tokens (a random
  vector each: all a probe can do is memorise them) gives the scored types predictions
  independent of their labels, so it reads 0 in expectation **on every text**, and one
  that only knows their frequency reads about the same on task and control. (The
  difference of chance-corrected accuracies ``(acc - chance) / (1 - chance)`` that stood
  here is 0 only on average over texts: on the one text a study's seeds share it is not,
  and its interval over seeds excluded 0 about twice as often as stated. It stays in the
  rows, ``*_corrected``.);
* **the frequency-only baseline** (``frequency_baseline``): the same probes on features
  that hold only the current and previous tokens' training frequencies
  (:func:`frequency.features`), scored exactly as a layer is; each layer's selectivity
  minus the baseline's, paired by probe seed, is in ``versus_frequency`` (a layer whose
  interval reaches 0 does not beat it);
* **unseen types**: the id and previous-token bits scored on the scoring tokens whose type
  no training row has (``*_unseen``, beside their own chance): a probe that memorises
  types is at chance there;
* **position transfer**: the probes fitted on positions < S/2, scored on positions >= S/2;
* **trivially satisfied rows** are marked (``trivial``): the id bits of a code that holds
  them linearly (carried up the residual stream at every layer), and any score of a trained
  model within two standard errors of its random initialisation's.

The ``top_k`` classifiers have no control task: every relabelling of their classes that keeps
one class per type is the same task. Layer 0 is the input itself, marked with what it is
(:func:`models.input_note`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from ..codes.schemes import bits_of
from ..datasets.held_out import tokens_sha256
from ..metrics.intervals import t_interval
from ..runtime.errors import DataError, FlagError

from . import fit, frequency
from .collect import Sample, draw_sample, hidden_states, memory_bound
from .frequency import Unigrams
from .models import ModelInfo, difference, id_bits_carried, input_note, random_twin
from .report import beats_baseline
from .settings import ESTIMATOR, SELECTIVITY, ProbeSettings

BIT_TASKS = ("id_bits", "id_bits_control", "prev_bits", "prev_bits_control")
CLASS_TASKS = ("id_topk", "prev_topk")
CONTROL_BIN = 2     # types of about the same frequency whose labels a control task permutes
CV_FOLDS = 3        # folds of training documents that choose the ridge penalty
SCORED = ("id_bits", "id_topk", "prev_bits", "prev_topk")  # compared with the random init


def num_bits(models: Sequence[ModelInfo]) -> int:
    """The id bits to probe: as many as the largest vocabulary (or code) needs."""
    return max(max((m.vocab_size - 1).bit_length(), (m.code or {}).get("num_bits", 0))
               for m in models)


def draws(settings: ProbeSettings, run_key: int = 0) -> tuple[int, list[int]]:
    """``(the sample's seed, the probe seeds)``, drawn from ``settings.seed`` and
    ``run_key``."""
    state = np.random.SeedSequence([settings.seed, run_key]).generate_state(
        settings.probe_seeds + 1)
    return int(state[0]), [int(s) for s in state[1:]]


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


def run_probes(models: Sequence[ModelInfo], windows: np.ndarray, documents: np.ndarray,
               settings: ProbeSettings, source: str, unigrams: Unigrams, device: str = "cpu",
               cka: bool = True, progress: Callable[[str], None] = print,
               run_key: int = 0) -> dict:
    """Probe ``models`` (loaded one at a time) on ``windows`` (``[n, S + 1]`` held-out ids,
    described by ``source``; ``documents``: each token's document), the control tasks paired
    by ``unigrams`` (the training corpus's, :func:`frequency.training_unigrams`), under the
    probe seeds of ``settings`` and ``run_key`` (:func:`draws`); the result that
    :mod:`.report` writes."""
    started = time.perf_counter()
    settings.check()
    _check(models, windows, cka)
    sample_seed, seeds = draws(settings, run_key)
    sample = draw_sample(windows, documents, settings.sample, sample_seed)
    bits = num_bits(models)
    probe = make_draws(sample, unigrams, settings.top_k, bits, seeds)
    first = probe[0].split
    result = {"settings": dataclasses.asdict(settings), "estimator": ESTIMATOR,
              "source": source,
              "tokens_sha256": tokens_sha256(windows), "run_key": run_key,
              "sample_seed": sample_seed, "probe_seeds": seeds, "unigrams": unigrams.source,
              "data": {"windows": int(windows.shape[0]), "seq_length": sample.seq_length,
                       "documents": int(len(np.unique(sample.document))),
                       "sampled": len(sample), "num_bits": bits,
                       "top_k": {t: len(probe[0].targets.top[t]) for t in CLASS_TASKS},
                       **_split_counts(sample, probe)},
              "chance": combine_values([d.targets.all_chances(d.split) for d in probe]),
              "models": {}, "cka": []}
    baseline_X = frequency.features(unigrams, sample.current, sample.previous)
    result["frequency_baseline"] = combine(
        [fit_layer(baseline_X, baseline_X, d.targets, d.split, settings.ridge)[0]
         for d in probe])
    kept = {}  # (name, init) -> [layers + 1, scored tokens, hidden] on the CPU, for CKA
    for info in models:
        trained = info.load()
        entry = {"info": info.to_json()}
        for init in ("trained", "random_init"):
            model = trained if init == "trained" else random_twin(
                trained, settings.seed if info.seed is None else info.seed)
            progress(f"[probes] {info.name} ({init.replace('_', ' ')}): hidden states of "
                     f"{len(sample):,} tokens x {info.num_layers + 1} layers, "
                     f"{len(probe)} probe seed(s)")
            states = hidden_states(model, windows, sample, settings.batch_size, device)
            entry[init] = []
            for layer in range(info.num_layers + 1):
                row = probe_layer(model, states, layer, probe, settings.ridge)
                versus_baseline(row, result["frequency_baseline"])
                entry[init].append({**row, "layer": layer})
            entry[init][0]["note"] = input_note(info.code, info.arm)
            if cka and len(models) > 1:
                kept[(info.name, init)] = states[:, first.score.to(device)].cpu()
            del states, model
        mark_trivial(entry, info, np.mean(result["data"]["score"]))
        result["models"][info.name] = entry
        del trained
    for a, b in itertools.combinations([m.name for m in models], 2) if kept else ():
        pair = {"a": a, "b": b}
        for init in ("trained", "random_init"):
            x, y = kept[(a, init)], kept[(b, init)]
            layers = range(min(len(x), len(y)))
            pair[init] = [fit.cka(x[i], y[i]) for i in layers]
            pair[f"{init}_floor"] = [fit.cka_floor(x[i], y[i], settings.seed) for i in layers]
        result["cka"].append(pair)
    result["memory"] = _memory(models, sample, int(first.score.sum()), bool(kept),
                               settings.batch_size)
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def make_draws(sample: Sample, unigrams: Unigrams, top_k: int, bits: int,
               seeds: Sequence[int]) -> list[Draw]:
    """The split and the targets of each probe seed."""
    out = []
    for seed in seeds:
        split = Split(sample, seed)
        out.append(Draw(seed, split, Targets(sample, split, unigrams, top_k, bits, seed)))
    return out


def _split_counts(sample: Sample, probe: Sequence[Draw]) -> dict:
    """The rows of each set, one number per probe seed."""
    return {"train_documents": [int(len(np.unique(sample.document[d.split.train_rows])))
                                for d in probe],
            **{key: [int(getattr(d.split, key).sum()) for d in probe]
               for key in ("train", "score", "early_train", "late_score")},
            "unseen": {t: [int(d.targets.unseen[t].sum()) for d in probe]
                       for t in ("id_bits", "prev_bits")},
            "bits_varying": {t: [int(d.targets.varying[t].sum()) for d in probe]
                             for t in BIT_TASKS}}


def combine_values(rows: Sequence[dict]) -> dict:
    """Each key's mean over the probe seeds' dicts (None where no seed has a value)."""
    out = {}
    for key in rows[0]:
        values = [r[key] for r in rows if r.get(key) is not None]
        out[key] = float(np.mean(values)) if values else None
    return out


def combine(rows: Sequence[dict]) -> dict:
    """One row of the probe seeds' rows: each number's mean over the seeds that have it, and
    in ``over_probe_seeds`` its values and their 95% t interval; ``ridge``: each seed's."""
    out = {"ridge": [r["ridge"] for r in rows]}
    spread = {}
    for key in rows[0]:
        if key in ("ridge", "layer"):
            continue
        values = [r[key] for r in rows if r.get(key) is not None]
        if not values:
            out[key] = None
            continue
        interval = t_interval(values)
        out[key] = interval["mean"]
        spread[key] = {"values": values, "low": interval["low"], "high": interval["high"],
                       "half_width": interval["half_width"]}
    out["over_probe_seeds"] = spread
    return out


def versus_baseline(row: dict, baseline: dict) -> None:
    """``row["versus_frequency"]``: each selectivity minus the frequency-only baseline's,
    paired by probe seed (:func:`beats_baseline`)."""
    out = {}
    for key in SELECTIVITY:
        mine = row["over_probe_seeds"].get(key, {}).get("values")
        theirs = baseline["over_probe_seeds"].get(key, {}).get("values")
        if not mine or not theirs or len(mine) != len(theirs):
            continue
        out[key] = beats_baseline([a - b for a, b in zip(mine, theirs)])
    row["versus_frequency"] = out


def probe_layer(model, states, layer, probe: Sequence[Draw], penalty: Optional[float]) -> dict:
    """Every probe of one layer's states (``states[layer]``) under each probe seed
    (:func:`fit_layer`, then the next-token read-outs through the model's own norm and
    head), combined (:func:`combine`)."""
    device = states.device
    target = probe[0].split.following.to(device)
    lens_loss, lens_hit = fit.next_token(model, states[layer], target)
    rows = []
    for d in probe:
        row, readout = fit_layer(states[layer], states[-1], d.targets, d.split, penalty)
        score = d.split.score
        row["lens_loss"], row["lens_acc"] = (float(lens_loss[score].mean()),
                                             float(lens_hit[score].mean()))
        loss, hit = fit.next_token(model, readout.to(device), target[score.to(device)])
        row["readout_loss"], row["readout_acc"] = float(loss.mean()), float(hit.mean())
        rows.append(row)
    return combine(rows)


def fit_layer(X: torch.Tensor, last: torch.Tensor, targets: Targets, split: Split,
              penalty: Optional[float]) -> tuple[dict, torch.Tensor]:
    """The token-identity probes of states ``X`` (``[sample, hidden]``) and the linear
    read-out to ``last`` (the last layer's states): ``(row, read-out of the scoring rows)``.
    ``penalty`` None: chosen by cross-validation over the training documents (each
    held-out-type fit of the selectivity chooses its own, :func:`held_out_types`)."""
    device = X.device
    on = lambda rows: rows.to(device)  # noqa: E731
    labels = targets.matrix.to(device)
    width = labels.shape[1]
    train, score = split.train, split.score
    fixed = penalty
    if penalty is None:
        penalty = (fit.choose_penalty(X[on(train)], labels[on(train)], split.folds)
                   if len(np.unique(split.folds)) > 1 else fit.PENALTIES[1])
    fitted = fit.ridge(X[on(train)], torch.cat([labels[on(train)], last[on(train)].double()],
                                                1), penalty)
    main = fitted(X[on(score)]).cpu()
    unseen = {t: fitted(X[on(rows)])[:, :width].cpu() for t, rows in targets.unseen.items()}
    shifted = fit.ridge(X[on(split.early_train)], labels[on(split.early_train)],
                        penalty)(X[on(split.late_score)]).cpu()
    row = {"layer": None, "ridge": penalty}
    held = held_out_types(X, targets, split, fixed)
    for task in BIT_TASKS + CLASS_TASKS:
        row[task] = targets.score(task, main[:, :width], score)
    for task in ("id_bits", "prev_bits"):
        corrected = [targets.corrected(t, main[:, :width], score)
                     for t in (task, f"{task}_control")]
        row[f"{task}_corrected"], row[f"{task}_control_corrected"] = corrected
        row[f"{task}_held_out"], row[f"{task}_control_held_out"] = held[task]
        row[f"{task}_selectivity"] = None if None in held[task] else (held[task][0]
                                                                      - held[task][1])
        row[f"{task}_unseen"] = targets.score(task, unseen[task], targets.unseen[task])
    for task in SCORED:
        row[f"{task}_position_transfer"] = targets.score(task, shifted, split.late_score)
    return row, main[:, width:].float()


def held_out_types(X: torch.Tensor, targets: Targets, split: Split,
                   penalty: Optional[float]) -> dict:
    """The id and previous-token bits, and their control tasks', read on token types the
    probe never trained on: ``{task: (task, control)}`` informedness (:func:`informedness`),
    each the mean over the two halves of the types (:func:`type_halves`) of a ridge probe
    fitted on the rows whose current and previous tokens are both of the other half (every
    document; ``penalty`` None: chosen by cross-validation over those rows' documents) and
    scored on the rows whose two tokens are both of this half. A representation that holds
    only the types of the current and previous tokens (whatever it memorised of them) gives
    the scored rows predictions independent of their labels, so each reads 0 in
    expectation on any text (a half of the types for one token only would leave the other
    token's memorised types to carry the text's co-occurrences across); the control tasks
    relabel within each half by training frequency, so one that only knows frequency reads
    about the same on both."""
    device = X.device
    parts = [targets.columns[t] for t in BIT_TASKS]     # the matrix's first columns
    labels = targets.matrix[:, :parts[-1].stop]
    read: dict = {"id_bits": [], "prev_bits": []}
    for scored, train in (targets.halves, targets.halves[::-1]):
        folds = split.document_folds[train]
        if not train.any() or not scored.any():
            continue
        rows, held = torch.from_numpy(train), torch.from_numpy(scored)
        chosen = penalty if penalty is not None else (
            fit.choose_penalty(X[rows.to(device)], labels[rows].to(device), folds)
            if len(np.unique(folds)) > 1 else fit.PENALTIES[1])
        guess = fit.ridge(X[rows.to(device)], labels[rows].to(device), chosen)(
            X[held.to(device)]).cpu()
        varying = labels[rows].std(0) > 0
        for task, pair in zip(read, (parts[:2], parts[2:])):
            values = [informedness(guess[:, p], labels[held, p], targets.tokens[task][scored],
                                   varying[p]) for p in pair]
            if None not in values:
                read[task].append(values)
    return {task: tuple(float(x) for x in np.mean(pairs, axis=0)) if pairs else (None, None)
            for task, pairs in read.items()}


def informedness(predicted: torch.Tensor, labels: torch.Tensor, tokens: np.ndarray,
                 columns: torch.Tensor) -> Optional[float]:
    """Bit predictions (``predicted`` > 0) against ``labels`` (±1), ``[rows, bits]``: the
    true-positive minus the false-positive rate of each bit (2 x balanced accuracy - 1),
    each token type (``tokens``) counted once by its share of rows predicted 1, averaged
    over the ``columns`` (bool) whose label both values take among the types. 0 in
    expectation for predictions independent of the labels however skewed a bit is, 1 for
    perfect ones; None where no column qualifies."""
    kinds, inverse = np.unique(tokens, return_inverse=True)
    index = torch.from_numpy(inverse)
    count = torch.bincount(index, minlength=len(kinds)).double()[:, None]

    def by_type(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(kinds), values.shape[1], dtype=torch.float64).index_add_(
            0, index, values.double()) / count

    share, positive = by_type(predicted > 0), by_type(labels > 0) > 0.5
    ones = positive.sum(0)
    used = columns & (ones > 0) & (ones < len(kinds))
    if not bool(used.any()):
        return None
    hit = (share * positive).sum(0) / ones.clamp_min(1)
    false = (share * ~positive).sum(0) / (len(kinds) - ones).clamp_min(1)
    return float((hit - false)[used].mean())


def mark_trivial(entry: dict, info: ModelInfo, scored: float) -> None:
    """Mark in each trained row (``row["trivial"]``: {task: why}) the scores that say
    nothing about training: id bits that the code holds linearly, and scores within two
    standard errors (binomial, on the ``scored`` tokens of a probe seed) of the random
    initialisation's."""
    carried = id_bits_carried(info.code)
    for row, twin in zip(entry["trained"], entry["random_init"]):
        marks = {}
        for task in SCORED:
            a, b = row[task], twin[task]
            if a is None or b is None:
                continue
            error = math.sqrt(max(a * (1 - a) + b * (1 - b), 1e-12) / scored)
            if abs(a - b) <= 2 * error:
                marks[task] = "= random init"
        if carried:
            marks["id_bits"] = "code carried up"
        if marks:
            row["trivial"] = marks


def _check(models: Sequence[ModelInfo], windows: np.ndarray, cka: bool) -> None:
    seq_length, largest = windows.shape[1] - 1, int(windows.max())
    for info in models:
        if largest >= info.vocab_size:
            raise DataError(f"the held-out tokens hold id {largest}, outside model "
                            f"{info.name}'s vocabulary of {info.vocab_size:,}: not its data")
        if seq_length > info.context:
            raise FlagError(f"windows of {seq_length} tokens exceed model {info.name}'s "
                            f"context of {info.context}: lower --seq-length")
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise FlagError(f"model names must differ, got {names}: name them NAME=PATH")
    for a, b in itertools.combinations(models, 2) if cka else ():
        why = difference(a, b)
        if why:
            raise FlagError(f"cannot compare {a.name} and {b.name} by CKA (the same "
                            f"token ids must mean the same text to both): {why}; probe them "
                            f"in separate runs, or pass --no-cka")


def _memory(models: Sequence[ModelInfo], sample: Sample, scored: int, cka: bool,
            batch_size: int) -> dict:
    """The bound :func:`hidden_states` keeps to (bytes), and its statement."""
    bounds = {m.name: memory_bound(len(sample), m.num_layers, m.hidden_size, m.intermediate,
                                   m.heads, batch_size, sample.seq_length) for m in models}
    biggest = max(bounds, key=bounds.get)
    mib = lambda b: b / 2 ** 20  # noqa: E731
    text = (f"Memory for hidden states: {len(sample):,} sampled tokens x (layers + 1) x hidden "
            f"fp32 for the model being probed, plus one layer's activations for one batch of "
            f"{batch_size} windows: at most {mib(bounds[biggest]):,.1f} MiB ({biggest})")
    cka_bytes = sum(2 * scored * (m.num_layers + 1) * m.hidden_size * 4 for m in models)
    if cka:
        text += (f", plus the {scored:,} scoring tokens of every model for CKA "
                 f"({mib(cka_bytes):,.1f} MiB)")
    return {"bound_bytes": bounds[biggest] + (cka_bytes if cka else 0), "text": text}
