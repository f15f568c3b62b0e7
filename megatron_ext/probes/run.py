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
  :func:`.targets.control_types`), so the control labels keep the task's frequency structure (BPE
  ids are ordered by frequency: the high bits of frequent tokens are skewed). Every bit
  accuracy stands next to its own chance (the training majority of each bit, scored);
* **selectivity on held-out types** (:func:`.scoring.held_out_types`): the types are cut into two
  halves alike in frequency (:func:`.targets.type_halves`, whole control pairs), and each half's
  rows (current and previous token both of it) are scored by a probe fitted on the other
  half's, every document; ``selectivity`` is the task's informedness there (true-positive
  minus false-positive rate per bit, each type counted once: :func:`.scoring.informedness`) minus
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

from ..datasets.held_out import tokens_sha256
from ..metrics.intervals import t_interval
from ..runtime.errors import DataError, FlagError

from . import fit, frequency
from .collect import Sample, draw_sample, hidden_states, memory_bound
from .frequency import Unigrams
from .models import ModelInfo, difference, id_bits_carried, input_note, random_twin
from .report import beats_baseline
from .scoring import fit_layer
from .settings import ESTIMATOR, SELECTIVITY, ProbeSettings
from .targets import BIT_TASKS, CLASS_TASKS, SCORED, Draw, make_draws


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
    (:func:`.scoring.fit_layer`, then the next-token read-outs through the model's own norm and
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
