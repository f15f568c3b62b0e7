"""fixedcode: a Megatron-Core extension for LMs whose input table is a fixed code of the token id.

Modules: ``codes`` (the code schemes), ``embedding`` (FixedCodeEmbedding for GPTModel),
``kernels`` and ``cuda_extension`` (the fast forward: PyTorch path or fused CUDA kernel), ``model`` (the
model provider), ``arguments`` (Megatron-LM flags), ``derived`` (the values derived once at
start-up: batch, world layout, padded vocabulary), ``initialize`` (process start-up),
``training``, ``checkpointing``, ``saving`` (writing saves: sync or async, the marker),
``manifest`` (each save's checksums), ``retention`` (which saves are kept), ``datasets``, ``data_cache``, ``metrics``, ``metric_sinks``, ``norms``,
``exit_conditions``, ``exit_signals``, ``log`` (the training loop and its parts),
``tokenizer``, ``data`` (preprocessing), ``hf`` (Hugging Face export), ``cpu_backend``
(Megatron-Core on CPU for tests and the demo).
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
