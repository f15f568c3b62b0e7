"""The calibration of the probes' controls (:mod:`megatron_ext.probes`): the by-seed interval
of the id and previous-token selectivity of models that share one held-out text, with no
signal (types as random vectors; ids random, or ordered by frequency as BPE's roughly are)
and with a known one, each scored by the probes' own fitting; and the frequency-only
baseline's mark where ids are in exact frequency order. The one part of the suite that
needs torch: it imports it, and the probes, inside its functions."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..stats import t_interval
from .trials import covers, detects


def zipf_text(rng, vocab: int, windows: int, width: int, block: int = 32,
              id_space: Optional[int] = None):
    """Held-out windows of a Zipf law over ``vocab`` types, two windows per document, and
    the law's own counts as the training corpus's. ``(windows, documents, Unigrams)``. The
    types' ids are ordered by frequency only roughly, as BPE's are (the frequency ranks
    shuffled within blocks of ``block`` ids: the high bits follow frequency, the low bits do
    not); with ``id_space``, they are random distinct ids below it instead (ids that say
    nothing of frequency)."""
    from ...probes.frequency import Unigrams
    if id_space is None:
        rank = rng.permuted(np.arange(vocab).reshape(-1, block), axis=1).ravel()
    else:
        rank = np.full(id_space, np.inf)
        rank[rng.choice(id_space, vocab, replace=False)] = np.arange(vocab)
    p = 1 / (rank + 1.0)
    p /= p.sum()
    tokens = rng.choice(len(p), size=(windows, width + 1), p=p)
    documents = np.broadcast_to(np.arange(windows)[:, None] // 2, tokens.shape)
    return tokens, documents, Unigrams(np.round(p * 1e9).astype(np.int64), "the Zipf law")


# The probes' scenario: a held-out text of 24 windows of 64 tokens (12 documents) over 384
# Zipf-distributed types, 768 sampled positions, states of width 64.
PROBE_TYPES, PROBE_BITS, PROBE_WIDTH = 384, 11, 64


def probe_text(rng, random_ids: bool):
    """The probes' scenario's held-out text (:func:`zipf_text`), its ids random or ordered
    by frequency."""
    return zipf_text(rng, PROBE_TYPES, 24, 64, id_space=1 << PROBE_BITS if random_ids else None)


def probed_selectivity(rng, text, signal: float, probe_seeds: int) -> np.ndarray:
    """One training seed's ``[id, previous-token]`` selectivity: a fresh model whose states
    hold only a random vector per token type in noise (no information beyond the current
    token's type: what the probe can only memorise) and, with ``signal`` > 0, beside it the
    current and the previous ids' bits scaled by ``signal`` in unit noise; its own sample
    of positions, and the mean over ``probe_seeds`` probe seeds (split, control pairing,
    halves of the types), each scored by the probes' own
    :func:`~megatron_ext.probes.scoring.fit_layer` (ridge fixed at 0.01, K = 8), as a study's
    run is."""
    import torch
    from ...codes.schemes import bits_of
    from ...probes.collect import draw_sample
    from ...probes.scoring import fit_layer
    from ...probes.targets import make_draws
    windows, documents, unigrams = text
    sample = draw_sample(windows, documents, 768, int(rng.integers(1 << 31)))
    table = rng.standard_normal((len(unigrams.counts), PROBE_WIDTH))
    X = torch.from_numpy(table[sample.current]
                         + 0.5 * rng.standard_normal((len(sample), PROBE_WIDTH)))
    if signal:
        X = torch.cat([X] + [signal * (2 * bits_of(torch.from_numpy(ids), PROBE_BITS).double()
                                       - 1)
                             + torch.from_numpy(rng.standard_normal((len(ids), PROBE_BITS)))
                             for ids in (sample.current, sample.previous)], 1)
    draws = make_draws(sample, unigrams, 8, PROBE_BITS,
                       [int(x) for x in rng.integers(1 << 31, size=probe_seeds)])
    rows = [fit_layer(X, X, d.targets, d.split, 0.01)[0] for d in draws]
    return np.array([[r[f"{task}_selectivity"] for task in ("id_bits", "prev_bits")]
                     for r in rows]).mean(0)


def probe_selectivity(rng, trials: int, seeds: int, probe_seeds: int, signal: float,
                      random_ids: bool) -> dict:
    """Each trial trains ``seeds`` models (:func:`probed_selectivity`: each its own sample and
    probe seeds) that share one held-out text, as a study's runs do, and takes the t
    interval over the seeds of their probe-seed means, as the study's probe table does;
    the ids random or ordered by frequency as BPE's roughly are (:func:`zipf_text`). With no
    signal, a fresh text each trial: the share of trials whose interval excludes 0 (every
    text must read 0, not just their average). With a known signal, one text: coverage of
    the expected selectivity on it, from ``trials / 5`` (40 to 400) independent models of
    one probe seed each (at 400 its Monte Carlo error is about 1/40 of the interval's half
    width)."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # tiny solves: threads only add overhead
    try:
        text = probe_text(rng, random_ids)
        truth = np.zeros(2)
        if signal:
            big = np.random.default_rng(12345)
            truth = np.mean([probed_selectivity(big, text, signal, 1)
                             for _ in range(max(40, min(400, trials // 5)))], axis=0)
        hits = np.zeros(2)
        for _ in range(trials):
            if not signal:
                text = probe_text(rng, random_ids)
            values = np.array([probed_selectivity(rng, text, signal, probe_seeds)
                               for _ in range(seeds)])
            hits += [covers(t_interval(values[:, i]), truth[i]) for i in range(2)]
    finally:
        torch.set_num_threads(threads)
    names = ("id selectivity by seed", "previous-token selectivity by seed")
    if signal:
        return {name: rate for name, rate in zip(names, hits / trials)}
    return {name: ("fp", 1 - rate) for name, rate in zip(names, hits / trials)}


# -------------------------------------------------------------------- the frequency mark

def frequency_states(rng, sample, unigrams):
    """States that hold only the current and the previous tokens' training frequencies, in
    another form than the baseline's features: smooth functions (z, z², tanh z, sin z) of
    each one's standardised log count in noise (sd 0.1), beside a random vector per token
    type in noise (what a probe can memorise)."""
    import torch
    table = rng.standard_normal((len(unigrams.counts), PROBE_WIDTH))
    columns = []
    for ids in (sample.current, sample.previous):
        log = np.log1p(unigrams.of(ids).astype(float))
        z = (log - log.mean()) / log.std()
        columns += [z, z * z, np.tanh(z), np.sin(z)]
    smooth = np.stack(columns, 1)
    return torch.from_numpy(np.concatenate(
        [table[sample.current] + 0.5 * rng.standard_normal((len(sample), PROBE_WIDTH)),
         smooth + 0.1 * rng.standard_normal(smooth.shape)], 1))


def against_frequency(rng, text, states: str, probe_seeds: int) -> np.ndarray:
    """One training seed's ``[[id, previous-token] selectivity of its states, the same of
    the frequency-only baseline]``: its own sample and probe seeds, the states and the
    baseline's features (:func:`megatron_ext.probes.frequency.features`) scored on the same
    draws, as a study's run and its baseline row are, by
    :func:`~megatron_ext.probes.scoring.held_out_types` (the selectivity ``fit_layer`` reports;
    ridge fixed at 0.01, K = 8), each the mean over the probe seeds. ``states``:
    ``"frequency"`` (:func:`frequency_states`), ``"baseline"`` (the baseline's features
    themselves) or ``"code"`` (a random vector per type and the current and previous ids'
    bits in unit noise, scaled 2: a known signal)."""
    import torch
    from ...codes.schemes import bits_of
    from ...probes.collect import draw_sample
    from ...probes.frequency import features
    from ...probes.scoring import held_out_types
    from ...probes.targets import make_draws
    windows, documents, unigrams = text
    sample = draw_sample(windows, documents, 768, int(rng.integers(1 << 31)))
    baseline = features(unigrams, sample.current, sample.previous)
    if states == "frequency":
        X = frequency_states(rng, sample, unigrams)
    elif states == "baseline":
        X = baseline
    else:
        table = rng.standard_normal((len(unigrams.counts), PROBE_WIDTH))
        X = torch.cat([torch.from_numpy(table[sample.current])]
                      + [2.0 * (2 * bits_of(torch.from_numpy(ids), PROBE_BITS).double() - 1)
                         + torch.from_numpy(rng.standard_normal((len(ids), PROBE_BITS)))
                         for ids in (sample.current, sample.previous)], 1)
    draws = make_draws(sample, unigrams, 8, PROBE_BITS,
                       [int(x) for x in rng.integers(1 << 31, size=probe_seeds)])
    out = np.zeros((2, 2))
    for row, Z in enumerate((X, baseline)):
        for d in draws:
            held = held_out_types(Z, d.targets, d.split, 0.01)
            out[row] += [held[t][0] - held[t][1] for t in ("id_bits", "prev_bits")]
    return out / len(draws)


def exact_order_text(rng):
    """The probes' scenario's held-out text with ids in exact frequency order (id = the
    type's frequency rank): the id is then a function of the frequency."""
    return zipf_text(rng, PROBE_TYPES, 24, 64, block=1)


def frequency_mark(rng, trials: int, seeds: int, probe_seeds: int) -> dict:
    """Ids in exact frequency order, states holding only the tokens' frequencies
    (:func:`frequency_states`), a fresh text each trial shared by ``seeds`` models (each its
    own sample and probe seeds). There a frequency-only representation holds the id bits,
    so no estimator can read its selectivity as 0 while reading a code's: the share of
    trials whose by-seed interval excludes 0 is reported, not asserted. What is asserted:
    the share that excludes 0 *and* is not marked ‡ (the per-seed differences from the
    frequency-only baseline's selectivity, paired by seed, have an interval above 0,
    :func:`megatron_ext.probes.report.beats_baseline`) is at most the nominal 5%: read
    with its mark, no frequency-only cell claims more than a false positive's share."""
    import torch
    from ...probes.report import beats_baseline
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # tiny solves: threads only add overhead
    excluded, unmarked = np.zeros(2), np.zeros(2)
    try:
        for _ in range(trials):
            text = exact_order_text(rng)
            values = np.array([against_frequency(rng, text, "frequency", probe_seeds)
                               for _ in range(seeds)])       # [seeds, states/baseline, task]
            for task in range(2):
                cell = t_interval(values[:, 0, task])
                if detects(cell):
                    excluded[task] += 1
                    unmarked[task] += beats_baseline(values[:, 0, task] - values[:, 1, task])[
                        "beats"]
    finally:
        torch.set_num_threads(threads)
    names = ("id selectivity by seed", "previous-token selectivity by seed")
    out = {f"{name}: excludes 0": ("share", n / trials) for name, n in zip(names, excluded)}
    out.update({f"{name}: excludes 0, not marked ‡": ("fp_at_most", n / trials)
                for name, n in zip(names, unmarked)})
    return out
