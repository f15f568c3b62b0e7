"""The probes' controls on synthetic data (megatron_ext/probes: collect, frequency, run): no
sampled position's window crosses a document boundary; probe seeds redraw the split and the
control pairing, and every number carries its interval over them; the training corpus's
unigram counts (counted from the indexed dataset, cached, refused when unreadable or
missing) pair the control tasks, so a frequency-only representation reads no id selectivity
(it reads clearly positive under the old pairing by the sample's own counts); the
frequency-only baseline marks a layer that does not beat it."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch
from scipy import stats
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from megatron_ext.probes import frequency
from megatron_ext.probes.collect import draw_sample
from megatron_ext.probes.frequency import Unigrams
from megatron_ext.probes.models import ModelInfo
from megatron_ext.probes.run import combine, draws, versus_baseline
from megatron_ext.probes.scoring import fit_layer
from megatron_ext.probes.settings import ProbeSettings
from megatron_ext.probes.targets import make_draws
from megatron_ext.runtime.errors import DataError, FlagError
from megatron_ext.study.calibration.probes import zipf_text


def test_a_position_whose_window_crosses_into_another_document_is_never_drawn():
    """Two short documents: the first window holds the end of document 0 and the start of
    document 1; positions of document 1 in it (their context holds document 0's tokens) are
    never sampled, those in the next window (which starts inside document 1) are."""
    stream_docs = np.repeat([0, 1], [5, 20])           # document 0: 5 tokens, then 20
    windows = np.arange(17).reshape(1, -1) + np.array([[0], [8]])   # 2 windows of 16 (+1)
    documents = stream_docs[windows]
    sample = draw_sample(windows, documents, 10_000, seed=0)   # every candidate
    assert set(zip(sample.window.tolist(), sample.position.tolist())) == (
        {(0, p) for p in range(1, 5)} | {(1, p) for p in range(1, 16)})
    assert np.all(documents[sample.window, 0] == sample.document)
    with pytest.raises(DataError, match="1 document at positions whose window lies inside"):
        draw_sample(windows[:1, :5], documents[:1, :5], 100, seed=0)


def zipf_world(vocab: int = 8192, windows: int = 64, width: int = 64, seed: int = 0):
    """Windows of a Zipf law over ids that follow frequency roughly (as BPE's do), two
    windows per document, and the law's own counts as the training corpus's."""
    return zipf_text(np.random.default_rng(seed), vocab, windows, width)


def sample_counts(sample) -> Unigrams:
    """The old pairing's counts: the types' own counts in the sample."""
    ids, counts = np.unique(np.concatenate([sample.current, sample.previous]),
                            return_counts=True)
    out = np.zeros(ids.max() + 1, dtype=np.int64)
    out[ids] = counts
    return Unigrams(out, "the sample")


def test_a_frequency_only_representation_has_no_id_selectivity_under_corpus_pairing():
    """Features holding only the tokens' training frequencies: the control tasks paired by
    the training corpus's frequency leave it no id selectivity (its interval over 4 probe
    seeds covers 0, and the mean is within 0.01); paired by the types' counts in the sample
    (the old pairing) the same features read clearly positive."""
    tokens, documents, corpus = zipf_world()
    sample = draw_sample(tokens, documents, 2048, seed=0)
    X = frequency.features(corpus, sample.current, sample.previous)
    seeds = draws(ProbeSettings(probe_seeds=4))[1]
    read = {}
    for name, unigrams in (("corpus", corpus), ("sample", sample_counts(sample))):
        rows = [fit_layer(X, X, d.targets, d.split, 0.01)[0]
                for d in make_draws(sample, unigrams, 16, 13, seeds)]
        read[name] = combine(rows)
    new = read["corpus"]
    spread = new["over_probe_seeds"]["id_bits_selectivity"]
    assert abs(new["id_bits_selectivity"]) <= 0.01
    assert spread["low"] <= 0 <= spread["high"], spread
    assert read["sample"]["id_bits_selectivity"] > 0.04, read["sample"]["id_bits_selectivity"]


def test_probe_seeds_redraw_the_split_and_rows_carry_intervals_over_them():
    tokens, documents, corpus = zipf_world(windows=32)
    settings = ProbeSettings(probe_seeds=3)
    sample_seed, seeds = draws(settings)
    assert len(set(seeds)) == 3 and draws(settings) == (sample_seed, seeds)
    other_sample, other = draws(settings, run_key=1)       # another training seed's draws
    assert other_sample != sample_seed and not set(other) & set(seeds)
    sample = draw_sample(tokens, documents, 1024, sample_seed)
    probe = make_draws(sample, corpus, 16, 13, seeds)
    splits = {tuple(d.split.train_rows) for d in probe}
    assert len(splits) == 3                                 # the documents split anew
    for d in probe:          # half of the documents train, whole documents on each side
        train_docs = set(sample.document[d.split.train_rows].tolist())
        assert len(train_docs) == len(np.unique(sample.document)) // 2
        assert not train_docs & set(sample.document[~d.split.train_rows].tolist())
    rows = [{"layer": 1, "ridge": r, "id_bits": v, "id_topk": None}
            for r, v in ((0.1, 0.5), (0.01, 0.6), (0.1, 0.7))]
    row = combine(rows)
    assert row["ridge"] == [0.1, 0.01, 0.1] and row["id_topk"] is None
    assert row["id_bits"] == pytest.approx(0.6)
    spread = row["over_probe_seeds"]["id_bits"]
    assert spread["values"] == [0.5, 0.6, 0.7]
    assert spread["half_width"] == pytest.approx(4.302653 * 0.1 / 3 ** 0.5, rel=1e-5)


def test_a_layer_that_does_not_beat_the_frequency_baseline_is_marked():
    def row(values):
        return combine([{"ridge": 0.1, "id_bits_selectivity": v, "prev_bits_selectivity": v}
                        for v in values])
    baseline = row([0.10, 0.12, 0.11])
    above, level = row([0.30, 0.31, 0.33]), row([0.11, 0.10, 0.13])
    for layer in (above, level):
        versus_baseline(layer, baseline)
    assert above["versus_frequency"]["id_bits_selectivity"]["beats"]
    assert not level["versus_frequency"]["id_bits_selectivity"]["beats"]
    assert level["versus_frequency"]["prev_bits_selectivity"]["mean"] == pytest.approx(0.01 / 3)
    from megatron_ext.probes.report import _cell
    assert _cell(level, "id_bits_selectivity").endswith("‡")
    assert "‡" not in _cell(above, "id_bits_selectivity")


def _dataset(prefix, documents) -> str:
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for ids in documents:
        builder.add_document(torch.tensor(ids), [len(ids)])
    builder.finalize(f"{prefix}.idx")
    return str(prefix)


def _model(name: str, trained_on: tuple) -> ModelInfo:
    return ModelInfo(name=name, source=name, arm="learned", code=None, num_layers=1,
                     hidden_size=8, intermediate=8, heads=1, vocab_size=16, context=8,
                     tokenizer=None, seed=1, trained_on=trained_on, load=lambda: None)


def test_the_training_corpus_is_counted_cached_and_refused_when_unreadable(tmp_path):
    a = _dataset(tmp_path / "a", [[1, 2, 2, 0], [3, 3, 3, 0]])
    b = _dataset(tmp_path / "b", [[5, 0]])
    unigrams = frequency.training_unigrams([_model("m", (a,)), _model("n", (a, b))], None)
    assert unigrams.counts.tolist() == [3, 1, 2, 3, 0, 1]       # a once, then b
    assert unigrams.of(np.array([5, 9])).tolist() == [1, 0]     # beyond the counted ids: 0
    cache = tmp_path / "a.unigram_counts.npz"
    assert cache.exists()
    with np.load(cache) as saved:
        assert saved["counts"].tolist() == [2, 1, 2, 3]
    np.savez(cache, counts=np.array([9]), bin_fingerprint=np.load(cache)["bin_fingerprint"])
    assert frequency.counts_of(a).tolist() == [9]               # read from the cache
    os.utime(f"{a}.bin", ns=(1, 1))                             # a changed .bin: recounted
    assert frequency.counts_of(a).tolist() == [2, 1, 2, 3]
    np.save(tmp_path / "c.npy", np.array([4, 5]))
    given = frequency.training_unigrams([_model("x", ())], str(tmp_path / "c.npy"))
    assert given.counts.tolist() == [4, 5] and "c.npy" in given.source
    with pytest.raises(DataError, match=re.escape(f"training data {tmp_path / 'gone'} is not "
                                                  f"readable")):
        frequency.training_unigrams([_model("m", (str(tmp_path / "gone"),))], None)
    with pytest.raises(FlagError, match="model x names no training data .* --unigram-counts"):
        frequency.training_unigrams([_model("x", ())], None)


def test_the_frequency_features_hold_only_the_frequencies():
    """Two ids of one training frequency have one representation; each token's frequency
    class is one-hot."""
    corpus = Unigrams(np.array([100, 100, 10, 1]), "c")
    current, previous = np.array([0, 1, 2, 3, 0]), np.array([3, 2, 1, 0, 0])
    X = frequency.features(corpus, current, previous)
    width = frequency.BINS + 1
    assert X.shape == (5, 2 * width)
    assert torch.equal(X[0, :width], X[1, :width])
    assert torch.equal(X, frequency.features(corpus, np.array([1, 0, 2, 3, 1]), previous))
    assert torch.equal(X[:, 1:width].sum(1), torch.ones(5, dtype=X.dtype))
    assert torch.equal(X[:, width + 1:].sum(1), torch.ones(5, dtype=X.dtype))


def test_control_types_swap_neighbours_in_training_frequency_and_vary_with_the_seed():
    """No type keeps its own label (an odd count too), each takes the label of a type at
    most two places away in training frequency, and the pairing varies with the seed even
    where no two counts tie."""
    from megatron_ext.probes.targets import control_types
    types = np.arange(101) * 3
    counts = np.random.default_rng(0).permutation(1000)[:101] + 1   # distinct
    rank = {t: r for r, t in enumerate(types[np.argsort(-counts)])}
    pairings = set()
    for seed in range(8):
        control = control_types(types, counts, seed)
        assert sorted(control.tolist()) == types.tolist()          # a permutation
        assert np.all(control != types)
        assert max(abs(rank[a] - rank[b]) for a, b in zip(types, control)) <= 2
        pairings.add(control.tobytes())
    assert len(pairings) > 1


def test_a_representation_of_types_only_reads_no_selectivity_on_any_text():
    """States that hold only a random vector per token type (the probe can memorise types,
    nothing else): on each of three held-out texts, the mean id and previous-token
    selectivity of 60 such models (each its own sample, probe seed and vectors) is 0 within
    its Monte Carlo error (the chi-square of the six means over their standard errors below
    its 0.999 quantile), not only on average over texts: a study's seeds share one text.

    This is the unit tier's guard of the probes' false positives (the calibration's 40-trial
    rows cannot catch 10%). A study's interval over 3 seeds (2 probe seeds each) excludes 0
    in 10% of texts, not 5%, when the texts' offsets have a variance 0.39 times that of a
    seed's value (t₂: 4.303/√(1 + 3·0.39) = its 95% point, 2.920); each mean here, over 60
    models of one probe seed (whose variance is 1 to 2 times a seed's of two), then has
    offsets 12.7 to 24.4 times its variance, and the chi-square exceeds its 0.999 quantile
    with probability 0.94 to 0.99 (an offset the same on every text: 0.9999 or more); at the
    nominal rate, with probability 0.001."""
    from megatron_ext.study.calibration.probes import probe_text, probed_selectivity
    rng = np.random.default_rng(4)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # tiny solves: threads only add overhead
    try:
        values = np.array([[probed_selectivity(rng, text, 0.0, 1) for _ in range(60)]
                           for text in (probe_text(rng, r) for r in (True, False, True))])
    finally:
        torch.set_num_threads(threads)
    chi2 = _texts_chi2(values)
    assert chi2 < _GUARD, chi2


def _texts_chi2(values: np.ndarray) -> np.ndarray:
    """The chi-square of the guard above: ``values`` ``[..., texts, models, metrics]``, each
    text's mean over the models squared over its standard error squared, summed over the
    texts and metrics."""
    models = values.shape[-2]
    return ((values.mean(-2) ** 2 / (values.var(-2, ddof=1) / models)).sum((-2, -1)))


_GUARD = float(stats.chi2.ppf(0.999, 6))   # 3 texts x 2 metrics


def test_the_no_selectivity_guard_fails_at_a_10_percent_false_positive_rate():
    """The guard above can fail where the study's interval would exclude 0 in 10% of texts.
    Simulated with normal values: texts whose offsets have 0.39 times a seed's variance make
    a study's t interval over 3 seeds (sharing one text) exclude 0 in 10% of studies (5%
    with none); the guard's chi-square over 3 texts x 2 metrics, each the mean of 60 models
    of one probe seed (twice a seed's variance of two probe seeds: the least power), then
    exceeds its 0.999 quantile in over 90% of runs (0.94 expected), and with no offsets in
    under 1% (0.1% with known standard errors; estimated from 60 models, 0.1-0.7%)."""
    rng = np.random.default_rng(0)
    offsets = np.sqrt(0.39)
    studies = offsets * rng.standard_normal((20000, 1)) + rng.standard_normal((20000, 3))
    t = studies.mean(1) / (studies.std(1, ddof=1) / np.sqrt(3))
    assert np.mean(np.abs(t) > 4.303) == pytest.approx(0.10, abs=0.01)
    noise = np.sqrt(2) * rng.standard_normal((2000, 3, 60, 2))
    for scale, low, high in ((offsets, 0.90, 0.98), (0.0, 0.0, 0.01)):
        texts = scale * rng.standard_normal((2000, 3, 1, 2))
        assert low <= np.mean(_texts_chi2(texts + noise) >= _GUARD) <= high


def test_the_frequency_mark_flags_every_cell_a_frequency_only_representation_reaches():
    """Ids in exact frequency order: the id is a function of the frequency, so states that
    hold only the tokens' frequencies read a positive selectivity on some texts (7-8% of
    them, docs/probes.md), and no estimator can read that as 0 while reading a code's id
    bits. The mark guards the reader: on 4 such texts, each probed by 3 training seeds of 2
    probe seeds as a study's runs are, every cell whose selectivity the frequency-only
    baseline reaches (its mean, paired by seed, at least the cell's) is printed with ‡, for
    states of the frequencies in another form than the baseline's features
    (calibration.probes.frequency_states) and for those features themselves (always marked); a
    code (the ids' bits in noise: a known signal) is never marked."""
    from megatron_ext.study.calibration.probes import against_frequency, exact_order_text
    from megatron_ext.study.probing import _cell, arm_summary
    rng = np.random.default_rng(7)
    reached, threads = {"frequency": 0, "baseline": 0, "code": 0}, torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(4):
            text = exact_order_text(rng)
            for states in reached:
                records = {}
                for seed in (1, 2, 3):
                    (model, baseline) = against_frequency(rng, text, states, 2)
                    row = dict(zip(("id_bits_selectivity", "prev_bits_selectivity"), model))
                    records[seed] = {
                        "chance": {}, "tokens_sha256": "text",
                        "models": {"m": {"trained": [row], "random_init": [row]}},
                        "frequency_baseline": dict(zip(row, baseline))}
                layer = arm_summary("m", records)["trained"][0]
                for m in ("id_bits_selectivity", "prev_bits_selectivity"):
                    gaps = [r["models"]["m"]["trained"][0][m] - r["frequency_baseline"][m]
                            for r in records.values()]
                    marked = "‡" in _cell(layer, m)
                    if np.mean(gaps) <= 0:
                        reached[states] += 1
                        assert marked, (states, m, gaps)
                    assert marked if states == "baseline" else True
                    assert not marked if states == "code" else True, gaps
    finally:
        torch.set_num_threads(threads)
    assert reached["baseline"] == 8 and reached["code"] == 0 and reached["frequency"] > 0
