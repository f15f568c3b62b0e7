"""fixedcode: a Megatron-Core extension for LMs whose input table is a fixed code of the token id.

One folder per concern; each imports only the folders above it in this list
(tests/unit/test_structure.py holds the order, docs/architecture.md draws it):

- ``runtime``: the process a run lives in (start-up, devices, signals, typed errors, logging,
  crash-safe files);
- ``codes``: the fixed codes of token ids and the input layer that applies them (the science);
- ``config``: Megatron-LM's flags, recipe files, the values settled once at start-up;
- ``model``: the model provider, its layer parts, the parameter count of each arm;
- ``datasets``: tokenizers, GPT datasets and loaders, the indexed format, caches, held-out
  windows;
- ``checkpoint``: the checkpoint format, loading, saving, manifests, retention;
- ``metrics``: the training log line, FLOPs and MFU, sinks, norms, shared report pieces;
- ``train``: the training loop and its policies (set-up, step, validation, exits, profiling);
- ``launch``: Slurm job scripts and submission;
- ``preprocess``: corpus preprocessing into indexed datasets, tokenizer training;
- ``hf``: Hugging Face export, parity and downstream evaluation;
- ``probes``: per-layer probes of trained models;
- ``study``: arms x seeds (x sizes, budgets), trained, evaluated and reported.

The command lines are in tools/; the training entry point is pretrain_fixedcode.py.
"""

import warnings

# The one place the version is written (pyproject.toml reads it): a run from a source checkout
# on PYTHONPATH, with no installed package metadata, knows it too.
__version__ = "0.1.0"

# Apex is deliberately not used (Transformer Engine and torch cover the fused ops); its
# absence is expected, not news.
warnings.filterwarnings("ignore", message=r".*Apex (is|are) not installed")
warnings.filterwarnings("ignore", message=r"full scope is deprecated")
# torch's notices about the APIs dist_checkpointing 0.16.1 uses internally.
warnings.filterwarnings("ignore", message=r"Please use DTensor instead")
warnings.filterwarnings("ignore", message=r"`load_state_dict` is deprecated")
