"""Probes: what the layers above an immutable input represent, per layer and per arm.

``models``: the probed models (Hugging Face exports, or training checkpoints converted on the
fly), what makes two of them comparable, their randomly initialised twins. ``collect``: the
fixed token sample and the residual stream at every layer, streamed and sub-sampled.
``fit``: closed-form ridge probes, the logit lens and linear CKA. ``frequency``: the training
corpus's unigram counts (the control pairing) and the frequency-only baseline's features.
``targets``: one probe seed's split by document, its labels and the calibrated control
tasks. ``scoring``: the probes of one layer fitted and scored on them, the selectivity on
held-out types. ``run``: every probe and control of one or more models
(:func:`~megatron_ext.probes.run.run_probes`). ``report``: ``probes.json``, the markdown
tables and the figures. ``settings``: the knobs. ``text``: the held-out text (an indexed
dataset or JSONL) cut into windows. The command line is tools/probe.py; see docs/probes.md.
"""
