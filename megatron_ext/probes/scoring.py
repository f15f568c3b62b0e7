"""The probes of one layer's states under one probe seed's split and targets
(:mod:`.targets`), fitted with the estimators of :mod:`.fit` and scored: the id and
previous-token bits and classes, the linear read-out to the last layer, the unseen types,
the position transfer (:func:`fit_layer`), and the selectivity on held-out types
(:func:`held_out_types`, each bit's :func:`informedness`)."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from . import fit
from .targets import BIT_TASKS, CLASS_TASKS, SCORED, Split, Targets

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
