"""Every probe and control of one or more models on one token sample: :func:`run_probes`.

Per model and per layer (0 = the input to the first layer, ``l`` = after layer ``l``), each
probe fitted on the training windows' sampled tokens and scored on the other windows':

* **token identity**: ridge probes of the 16 bits of the current token id (mean accuracy
  over the bits that vary in the sample) and a ``top_k``-way classifier over the most
  frequent current tokens (fitted with one more class, "any other token", and scored on the
  top-``k`` tokens); **context**: the same for the previous token;
* **prediction**: next-token loss and top-1 accuracy read out by the model's own final norm
  and head (the logit lens), and by a trained linear read-out (a ridge map from the layer's
  states to the last layer's, then the model's norm and head: a closed-form tuned lens);
* **similarity**: linear CKA between every two models at each layer, on the same scoring
  tokens; refused for models whose token ids mean different text (:func:`models.difference`).

Controls, computed with every score: the same probes on a randomly initialised model of the
same arm and shape (:func:`models.random_twin`, drawn from a checkpoint's training seed,
else from the probes' seed); control tasks (Hewitt & Liang 2019): each
token type gets the 16 bits of another type's id (a fixed random permutation of the types
in the sample), and ``selectivity`` = bit accuracy - control accuracy; position transfer:
the probes fitted on positions < S/2 and scored on positions >= S/2. The ``top_k``
classifiers have no control task: every relabelling of their classes that keeps one class
per type is the same task. Chance levels (the training majority, scored) are reported too.
Layer 0 is the input itself, marked: for binary and gf2 it is the code, trivially decodable.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from megatron_ext.codes import bits_of

from . import fit
from .collect import Sample, draw_sample, hidden_states
from .models import ModelInfo, difference, random_twin
from .settings import ProbeSettings

NUM_BITS = 16
INPUT_NOTE = {"learned": "the input table: a lookup of the id",
              "binary": "the code itself: trivially decodable",
              "gf2": "the code itself: trivially decodable"}
BIT_TASKS = ("id_bits", "id_bits_control", "prev_bits", "prev_bits_control")
CLASS_TASKS = ("id_topk", "prev_topk")


class Targets:
    """The labels of the sampled tokens: ``matrix`` [n, columns] (±1 bits, one-hot classes),
    each task's ``columns`` slice, the bits that vary (``varying``) and the classes."""

    def __init__(self, sample: Sample, top_k: int, seed: int):
        types = np.unique(np.concatenate([sample.current, sample.previous]))
        shuffled = np.random.default_rng([seed, 1]).permutation(types)
        control = lambda ids: shuffled[np.searchsorted(types, ids)]  # noqa: E731
        bits = {"id_bits": sample.current, "id_bits_control": control(sample.current),
                "prev_bits": sample.previous, "prev_bits_control": control(sample.previous)}
        self.classes, self.top = {}, {}
        for task, ids in (("id_topk", sample.current), ("prev_topk", sample.previous)):
            kinds, counts = np.unique(ids[sample.train], return_counts=True)
            top = kinds[np.argsort(-counts, kind="stable")[:top_k]]
            lookup = dict(zip(top.tolist(), range(len(top))))
            self.top[task] = top
            self.classes[task] = np.array([lookup.get(int(t), len(top)) for t in ids])
        blocks = {task: 2.0 * bits_of(torch.from_numpy(ids), NUM_BITS).double() - 1
                  for task, ids in bits.items()}
        for task in CLASS_TASKS:
            blocks[task] = torch.nn.functional.one_hot(torch.from_numpy(self.classes[task]),
                                                       len(self.top[task]) + 1).double()
        self.columns, start = {}, 0
        for task, block in blocks.items():
            self.columns[task] = slice(start, start + block.shape[1])
            start += block.shape[1]
        self.matrix = torch.cat(list(blocks.values()), dim=1)
        train = torch.from_numpy(sample.train)
        self.varying = {task: (self.matrix[train, self.columns[task]].std(0) > 0)
                        for task in BIT_TASKS}

    def score(self, task: str, predicted: torch.Tensor, rows: torch.Tensor) -> Optional[float]:
        """Accuracy of ``predicted`` (all columns, for ``rows``) on ``task``."""
        truth, guess = self.matrix[rows, self.columns[task]], predicted[:, self.columns[task]]
        if task in BIT_TASKS:
            varying = self.varying[task]
            if not bool(varying.any()):
                return None
            return float(((guess > 0) == (truth > 0))[:, varying].double().mean())
        k = len(self.top[task])
        inside = torch.from_numpy(self.classes[task])[rows] < k
        if not bool(inside.any()):
            return None
        return float((guess[inside, :k].argmax(-1) == truth[inside, :k].argmax(-1))
                     .double().mean())

    def chance(self, train: torch.Tensor, rows: torch.Tensor) -> dict:
        """Each task's accuracy when always guessing its most frequent training label."""
        guess = self.matrix[train].mean(0).expand(int(rows.sum()), -1)
        return {task: self.score(task, guess, rows) for task in BIT_TASKS + CLASS_TASKS}


def run_probes(models: Sequence[ModelInfo], windows: np.ndarray, settings: ProbeSettings,
               source: str, device: str = "cpu", cka: bool = True,
               progress: Callable[[str], None] = print) -> dict:
    """Probe ``models`` (loaded one at a time) on ``windows`` (``[n, S + 1]`` held-out ids,
    described by ``source``); the result that :mod:`.report` writes."""
    started = time.perf_counter()
    settings.check()
    _check(models, windows, cka)
    sample = draw_sample(windows, settings.sample, settings.seed)
    targets = Targets(sample, settings.top_k, settings.seed)
    train, score = torch.from_numpy(sample.train), torch.from_numpy(~sample.train)
    early_train = torch.from_numpy(sample.train & sample.early)
    late_score = torch.from_numpy(~sample.train & ~sample.early)
    following = torch.from_numpy(sample.following)
    chance = targets.chance(train, score)
    result = {"settings": dataclasses.asdict(settings), "source": source,
              "data": {"windows": int(windows.shape[0]), "seq_length": sample.seq_length,
                       "sampled": len(sample), "train": int(train.sum()),
                       "score": int(score.sum()), "early_train": int(early_train.sum()),
                       "late_score": int(late_score.sum()),
                       "bits_varying": {t: int(v.sum()) for t, v in targets.varying.items()},
                       "top_k": {t: len(targets.top[t]) for t in CLASS_TASKS}},
              "chance": chance, "models": {}, "cka": []}
    kept = {}  # (name, init) -> [layers + 1, scored tokens, hidden] on the CPU, for CKA
    for info in models:
        trained = info.load()
        entry = {"info": info.to_json()}
        for init in ("trained", "random_init"):
            model = trained if init == "trained" else random_twin(
                trained, settings.seed if info.seed is None else info.seed)
            progress(f"[probes] {info.name} ({init.replace('_', ' ')}): hidden states of "
                     f"{len(sample):,} tokens x {info.num_layers + 1} layers")
            states = hidden_states(model, windows, sample, settings.batch_size, device)
            entry[init] = [_probe_layer(model, states, layer, targets, settings.ridge, train,
                                        score, early_train, late_score, following, info.arm)
                           for layer in range(info.num_layers + 1)]
            if cka and len(models) > 1:
                kept[(info.name, init)] = states[:, score.to(device)].cpu()
            del states, model
        result["models"][info.name] = entry
        del trained
    for a, b in itertools.combinations([m.name for m in models], 2) if kept else ():
        pair = {"a": a, "b": b}
        for init in ("trained", "random_init"):
            x, y = kept[(a, init)], kept[(b, init)]
            pair[init] = [fit.linear_cka(x[i], y[i]) for i in range(min(len(x), len(y)))]
        result["cka"].append(pair)
    result["memory"] = _memory(models, sample, int(score.sum()), bool(kept))
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def _check(models: Sequence[ModelInfo], windows: np.ndarray, cka: bool) -> None:
    seq_length, largest = windows.shape[1] - 1, int(windows.max())
    for info in models:
        if largest >= info.vocab_size:
            raise SystemExit(f"error: the held-out tokens hold id {largest}, outside model "
                             f"{info.name}'s vocabulary of {info.vocab_size:,}: not its data")
        if seq_length > info.context:
            raise SystemExit(f"error: windows of {seq_length} tokens exceed model {info.name}'s "
                             f"context of {info.context}: lower --seq-length")
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise SystemExit(f"error: model names must differ, got {names}: name them NAME=PATH")
    for a, b in itertools.combinations(models, 2) if cka else ():
        why = difference(a, b)
        if why:
            raise SystemExit(f"error: cannot compare {a.name} and {b.name} by CKA (the same "
                             f"token ids must mean the same text to both): {why}; probe them "
                             f"in separate runs, or pass --no-cka")


def _probe_layer(model, states, layer, targets: Targets, penalty, train, score, early_train,
                 late_score, following, arm) -> dict:
    device = states.device
    X, last = states[layer], states[-1]
    on = lambda rows: rows.to(device)  # noqa: E731
    labels = targets.matrix.to(device)
    width = labels.shape[1]
    main = fit.ridge(X[on(train)], torch.cat([labels[on(train)], last[on(train)].double()], 1),
                     penalty)(X[on(score)])
    shifted = fit.ridge(X[on(early_train)], labels[on(early_train)], penalty)(X[on(late_score)])
    row = {"layer": layer}
    if layer == 0:
        row["note"] = INPUT_NOTE[arm]
    for task in BIT_TASKS + CLASS_TASKS:
        row[task] = targets.score(task, main[:, :width].cpu(), score)
    for task in ("id_bits", "prev_bits"):
        task_acc, control_acc = row[task], row[f"{task}_control"]
        row[f"{task}_selectivity"] = None if task_acc is None or control_acc is None \
            else task_acc - control_acc
    for task in ("id_bits", "id_topk", "prev_bits", "prev_topk"):
        row[f"{task}_position_transfer"] = targets.score(task, shifted.cpu(), late_score)
    target = following[score].to(device)
    row["lens_loss"], row["lens_acc"] = fit.next_token(model, X[on(score)], target)
    row["readout_loss"], row["readout_acc"] = fit.next_token(model, main[:, width:].float(),
                                                             target)
    return row


def _memory(models: Sequence[ModelInfo], sample: Sample, scored: int, cka: bool) -> str:
    mib = lambda rows, m: rows * (m.num_layers + 1) * m.hidden_size * 4 / 2 ** 20  # noqa: E731
    biggest = max(models, key=lambda m: (m.num_layers + 1) * m.hidden_size)
    text = (f"Hidden states kept: {len(sample):,} sampled tokens x (layers + 1) x hidden fp32 "
            f"for the model being probed (at most {mib(len(sample), biggest):,.1f} MiB)")
    if cka:
        text += (f", plus the {scored:,} scoring tokens of every model for CKA "
                 f"({sum(2 * mib(scored, m) for m in models):,.1f} MiB)")
    return text
