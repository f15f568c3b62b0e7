"""Read a training checkpoint (``--save DIR``) into one fp32 CPU GPTModel, whatever its TP/PP.

The checkpoint is found as :mod:`megatron_ext.checkpoint.saving` writes it; its common state holds
``args`` (the training run's arguments) and ``fixed_code``. The args' relative paths that a
reader opens (the tokenizer's files, the training data prefixes) are taken from the folder the
run started in (``working_directory``), not from the reader's. The model is rebuilt from those
args at TP=PP=1 with the local layer spec and the PyTorch fixed code, and
``dist_checkpointing`` reshards the saved tensors into it (Transformer Engine checkpoints
share the local spec's sharded keys).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Optional

from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.mapping import apply_factories
from megatron.core.models.gpt import GPTModel

from ..checkpoint.compatibility import ADDED_ARGS
from ..checkpoint.loading import load_common
from ..codes.schemes import FixedCode
from ..config.parallel_config import ParallelConfig
from ..config.recipes import TRAINING_DATA_FLAGS, is_weight
from ..config.run_config import RunConfig
from ..model.provider import model_provider
from ..runtime.errors import CheckpointError, FixedcodeError


def read_checkpoint(load: str, iteration: Optional[int] = None
                    ) -> tuple[str, argparse.Namespace, Optional[dict], int]:
    """``(path, training args, fixed_code or None, iteration)`` of ``load``'s checkpoint
    (default: the latest completed save); model arguments added since an older checkpoint was
    written take the value they had then (compatibility.ADDED_ARGS)."""
    path, args, common = read_checkpoint_common(load, iteration)
    return path, args, common.get("fixed_code"), common.get("iteration")


def read_checkpoint_common(load: str, iteration: Optional[int] = None
                           ) -> tuple[str, argparse.Namespace, dict]:
    """:func:`read_checkpoint`'s args with the checkpoint's whole common state (its args as
    saved, train state, provenance: what a model card records), read and verified once."""
    path, common = load_common(load, iteration)
    if not isinstance(common.get("args"), dict):
        raise CheckpointError(f"{path} holds no training args (common state 'args')")
    args = argparse.Namespace(**{**ADDED_ARGS, **common["args"]})
    _paths_from_the_run_folder(args, common.get("working_directory"))
    return path, args, common


# The saved args that name a blend file, and every path a reader of the checkpoint opens
# besides the data prefixes.
BLEND_FILE_ARGS = ("data_args_path", "per_split_data_args_path")
FILE_ARGS = ("tokenizer_model", "vocab_file", "merge_file") + BLEND_FILE_ARGS


def _paths_from_the_run_folder(args: argparse.Namespace, folder: Optional[str]) -> None:
    """Make the relative paths among ``args``' files and training data prefixes absolute,
    taken from ``folder``, the run's working directory (a checkpoint written before it was
    recorded keeps its paths as saved), and read a blend given in a file (``--data-args-path``,
    ``--per-split-data-args-path``) into the flags it stands for, as training read it; a file
    not readable here stays named (the probes refuse to check held-out text without it)."""
    def absolute(path: str) -> str:
        return os.path.join(folder, path) if folder else path  # an absolute path stays itself
    for name in FILE_ARGS:
        if getattr(args, name, None):
            setattr(args, name, absolute(getattr(args, name)))
    if any(getattr(args, name, None) for name in BLEND_FILE_ARGS):
        from ..datasets.gpt_datasets import data_paths
        try:
            (_, args.data_path), per_split = data_paths(args)
        except FixedcodeError:
            return
        args.train_data_path, args.valid_data_path, args.test_data_path = \
            [paths for _, paths in per_split]
        args.data_args_path = args.per_split_data_args_path = None
    if not folder:
        return
    for flag in TRAINING_DATA_FLAGS:
        name = flag[2:].replace("-", "_")
        if getattr(args, name, None):
            setattr(args, name, [v if is_weight(str(v)) else absolute(str(v))
                                 for v in getattr(args, name)])


def load_model(path: str, args: argparse.Namespace, fixed_code: Optional[dict]) -> GPTModel:
    """The checkpoint's model as one fp32 module on CPU, in eval mode: one copy of the
    weights in memory (built uninitialised, the checkpoint's tensors read into it). Needs
    ``initialize_distributed("cpu")`` (TP=PP=1) first."""
    # TP=PP=1 (ParallelConfig's defaults); execution choices, some absent from older
    # checkpoints: no parameter depends on them, and one backend for every model a process
    # loads (GPTModel pins TE's variables to it)
    config = dataclasses.replace(RunConfig.from_record(vars(args)), parallel=ParallelConfig())
    config = config.replace(
        transformer_impl="local", fp8_format=None, fixed_code_impl="torch", bf16=False,
        fp16=False, recompute_granularity=None, recompute_method=None,
        recompute_num_layers=None, attention_backend="auto", fp32_residual_connection=False,
        cross_entropy_loss_fusion=False, cross_entropy_fusion_impl="native")
    # the saved code, never a redrawn one
    model = model_provider(config, args.padded_vocab_size, on_cpu=True,
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
