"""What a resumed run must share with its checkpoint, and what it may change: the model,
input and precision (:func:`check_compatible`), the data and the model's function, said in
the log (:func:`changed_on_resume`), the learning-rate schedule (:func:`reconcile_schedule`),
the parallel sizes the distributed optimizer's saved layout allows
(:func:`check_optimizer_resharding`). Which flags are which, each flag's field declares
(``resume=``, ``added=``: ``config/flag_fields.py``); the sets here are built from them."""

from __future__ import annotations

from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

from ..config.data_config import DataConfig
from ..config.model_config import ModelConfig, padded_vocab_size
from ..config.parallel_config import ParallelConfig
from ..config.run_config import RunConfig, declared_defaults, fields_where
from ..runtime.errors import CheckpointError
from ..runtime.megatron_compat import installed_release, null_tokenizer_counts
from . import manifest
from .layout import saved_content_metadata


# Each flag's field declares what a resume does when it differs (flag_fields.RESUME_KINDS).
# Refused: the model and its input, and the padded vocabulary, a value derived at start-up
# (derived.Derived), not a flag: --vocab-size, --make-vocab-size-divisible-by and the
# tensor-parallel size may change where the padding they give does not.
MODEL_DEFINING_ARGS = (*(f.name for _, f in fields_where(resume="model")), "padded_vocab_size")

# The flags added since the first checkpoints: their value in those checkpoints, the default
# each was added with (which kept the earlier behaviour).
ADDED_ARGS = declared_defaults(*(f.name for _, f in fields_where(added=True)))

# The precision the optimizer state was saved in (its main-parameter copies and loss scaler),
# refused when it differs; off (the declared default) where a checkpoint's args lack them.
PRECISION_ARGS = declared_defaults(*(f.name for _, f in fields_where(resume="precision")))


def _said_order(concern: type) -> int:
    """The data's flags first, the model's last, the rest (--seed: the data's order) between."""
    return {DataConfig: 0, ModelConfig: 2}.get(concern, 1)


# What a resumed run may change on purpose (a new blend for a cooldown, a longer context, a
# fine-tuning's dropout), so it is said, not refused: the data and their order, and what the
# model computes without changing its shape. Megatron-LM resumes with them changed in silence.
SAID_ON_RESUME = tuple(f.name for _, f in sorted(fields_where(resume="said"),
                                                 key=lambda pair: _said_order(pair[0])))


def _differences(names, saved_args: dict, current: dict, absent: dict = ADDED_ARGS) -> list[str]:
    """``"--flag: checkpoint OLD, now NEW"`` for each of ``names`` that differs (``absent``:
    the value of one the checkpoint's args lack)."""
    saved = {k: saved_args.get(k, absent.get(k)) for k in names}
    return [f"--{k.replace('_', '-')}: checkpoint {saved[k]!r}, now {current.get(k)!r}"
            for k in names if saved[k] != current.get(k)]


def _null_tokenizer_release(saved_args: dict, current: dict, path: str) -> list[str]:
    """The release difference behind a padded vocabulary that differs with the same
    ``NullTokenizer`` flags: NullTokenizer(V) counts V + 1 ids before megatron-core 0.18.0 and
    V from it (megatron_compat.null_tokenizer_counts), so a save of one side pads to another
    size on the other. The lines that say so and how to resume, or none."""
    names = ("tokenizer_type", "vocab_size", "make_vocab_size_divisible_by",
             "tensor_model_parallel_size")
    if (saved_args.get("tokenizer_type") != "NullTokenizer"
            or any(saved_args.get(k) != current.get(k) for k in names)):
        return []
    vocab, divisible, tp = (current[k] for k in names[1:])
    here, _ = null_tokenizer_counts(vocab)
    there = vocab + 1 if here == vocab else vocab  # the count on the other side of 0.18.0
    if padded_vocab_size(there, divisible, tp) != saved_args.get("padded_vocab_size"):
        return []
    written = manifest.written_by(path)
    return [f"a megatron-core release difference: NullTokenizer's vocabulary changed in "
            f"megatron-core 0.18.0 (NullTokenizer({vocab}) counts {vocab + 1} ids before it, "
            f"{vocab} from it); this save was written with megatron-core "
            f"{written or ('before 0.18.0' if there > here else '0.18.0 or later')}, this run "
            f"has {installed_release()}: resume it with --vocab-size {vocab + there - here}, "
            f"whose NullTokenizer here has the save's {there} ids"]


def check_compatible(saved_args: dict, current: dict, path: str) -> None:
    """Refuse to resume a checkpoint whose model, input or precision differs from this run's
    (``current``: its arguments with the derived values, derived.run_record), naming a
    megatron-core release difference where it is the cause."""
    diffs = _differences(MODEL_DEFINING_ARGS, saved_args, current)
    if diffs:
        raise CheckpointError(f"cannot resume {path} with a different model or input:\n  "
                              + "\n  ".join(diffs + _null_tokenizer_release(saved_args,
                                                                             current, path)))
    diffs = _differences(PRECISION_ARGS, saved_args, current, PRECISION_ARGS)
    if diffs:
        raise CheckpointError(f"cannot resume {path} in another precision (its optimizer "
                              f"state holds that precision's parameter copies):\n  "
                              + "\n  ".join(diffs))


def changed_on_resume(saved_args: dict, current: dict) -> list[str]:
    """The flags of :data:`SAID_ON_RESUME` that differ from the checkpoint's, each
    ``"--flag: checkpoint OLD, now NEW"``, and the tokenizer's files if their digest does
    (a checkpoint from before the digest: not compared), for the resumed run's log."""
    changed = _differences(SAID_ON_RESUME, saved_args, current)
    old, new = saved_args.get("tokenizer_sha256"), current.get("tokenizer_sha256")
    if old and old != new:
        changed.append(f"the tokenizer's files: sha256 {old[:12]}... at the checkpoint, now "
                       f"{new[:12] if new else None}...")
    return changed


# The learning-rate and weight-decay schedule, by argument, with its flag.
SCHEDULE_FLAGS = {f.name: c.spellings(f)[0] for c, f in fields_where(resume="schedule")}


def _schedule(flags: dict) -> dict:
    """The schedule the arguments define (decay length resolved, WSD values only for WSD)."""
    schedule = {k: flags.get(k, ADDED_ARGS.get(k)) for k in SCHEDULE_FLAGS}
    schedule["lr_decay_iters"] = schedule["lr_decay_iters"] or flags.get("train_iters")
    if schedule["lr_decay_style"] != "WSD":
        schedule["lr_wsd_decay_iters"] = schedule["lr_wsd_decay_style"] = None
        schedule["lr_wsd_decay_samples"] = None
    return schedule


def reconcile_schedule(saved_args: dict, config: RunConfig, train_iters: int,
                       global_batch: int, path: str) -> tuple[list[str], dict]:
    """On resume, settle which schedule continues when the flags and the checkpoint differ
    (``train_iters``, ``global_batch``: this run's, derived; the decay length defaults to
    the first): the flags' with ``--override-opt_param-scheduler``, the checkpoint's with
    ``--use-checkpoint-opt_param-scheduler``, else an error naming each difference. Returns
    the differences, ``["--flag NEW (checkpoint OLD)", ...]``, and the schedule the run
    keeps, ``{name: value}`` over :data:`SCHEDULE_FLAGS` (``config`` is not written into).

    The scheduler counts samples, so an iteration-based schedule resumed at another global
    batch (given, or the default micro-batch x data-parallel size on another number of
    GPUs) is another schedule: a difference too, which only the flags' values can take on
    (Megatron-LM refuses it as well)."""
    training, checkpoint = config.training, config.checkpoint
    flags = {k: getattr(training, k) for k in SCHEDULE_FLAGS}
    old, new = _schedule(saved_args), _schedule({**flags, "train_iters": train_iters})
    diffs = [f"{SCHEDULE_FLAGS[k]} {new[k]} (checkpoint {old[k]})" for k in old if old[k] != new[k]]
    saved_batch = saved_args.get("global_batch_size")
    rebatched = saved_args.get("train_samples") is None and saved_batch not in (None,
                                                                                 global_batch)
    if rebatched:
        diffs.append(f"--global-batch-size {global_batch} (checkpoint {saved_batch}: the "
                     f"schedule's iterations are {global_batch / saved_batch:g}x the samples)")
    if not diffs or checkpoint.override_opt_param_scheduler:
        return diffs, flags
    if checkpoint.use_checkpoint_opt_param_scheduler and rebatched:
        raise CheckpointError(
            f"{path} was trained at --global-batch-size {saved_batch}, this run's is "
            f"{global_batch}: the checkpoint's schedule in iterations would cover other "
            f"samples; resume at its global batch, or pass --override-opt_param-scheduler "
            f"to continue with the new values")
    if checkpoint.use_checkpoint_opt_param_scheduler:
        return diffs, {k: old[k] if old[k] is not None else flags[k] for k in SCHEDULE_FLAGS}
    raise CheckpointError(
        f"the learning-rate schedule differs from the one {path} was trained with: "
        + ", ".join(diffs) + ". Pass --override-opt_param-scheduler to continue with the new "
        "values, or --use-checkpoint-opt_param-scheduler to keep the checkpoint's")


def check_optimizer_resharding(common: dict, parallel: ParallelConfig, path: str) -> None:
    """Refuse to resume distributed-optimizer state at a TP/PP size its layout cannot take."""
    saved_args = common["args"]
    layout = saved_content_metadata(common).get("distrib_optim_sharding_type")
    if layout is None or layout in DistributedOptimizer.checkpoint_fully_reshardable_formats:
        return
    changed = [f"--{k.replace('_', '-')} {saved_args.get(k)} (now {getattr(parallel, k)})"
               for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size")
               if saved_args.get(k) != getattr(parallel, k)]
    if changed:
        raise CheckpointError(
            f"{path} holds distributed-optimizer state in the {layout} layout, which "
            f"resumes at another data-parallel size only, but it was saved with "
            f"{', '.join(changed)}: resume at the saved sizes (save there with "
            f"--dist-ckpt-optim-fully-reshardable to change them)")
