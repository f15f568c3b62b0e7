"""fixedcode: a Megatron-Core extension for LMs whose input table is a fixed code of the token id.

Core modules (no import from the subpackages ``data``, ``hf``, ``study``, ``probes``):

- the code and the model: ``codes`` (the code schemes, the arms), ``code_limits`` (the
  rules a code's flags and vocabulary follow, without torch), ``embedding``
  (FixedCodeEmbedding for GPTModel), ``kernels`` and ``cuda_extension`` (the fast forward:
  PyTorch path or fused CUDA kernel), ``model`` (the model provider) and its layer parts
  ``attention`` (SDPA core attention), ``torch_norm`` (sequence-parallel-ready norms),
  ``residual`` (the fp32 residual add), ``norms``;
- the run: ``arguments`` (Megatron-LM flags), ``recipes`` (files of flags), ``derived``
  (the values settled once at start-up: batch, world layout, padded vocabulary; device,
  layers, a resumed schedule),
  ``initialize`` (process start-up), ``device_checks`` (GPU start-up checks),
  ``cpu_backend`` (Megatron-Core on CPU for tests and the demo), ``tokenizer``,
  ``datasets``, ``index_check`` (indexed datasets read and checked before use),
  ``data_cache``, ``held_out`` (held-out token windows);
- the loop and its parts: ``training``, ``validation``, ``checkpointing`` (the format,
  loading), ``saving`` (writing saves, sync or async), ``manifest`` (each save's checksums),
  ``retention`` (which saves are kept), ``metrics``, ``metric_sinks``, ``exit_conditions``,
  ``exit_signals``, ``reductions`` (what the ranks agree on), ``profiling``, ``log``;
- outside the loop: ``param_count`` (parameters per arm), ``training_report`` (the arms'
  runs compared from their metrics files), ``slurm`` (job scripts and submission), ``files``
  (the atomic writer), ``reporting`` (table cells and figures), ``flag_types`` (argparse
  types of the command lines).

Subpackages: ``data`` (corpus preprocessing), ``hf`` (Hugging Face export and evaluation),
``probes`` (per-layer probes), ``study`` (arms x seeds, evaluated and reported). The command
lines are in tools/.
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
