"""Read a training checkpoint (``--save DIR``) into one fp32 CPU GPTModel, whatever its TP/PP.

The checkpoint is found as :mod:`megatron_ext.checkpoint.saving` writes it; its common state holds
``args`` (the training run's flags, ``RunConfig.record``, and its derived values) and
``fixed_code``. The args are read once into the run's typed config (:class:`SavedRun`), which
the export, the probes and a study's evaluation take; its relative paths that a reader opens
(the tokenizer's files, the training data prefixes) are taken from the folder the run started
in (``working_directory``), not from the reader's. The model is rebuilt from that config at
TP=PP=1 with the local layer spec and the PyTorch fixed code, and
``dist_checkpointing`` reshards the saved tensors into it (Transformer Engine checkpoints
share the local spec's sharded keys).
"""

from __future__ import annotations

import dataclasses
import os
from typing import NamedTuple, Optional

from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.mapping import apply_factories
from megatron.core.models.gpt import GPTModel

from ..checkpoint.loading import load_common
from ..codes.schemes import FixedCode
from ..config.data_config import DataConfig
from ..config.parallel_config import ParallelConfig
from ..config.recipes import TRAINING_DATA_FLAGS, is_weight
from ..config.run_config import RunConfig
from ..model.provider import model_provider
from ..runtime.errors import CheckpointError, FixedcodeError


class SavedRun(NamedTuple):
    """A checkpoint's training run as typed values, read once where the checkpoint is read
    (:func:`read_checkpoint`): its ``config`` (``RunConfig.from_record`` of its saved args: a
    flag added since the checkpoint was written reads as its declared default, the value it
    had then, ``checkpoint.compatibility.ADDED_ARGS``; the paths a reader opens as
    :func:`_paths_from_the_run_folder` makes them), and what set-up derived for it that a
    reader needs (``config.derived.Derived``'s, as saved)."""
    config: RunConfig
    padded_vocab_size: int
    tokenizer_sha256: Optional[str] = None


def read_checkpoint(load: str, iteration: Optional[int] = None
                    ) -> tuple[str, SavedRun, Optional[dict], int]:
    """``(path, training run, fixed_code or None, iteration)`` of ``load``'s checkpoint
    (default: the latest completed save)."""
    path, run, common = read_checkpoint_common(load, iteration)
    return path, run, common.get("fixed_code"), common.get("iteration")


# The saved args a reader of the checkpoint needs (written by pretrain_fixedcode.py): the
# model's shape and function, the padded vocabulary, the tokenizer.
REQUIRED_ARGS = ("input_interface", "num_layers", "hidden_size", "ffn_hidden_size",
                 "num_attention_heads", "num_query_groups", "normalization", "norm_epsilon",
                 "swiglu", "disable_bias_linear", "untie_embeddings_and_output_weights",
                 "position_embedding_type", "rotary_base", "max_position_embeddings",
                 "seq_length", "padded_vocab_size", "init_method_std", "tokenizer_type",
                 "tokenizer_model", "vocab_size")


def read_checkpoint_common(load: str, iteration: Optional[int] = None
                           ) -> tuple[str, SavedRun, dict]:
    """:func:`read_checkpoint`'s run with the checkpoint's whole common state (its args as
    saved, train state, provenance: what a model card records), read and verified once."""
    path, common = load_common(load, iteration)
    saved = common.get("args")
    if not isinstance(saved, dict):
        raise CheckpointError(f"{path} holds no training args (common state 'args')")
    missing = [name for name in REQUIRED_ARGS if name not in saved]
    if missing:
        raise CheckpointError(f"{path}: the saved training args lack {missing}; was it "
                              f"written by pretrain_fixedcode.py?")
    config = RunConfig.from_record(saved)
    data = _paths_from_the_run_folder(config.data, common.get("working_directory"))
    return path, SavedRun(dataclasses.replace(config, data=data), saved["padded_vocab_size"],
                          saved.get("tokenizer_sha256")), common


# The saved args that name a blend file, and every path a reader of the checkpoint opens
# besides the data prefixes.
BLEND_FILE_ARGS = ("data_args_path", "per_split_data_args_path")
FILE_ARGS = ("tokenizer_model", "vocab_file", "merge_file") + BLEND_FILE_ARGS


def _paths_from_the_run_folder(data: DataConfig, folder: Optional[str]) -> DataConfig:
    """``data`` with the relative paths among its files and training data prefixes made
    absolute, taken from ``folder``, the run's working directory (a checkpoint written before
    it was recorded keeps its paths as saved), and a blend given in a file
    (``--data-args-path``, ``--per-split-data-args-path``) read into the flags it stands for,
    as training read it; a file not readable here stays named (the probes refuse to check
    held-out text without it)."""
    def absolute(path: str) -> str:
        return os.path.join(folder, path) if folder else path  # an absolute path stays itself
    data = data.replace(**{name: absolute(getattr(data, name))
                           for name in FILE_ARGS if getattr(data, name)})
    if any(getattr(data, name) for name in BLEND_FILE_ARGS):
        from ..datasets.gpt_datasets import data_paths
        try:
            (_, blend), per_split = data_paths(data)
        except FixedcodeError:
            return data
        data = data.replace(data_path=_paths(blend), data_args_path=None,
                            per_split_data_args_path=None,
                            **{f"{split}_data_path": _paths(paths) for split, (_, paths)
                               in zip(("train", "valid", "test"), per_split)})
    if not folder:
        return data
    return data.replace(**{name: tuple(v if is_weight(str(v)) else absolute(str(v))
                                       for v in getattr(data, name))
                           for name in (flag[2:].replace("-", "_") for flag in TRAINING_DATA_FLAGS)
                           if getattr(data, name)})


def _paths(values) -> Optional[tuple]:
    """A blend's values as a config holds them (a tuple; None where there are none)."""
    return None if values is None else tuple(values)


def load_model(path: str, run: SavedRun, fixed_code: Optional[dict]) -> GPTModel:
    """The checkpoint's model as one fp32 module on CPU, in eval mode: one copy of the
    weights in memory (built uninitialised, the checkpoint's tensors read into it). Needs
    ``initialize_distributed("cpu")`` (TP=PP=1) first."""
    # TP=PP=1 (ParallelConfig's defaults); execution choices, some absent from older
    # checkpoints: no parameter depends on them, and one backend for every model a process
    # loads (GPTModel pins TE's variables to it)
    config = dataclasses.replace(run.config, parallel=ParallelConfig())
    config = config.replace(
        transformer_impl="local", fp8_format=None, fixed_code_impl="torch", bf16=False,
        fp16=False, recompute_granularity=None, recompute_method=None,
        recompute_num_layers=None, attention_backend="auto", fp32_residual_connection=False,
        cross_entropy_loss_fusion=False, cross_entropy_fusion_impl="native")
    # the saved code, never a redrawn one
    model = model_provider(config, run.padded_vocab_size, on_cpu=True,
                           code=None if fixed_code is None else FixedCode.from_dict(fixed_code),
                           initialize=False)
    # Read into the model's own tensors: megatron-core loads each tensor in place, but returns
    # the ones it saved in parts (SwiGLU's fc1, as its two halves) concatenated anew, every
    # layer's at once; with the parts' factories applied here, the halves are views of the
    # model's fc1 and nothing is concatenated: the weights are in memory once.
    sharded = model.sharded_state_dict()
    apply_factories(sharded)
    dist_checkpointing.load({"model": sharded}, path)
    return model.eval()
