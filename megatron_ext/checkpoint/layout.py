"""The checkpoint format (Megatron-Core ``dist_checkpointing``): the ``iter_N`` naming, the
marker, the completed saves of a ``--save`` folder, the train state and provenance a save
carries, and its sharded state. Loading is :mod:`.loading`, what a resume must match
:mod:`.compatibility`, writing :mod:`.saving`.

Layout of ``--save DIR``::

    DIR/iter_0000100/                   a dist_checkpointing checkpoint (torch_dist)
    DIR/iter_0000100/manifest.json      every file's size and CRC-32
    (megatron_ext.checkpoint.manifest) DIR/latest_checkpointed_iteration.txt   "100", written last

Every rank writes its part of a save, as in Megatron-LM: weights replicated over data-parallel
ranks are spread among them (``FullyParallelSaveStrategyWrapper``), and the distributed
optimizer's state is stored in the layout the checkpoint's content metadata names
(:func:`content_metadata`), which loading reads back.

A save goes to ``iter_N.partial/``, which is renamed to ``iter_N/`` once every rank has
finished, and only then is the marker replaced (atomically). A crash during a save therefore
never leaves a checkpoint that ``--load`` would pick up. Before anything is read from a save,
its files are checked against its manifest (:func:`load_common`); a damaged save is refused,
naming the first bad file and the newest intact save.

State saved: ``model`` and ``optimizer`` (sharded), ``rng_state`` (one object per rank), and
common objects: ``args`` (every argument, as a dict), ``fixed_code``
(:meth:`megatron_ext.codes.schemes.FixedCode.to_dict`: the code with all its drawn parts; ``None``
for the learned arm), ``scheduler``, the :class:`TrainState` fields (``iteration``,
``consumed_train_samples``, ``nonfinite_skipped``, ``overflow_skipped``, ``validation_pending``),
``wandb_run_id`` and the provenance (``checkpoint_format``, ``megatron_core_version``,
``fixedcode_version``, and ``working_directory``: the folder the run started in, which its
relative paths, such as ``--data-path data/train``, are relative to).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
from typing import Optional

import numpy as np
import torch

from megatron.core import parallel_state, tensor_parallel
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.mapping import ShardedObject

import megatron_ext

from ..config.run_config import RunConfig
from ..runtime.errors import CheckpointError
from ..runtime.megatron_compat import installed_release

MARKER = "latest_checkpointed_iteration.txt"


MARKER = "latest_checkpointed_iteration.txt"


# The layout of the common objects. 1: before provenance was recorded; 2: provenance,
# ``validation_pending`` and ``wandb_run_id``; 3: the scheduler counts samples, as
# Megatron-LM's (before: updates). A checkpoint of a newer format is refused.
CHECKPOINT_FORMAT = 3
SCHEDULER_COUNTS_SAMPLES = 3


def provenance() -> dict:
    """What wrote a checkpoint: its format, the software versions, and the folder the run
    started in (what its relative paths are relative to)."""
    return {"checkpoint_format": CHECKPOINT_FORMAT,
            "megatron_core_version": installed_release(),
            "fixedcode_version": megatron_ext.__version__,
            "working_directory": os.getcwd()}


@dataclasses.dataclass
class TrainState:
    """Where a run stands; saved in every checkpoint, restored on resume."""
    iteration: int = 0
    consumed_train_samples: int = 0
    nonfinite_skipped: int = 0  # updates skipped for a failure (training.FAILURES)
    overflow_skipped: int = 0  # fp16 updates skipped while the loss scaler lowered its scale
    # An exit signal stopped the validation of ``iteration``: the resumed run does it first.
    validation_pending: bool = False

    @classmethod
    def from_common(cls, common: dict) -> "TrainState":
        return cls(**{f.name: common.get(f.name, f.default) for f in dataclasses.fields(cls)})


def iteration_name(iteration: int) -> str:
    """``iter_0000100``: a save's folder, and the stem of what is cached per save (a study's
    evaluations and probes)."""
    return f"iter_{iteration:07d}"


def checkpoint_path(save_dir: str, iteration: int) -> str:
    return os.path.join(save_dir, iteration_name(iteration))


def latest_iteration(load_dir: str) -> Optional[int]:
    """The iteration of the last completed save in ``load_dir``, or None."""
    marker = os.path.join(load_dir, MARKER)
    if not os.path.isfile(marker):
        return None
    text = open(marker).read().strip()
    if not text.isdigit():
        raise CheckpointError(f"{marker}: expected an iteration number, found {text!r}")
    iteration = int(text)
    if not os.path.isdir(checkpoint_path(load_dir, iteration)):
        raise CheckpointError(f"{marker} names iteration {iteration}, but "
                              f"{checkpoint_path(load_dir, iteration)} is missing")
    return iteration


def completed_iterations(save_dir: str) -> list[int]:
    """Iterations of the completed saves in ``save_dir`` (never ``.partial``), up to its
    latest marker; none when it is not a folder."""
    latest = latest_iteration(save_dir) if os.path.isdir(save_dir) else None
    if latest is None:
        return []
    found = (re.fullmatch(r"iter_(\d{7})", name) for name in os.listdir(save_dir))
    return sorted(i for i in (int(m.group(1)) for m in found if m) if i <= latest)


def existing_save(load_dir: str, iteration: Optional[int] = None) -> tuple[str, int]:
    """``(path, iteration)`` of save ``iteration`` (default: the latest) of ``load_dir``;
    CheckpointError when there is none."""
    if iteration is None:
        iteration = latest_iteration(load_dir)
        if iteration is None:
            raise CheckpointError(f"no completed checkpoint in {load_dir} (no {MARKER})")
    path = checkpoint_path(load_dir, iteration)
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path} does not exist")
    return path, iteration


def rng_state() -> dict:
    return {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }


def content_metadata(config: RunConfig) -> dict:
    """What a save stores as its content metadata, as Megatron-LM's
    ``_build_sharded_state_dict_metadata`` does: with ``--use-distributed-optimizer`` the
    optimizer-state layout, ``dp_reshardable`` (each rank writes its own buffers, no
    gathering; resumes at another data-parallel size only) or, with
    ``--dist-ckpt-optim-fully-reshardable``, ``fully_reshardable`` (gathered per parameter on
    data-parallel rank 0; resumes at any TP/PP size). Without one, megatron-core takes the
    deprecated ``fully_sharded_model_space``: how checkpoints before this metadata were
    written, and so how they still load."""
    metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    if config.parallel.use_distributed_optimizer:
        metadata["distrib_optim_sharding_type"] = (
            "fully_reshardable" if config.checkpoint.dist_ckpt_optim_fully_reshardable
            else "dp_reshardable")
    return metadata


def saved_content_metadata(common: dict) -> dict:
    """The content metadata of a checkpoint (its common objects given); ``{}`` before it."""
    return dist_checkpointing.load_content_metadata(preloaded_state_dict=common) or {}


def sharded_state(model, optimizer, rng: Optional[dict], is_loading: bool,
                   metadata: dict, with_rng: bool = True) -> dict:
    """``model`` is the bare GPTModel (not its DDP wrapper); ``metadata`` the checkpoint's
    content metadata; ``optimizer`` None: the model's state alone (a load without the
    optimizer: ``--no-load-optim``, ``--finetune``)."""
    # Transformer Engine layers and the distributed optimizer shard over this group.
    metadata = {**metadata,
                "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
    model_sd = model.sharded_state_dict(metadata=metadata)
    state = {"model": model_sd}
    if optimizer is not None:
        state["optimizer"] = optimizer.sharded_state_dict(model_sd, is_loading=is_loading,
                                                          metadata=metadata)
    if with_rng:
        world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
        state["rng_state"] = ShardedObject("rng_state", rng, (world,), (rank,), replica_id=0)
    return state
