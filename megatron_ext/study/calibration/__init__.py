"""The calibration suite: every interval a study report prints, simulated from a known truth
across the scenarios that break intervals, with its measured coverage (95% intervals) or
false-positive rate (a null effect), and what a report states about each comparison's power
and what it rules out. ``tools/calibrate.py`` runs it and writes ``calibration.json`` and
``calibration.md``.

``suite``: the scenarios, each row's band, :func:`~.suite.run` and the table. The checks, a
module each, named for what they calibrate: ``comparisons`` (the by-seed t interval of final
losses; the by-seed and the crossed intervals of 0/1 task scores), ``fits`` (the scaling fit,
in compute and in model size and budget), ``tuning`` (a tuned factor's gap and its family of
sizes), ``probes`` (the probes' selectivity with and without signal, and the
frequency-baseline mark), ``power`` (the power a report states, equivalence,
non-inferiority and the gap of interest). ``trials``: what every check counts of a trial.
Pure numpy but for ``probes``, which runs the probes' own fitting (torch) and imports it
inside its functions, so that the rest imports without torch.
"""
