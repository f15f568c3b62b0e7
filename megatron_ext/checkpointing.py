"""Checkpoints with Megatron-Core ``dist_checkpointing``: save, find the latest, load, refuse
incompatible ones.

Layout of ``--save DIR``::

    DIR/iter_0000100/                   a dist_checkpointing checkpoint (torch_dist)
    DIR/latest_checkpointed_iteration.txt   "100", written last

Every rank writes its part of a save, as in Megatron-LM: weights replicated over data-parallel
ranks are spread among them (``FullyParallelSaveStrategyWrapper``), and the distributed
optimizer's state is stored in the layout the checkpoint's content metadata names
(:func:`content_metadata`), which loading reads back.

A save goes to ``iter_N.partial/``, which is renamed to ``iter_N/`` once every rank has
finished, and only then is the marker replaced (atomically). A crash during a save therefore
never leaves a checkpoint that ``--load`` would pick up.

State saved: ``model`` and ``optimizer`` (sharded), ``rng_state`` (one object per rank), and
common objects: ``args`` (every argument, as a dict), ``fixed_code``
(:meth:`megatron_ext.codes.FixedCode.to_dict`: the code with all its drawn parts; ``None`` for
the learned arm), ``scheduler``, the :class:`TrainState` fields
(``iteration``, ``consumed_train_samples``, ``nonfinite_skipped``, ``overflow_skipped``,
``validation_pending``),
``wandb_run_id`` and the provenance (``checkpoint_format``, ``megatron_core_version``,
``fixedcode_version``).
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import random
import re
import shutil
import time
from typing import Optional

import numpy as np
import torch

import megatron.core
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
from megatron.core.dist_checkpointing.strategies import filesystem_async
from megatron.core.dist_checkpointing.strategies.fully_parallel import (
    FullyParallelSaveStrategyWrapper,
)
from megatron.core.optimizer import distrib_optimizer
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

import megatron_ext

from .codes import FixedCode
from .derived import Derived, run_record
from .files import write_text
from .log import log

MARKER = "latest_checkpointed_iteration.txt"

# The layout of the common objects. 1: before provenance was recorded; 2: provenance,
# ``validation_pending`` and ``wandb_run_id``. A checkpoint of a newer format is refused.
CHECKPOINT_FORMAT = 2


def provenance() -> dict:
    """What wrote a checkpoint: its format and the software versions."""
    return {"checkpoint_format": CHECKPOINT_FORMAT,
            "megatron_core_version": megatron.core.__version__,
            "fixedcode_version": megatron_ext.__version__}


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

# Arguments that define the model and its input: a checkpoint can only be resumed with the same.
MODEL_DEFINING_ARGS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "padded_vocab_size", "normalization", "swiglu", "disable_bias_linear",
    "untie_embeddings_and_output_weights", "position_embedding_type", "input_interface",
    "code_bits", "code_values", "code_scale", "code_tiling",
)
# Model-defining arguments added since the first checkpoints: their value in those checkpoints.
ADDED_ARGS = {"code_tiling": "repeat"}


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
        raise SystemExit(f"error: {marker}: expected an iteration number, found {text!r}")
    iteration = int(text)
    if not os.path.isdir(checkpoint_path(load_dir, iteration)):
        raise SystemExit(f"error: {marker} names iteration {iteration}, but "
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


def load_common(load_dir: str, iteration: Optional[int] = None) -> tuple[str, dict]:
    """``(path, common objects)`` of a checkpoint (default: the latest)."""
    if iteration is None:
        iteration = latest_iteration(load_dir)
        if iteration is None:
            raise SystemExit(f"error: no completed checkpoint in {load_dir} (no {MARKER})")
    path = checkpoint_path(load_dir, iteration)
    if not os.path.isdir(path):
        raise SystemExit(f"error: checkpoint {path} does not exist")
    common = dist_checkpointing.load_common_state_dict(path)
    written = common.get("checkpoint_format", 1)
    if written > CHECKPOINT_FORMAT:
        raise SystemExit(
            f"error: {path} has checkpoint format {written} (written by fixedcode "
            f"{common.get('fixedcode_version')}, megatron-core "
            f"{common.get('megatron_core_version')}); this fixedcode "
            f"{megatron_ext.__version__} reads formats up to {CHECKPOINT_FORMAT}: upgrade it")
    return path, common


def check_compatible(saved_args: dict, current: dict, path: str) -> None:
    """Refuse to resume a checkpoint whose model or input differs from this run's
    (``current``: its arguments with the derived values, derived.run_record)."""
    saved = {k: saved_args.get(k, ADDED_ARGS.get(k)) for k in MODEL_DEFINING_ARGS}
    diffs = [f"--{k.replace('_', '-')}: checkpoint {saved[k]!r}, now {current[k]!r}"
             for k in MODEL_DEFINING_ARGS if saved[k] != current[k]]
    if diffs:
        raise SystemExit(f"error: cannot resume {path} with a different model or input:\n  "
                         + "\n  ".join(diffs))


# The learning-rate and weight-decay schedule, by argument, with its flag.
SCHEDULE_FLAGS = {
    "lr": "--lr", "min_lr": "--min-lr", "lr_warmup_iters": "--lr-warmup-iters",
    "lr_decay_iters": "--lr-decay-iters", "lr_decay_style": "--lr-decay-style",
    "lr_wsd_decay_iters": "--lr-wsd-decay-iters", "lr_wsd_decay_style": "--lr-wsd-decay-style",
    "weight_decay": "--weight-decay",
}


def _schedule(args: dict) -> dict:
    """The schedule the arguments define (decay length resolved, WSD values only for WSD)."""
    schedule = {k: args.get(k) for k in SCHEDULE_FLAGS}
    schedule["lr_decay_iters"] = schedule["lr_decay_iters"] or args.get("train_iters")
    if schedule["lr_decay_style"] != "WSD":
        schedule["lr_wsd_decay_iters"] = schedule["lr_wsd_decay_style"] = None
    return schedule


def reconcile_schedule(saved_args: dict, args: argparse.Namespace, train_iters: int,
                       path: str) -> list[str]:
    """On resume, settle which schedule continues when the flags and the checkpoint differ
    (``train_iters``: this run's, derived; the decay length defaults to it):
    the flags' with ``--override-opt_param-scheduler``, the checkpoint's (copied into
    ``args``) with ``--use-checkpoint-opt_param-scheduler``, else an error naming each
    difference. Returns the differences, ``["--flag NEW (checkpoint OLD)", ...]``."""
    if args.override_opt_param_scheduler and args.use_checkpoint_opt_param_scheduler:
        raise SystemExit("error: --override-opt_param-scheduler and "
                         "--use-checkpoint-opt_param-scheduler are exclusive")
    old, new = _schedule(saved_args), _schedule({**vars(args), "train_iters": train_iters})
    diffs = [f"{SCHEDULE_FLAGS[k]} {new[k]} (checkpoint {old[k]})" for k in old if old[k] != new[k]]
    if not diffs or args.override_opt_param_scheduler:
        return diffs
    if args.use_checkpoint_opt_param_scheduler:
        for k in SCHEDULE_FLAGS:
            setattr(args, k, old[k] if old[k] is not None else getattr(args, k))
        return diffs
    raise SystemExit(
        f"error: the learning-rate schedule differs from the one {path} was trained with: "
        + ", ".join(diffs) + ". Pass --override-opt_param-scheduler to continue with the new "
        "values, or --use-checkpoint-opt_param-scheduler to keep the checkpoint's")


def _rng_state() -> dict:
    return {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }


def _set_rng_state(state: dict) -> None:
    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


def content_metadata(args: argparse.Namespace) -> dict:
    """What a save stores as its content metadata, as Megatron-LM's
    ``_build_sharded_state_dict_metadata`` does: with ``--use-distributed-optimizer`` the
    optimizer-state layout, ``dp_reshardable`` (each rank writes its own buffers, no
    gathering; resumes at another data-parallel size only) or, with
    ``--dist-ckpt-optim-fully-reshardable``, ``fully_reshardable`` (gathered per parameter on
    data-parallel rank 0; resumes at any TP/PP size). Without one, megatron-core takes the
    deprecated ``fully_sharded_model_space``: how checkpoints before this metadata were
    written, and so how they still load."""
    metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    if args.use_distributed_optimizer:
        metadata["distrib_optim_sharding_type"] = (
            "fully_reshardable" if args.dist_ckpt_optim_fully_reshardable else "dp_reshardable")
    return metadata


def saved_content_metadata(common: dict) -> dict:
    """The content metadata of a checkpoint (its common objects given); ``{}`` before it."""
    return dist_checkpointing.load_content_metadata(preloaded_state_dict=common) or {}


def check_optimizer_resharding(common: dict, args: argparse.Namespace, path: str) -> None:
    """Refuse to resume distributed-optimizer state at a TP/PP size its layout cannot take."""
    saved_args = common["args"]
    layout = saved_content_metadata(common).get("distrib_optim_sharding_type")
    if layout is None or layout in DistributedOptimizer.checkpoint_fully_reshardable_formats:
        return
    changed = [f"--{k.replace('_', '-')} {saved_args.get(k)} (now {getattr(args, k)})"
               for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size")
               if saved_args.get(k) != getattr(args, k)]
    if changed:
        raise SystemExit(
            f"error: {path} holds distributed-optimizer state in the {layout} layout, which "
            f"resumes at another data-parallel size only, but it was saved with "
            f"{', '.join(changed)}: resume at the saved sizes (save there with "
            f"--dist-ckpt-optim-fully-reshardable to change them)")


def _sharded_state(model, optimizer, rng: Optional[dict], is_loading: bool,
                   metadata: dict, with_rng: bool = True) -> dict:
    """``model`` is the bare GPTModel (not its DDP wrapper); ``metadata`` the checkpoint's
    content metadata."""
    # Transformer Engine layers and the distributed optimizer shard over this group.
    metadata = {**metadata,
                "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
    model_sd = model.sharded_state_dict(metadata=metadata)
    state = {"model": model_sd,
             "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=is_loading,
                                                       metadata=metadata)}
    if with_rng:
        world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
        state["rng_state"] = ShardedObject("rng_state", rng, (world,), (rank,), replica_id=0)
    return state


def _fork_writer_results_queue() -> None:
    """megatron-core's torch_dist writer reports through a ``Manager`` queue that it starts,
    on a rank's first save, with the *spawn* method: the new process re-imports the entry
    point (torch, megatron-core), 4-6 s of CPU per rank. A Manager forked from this process
    serves the same queue within milliseconds (the writers themselves are forked too)."""
    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = multiprocessing.get_context("fork").Manager().Queue()


def save_checkpoint(args: argparse.Namespace, derived: Derived, model, optimizer, scheduler,
                    state: TrainState, code: Optional[FixedCode],
                    wandb_run_id: Optional[str] = None) -> str:
    """Save on every rank; returns the final checkpoint path. ``code``: the model's fixed code
    (``None`` for the learned arm), stored whole as the common object ``fixed_code``."""
    iteration = state.iteration
    final = checkpoint_path(args.save, iteration)
    partial = final + ".partial"
    rank0 = torch.distributed.get_rank() == 0
    if rank0:
        # Leftovers of a crashed save: shards without completion, or a completed directory
        # whose marker was never written. Neither is a checkpoint; both are redone.
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        os.makedirs(partial)
    torch.distributed.barrier()
    _fork_writer_results_queue()
    metadata = content_metadata(args)
    sharded = _sharded_state(model, optimizer, _rng_state(), is_loading=False, metadata=metadata)
    sharded.update(args=run_record(args, derived),
                   fixed_code=None if code is None else code.to_dict(),
                   scheduler=scheduler.state_dict(),
                   wandb_run_id=wandb_run_id, **dataclasses.asdict(state), **provenance())
    strategy = FullyParallelSaveStrategyWrapper(
        get_default_save_sharded_strategy(),
        parallel_state.get_data_parallel_group(with_context_parallel=True))
    dist_checkpointing.save(sharded, partial, strategy, content_metadata=metadata)
    torch.distributed.barrier()
    # Test hooks: die after the shards, before completion; or stay inside the save a while
    # (a window for a signal to arrive in).
    if os.environ.get("FIXEDCODE_FAULT_AFTER_SHARDS") == str(iteration):
        os._exit(17)
    time.sleep(float(os.environ.get("FIXEDCODE_TEST_SAVE_SECONDS", 0)))
    if rank0:
        os.rename(partial, final)
        write_text(os.path.join(args.save, MARKER), str(iteration))
    torch.distributed.barrier()
    return final


class Checkpointer:
    """The run's save policy: every ``--save-interval`` iterations and when the run ends,
    only with ``--save``, never the same iteration twice."""

    def __init__(self, args: argparse.Namespace, derived: Derived, model, optimizer, scheduler,
                 code: Optional[FixedCode], wandb_run_id: Optional[str],
                 last_saved: Optional[int]):
        self.args, self.derived = args, derived
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.code, self.wandb_run_id = code, wandb_run_id
        self.last_saved = last_saved

    def due(self, iteration: int) -> bool:
        return bool(self.args.save_interval) and iteration % self.args.save_interval == 0

    def save(self, state: TrainState) -> None:
        if not self.args.save or self.last_saved == state.iteration:
            return
        path = save_checkpoint(self.args, self.derived, self.model, self.optimizer,
                               self.scheduler, state, self.code, self.wandb_run_id)
        self.last_saved = state.iteration
        log(f"[fixedcode] saved checkpoint {path}")


def _torch_adam_distributed(optimizer) -> list:
    """The distributed optimizers of a chain that run torch's Adam (no TE, no Apex), with their
    indices in the chain. megatron-core 0.16.1 cannot resume them as it is:

    * it builds the loading template from one ``step`` among the per-parameter states, which
      torch's Adam creates at its first step only (an assert in ``state_dict`` fails):
      :func:`_init_torch_adam_state` creates the state a first step would;
    * loading the parameter state copies the template's ``step`` over the one just read from
      the saved parameter groups: :func:`_restore_torch_adam_steps` puts the saved one back.

    Found on the first GPU run (H200 without TE or Apex); tested on CPU at one rank."""
    if distrib_optimizer.HAVE_APEX_OR_TE:
        return []
    return [(i, opt) for i, opt in enumerate(optimizer.chained_optimizers)
            if isinstance(opt, DistributedOptimizer)]


def _init_torch_adam_state(optimizer) -> None:
    for _, opt in _torch_adam_distributed(optimizer):
        if not opt.optimizer.state:
            opt.init_state_fn(opt.optimizer, opt.config)
            for state in opt.optimizer.state.values():
                state["step"] = torch.tensor(0.0)


def _restore_torch_adam_steps(optimizer, loaded) -> None:
    """``loaded``: the optimizer part of the loaded checkpoint, as the chain's
    ``load_state_dict`` takes it (one optimizer's state dict, or one per optimizer)."""
    chain = optimizer.chained_optimizers
    if len(chain) > 1:
        loaded = [v for _, v in sorted(loaded.items())] if isinstance(loaded, dict) else loaded
    for i, opt in _torch_adam_distributed(optimizer):
        saved = loaded if len(chain) == 1 else loaded[i]
        (step,) = {g["step"] for g in saved["optimizer"]["param_groups"]}
        for state in opt.optimizer.state.values():
            state["step"] = torch.tensor(float(step))


def load_checkpoint(path: str, common: dict, model, optimizer, scheduler) -> None:
    """Load model, optimizer, scheduler and RNG state from ``path`` (common objects given)."""
    world = torch.distributed.get_world_size()
    _init_torch_adam_state(optimizer)
    same_world = common["args"].get("world_size") == world
    state = dist_checkpointing.load(
        _sharded_state(model, optimizer, None, is_loading=True,
                       metadata=saved_content_metadata(common),
                       with_rng=same_world), path)
    model.load_state_dict(state["model"])
    # megatron-core 0.16.1's load_parameter_state_from_dp_reshardable lacks its siblings'
    # @torch.no_grad(): in fp32 the distributed optimizer's main parameters are views of the
    # model's, and copying into them fails ("a view of a leaf Variable that requires grad").
    with torch.no_grad():
        optimizer.load_state_dict(state["optimizer"])
    _restore_torch_adam_steps(optimizer, state["optimizer"])
    scheduler.load_state_dict(common["scheduler"])
    if same_world:
        _set_rng_state(state["rng_state"])
    else:
        log(f"[fixedcode] world size changed ({common['args'].get('world_size')} -> {world}): "
            f"random-number states are re-seeded")
