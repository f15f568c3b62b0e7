"""Loading a checkpoint: its files verified against the manifest first (spread over the
ranks), a damaged save refused naming the newest intact one, a newer format refused, then the
model, optimizer (with :mod:`.torch_adam`'s fix), scheduler and random-number states."""

from __future__ import annotations

import random
from typing import Optional

import numpy as np
import torch

from megatron.core import dist_checkpointing, tensor_parallel

import megatron_ext

from ..runtime.errors import CheckpointError
from ..runtime.log import log
from ..runtime.megatron_compat import read_common_objects
from . import manifest, torch_adam
from .layout import (CHECKPOINT_FORMAT, SCHEDULER_COUNTS_SAMPLES, completed_iterations,
                     checkpoint_path, existing_save, saved_content_metadata, sharded_state)


def verify_save(path: str) -> None:
    """Check a save's files against its manifest before it is read, the files spread over
    the ranks when torch.distributed runs (every rank calls it); raises
    :class:`~megatron_ext.checkpoint.manifest.DamagedCheckpoint` on every rank, naming a bad
    file."""
    files = manifest.read_manifest(path)
    if files is None:
        log(f"[fixedcode] {path} was written before manifests: not verified")
        return
    ranks = torch.distributed.is_initialized()
    rank, world = ((torch.distributed.get_rank(), torch.distributed.get_world_size())
                   if ranks else (0, 1))
    try:
        manifest.verify(path, sorted(files)[rank::world])
        error = None
    except manifest.DamagedCheckpoint as e:
        error = str(e)
    if world > 1:
        errors = [None] * world
        torch.distributed.all_gather_object(errors, error)
        error = next((e for e in errors if e), None)
    if error:
        raise manifest.DamagedCheckpoint(error)


def check_save(save_dir: str, iteration: Optional[int] = None) -> str:
    """Verify a save (default: the latest) without loading anything from it; returns a
    one-line summary. Raises :class:`~megatron_ext.checkpoint.manifest.DamagedCheckpoint` naming the
    first bad or missing file, CheckpointError when the save is missing or has no manifest."""
    path, _ = existing_save(save_dir, iteration)
    files = manifest.verify(path)
    if files is None:
        raise CheckpointError(f"{path} has no {manifest.MANIFEST} (written before "
                              f"manifests): cannot verify")
    size = sum(f["size"] for f in files.values())
    release = manifest.written_by(path)
    return (f"ok: {path}: {len(files)} files, {size / 2**20:.1f} MiB, sizes and checksums "
            f"match; megatron-core {release or '(not recorded: an older save)'}")


def newest_intact(load_dir: str, below: int) -> Optional[int]:
    """The newest save of ``load_dir`` before iteration ``below`` that verifies, or None."""
    for iteration in reversed(completed_iterations(load_dir)):
        if iteration < below:
            try:
                verify_save(checkpoint_path(load_dir, iteration))
                return iteration
            except manifest.DamagedCheckpoint:
                continue
    return None


def load_common(load_dir: str, iteration: Optional[int] = None) -> tuple[str, dict]:
    """``(path, common objects)`` of a checkpoint (default: the latest), verified first."""
    path, iteration = existing_save(load_dir, iteration)
    try:
        verify_save(path)
    except manifest.DamagedCheckpoint as e:
        older = newest_intact(load_dir, below=iteration)
        raise CheckpointError(
            f"damaged checkpoint: {e}. " + (
                f"The newest intact save is iteration {older}: load it with --load {load_dir} "
                f"--ckpt-step {older}" if older is not None
                else f"No older intact save in {load_dir}")) from None
    common = read_common_objects(path, manifest.written_by(path))
    written = common.get("checkpoint_format", 1)
    if written > CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{path} has checkpoint format {written} (written by fixedcode "
            f"{common.get('fixedcode_version')}, megatron-core "
            f"{common.get('megatron_core_version')}); this fixedcode "
            f"{megatron_ext.__version__} reads formats up to {CHECKPOINT_FORMAT}: upgrade it")
    return path, common


def _set_rng_state(state: dict) -> None:
    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


def load_checkpoint(path: str, common: dict, model, optimizer, scheduler, *,
                    load_optim: bool = True, load_rng: bool = True) -> None:
    """Load model, optimizer, scheduler and RNG state from ``path`` (common objects given).
    ``load_optim`` False (``--no-load-optim``, ``--finetune``): the model's weights only, as
    Megatron-LM loads them: the optimizer and scheduler keep their fresh state, and under
    ``--bf16``/``--fp16`` the optimizer's fp32 main weights are copied from the loaded model.
    ``load_rng`` False (``--no-load-rng``): the random-number states stay as seeded."""
    world = torch.distributed.get_world_size()
    if load_optim:
        torch_adam.init_state(optimizer)
    same_world = common["args"].get("world_size") == world
    state = dist_checkpointing.load(
        sharded_state(model, optimizer if load_optim else None, None, is_loading=True,
                      metadata=saved_content_metadata(common),
                      with_rng=same_world and load_rng), path)
    model.load_state_dict(state["model"])
    if not load_optim:
        optimizer.reload_model_params()
        log(f"[fixedcode] {path}: model weights loaded; optimizer and learning-rate "
            f"scheduler start fresh")
    else:
        # megatron-core 0.16.1's load_parameter_state_from_dp_reshardable lacks its siblings'
        # @torch.no_grad(): in fp32 the distributed optimizer's main parameters are views of
        # the model's, and copying into them fails ("a view of a leaf Variable that requires
        # grad").
        with torch.no_grad():
            optimizer.load_state_dict(state["optimizer"])
        torch_adam.restore_steps(optimizer, state["optimizer"])
        scheduler.load_state_dict(common["scheduler"])
        if common.get("checkpoint_format", 1) < SCHEDULER_COUNTS_SAMPLES:
            # it counted updates: each was a full global batch then (no batch ramp)
            scheduler.num_steps *= common["args"]["global_batch_size"]
    if not load_rng:
        log(f"[fixedcode] random-number states not loaded from {path}: as --seed set them")
    elif same_world:
        _set_rng_state(state["rng_state"])
    else:
        log(f"[fixedcode] world size changed ({common['args'].get('world_size')} -> {world}): "
            f"random-number states are re-seeded")
