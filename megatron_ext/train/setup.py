"""The set-up of a training run, before its first step, as torchtitan separates it from the
loop: the flags checked against the machine (:func:`check_flags`), the layers settled
(:func:`resolve_layers`), the checkpoint to resume and the run's fixed code
(:func:`resolve_checkpoint`), the model, its DDP wrapper, optimizer and scheduler
(:func:`build_model_and_optimizer`); :func:`set_up` does them in order and returns one
:class:`TrainingSetup`. ``args`` (the parsed flags) is read, never written: what start-up
settles is a frozen :class:`~megatron_ext.config.derived.Resolved`, beside the
:class:`~megatron_ext.config.derived.Derived` values."""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Callable, Optional

import torch
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.distributed import finalize_model_grads
from megatron.core.optimizer import (OptimizerConfig, ParamKey, distrib_optimizer,
                                     get_megatron_optimizer, get_standard_config_overrides)
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler, ParamGroupOverride
from megatron.core.transformer.module import Float16Module

from ..checkpoint import compatibility, layout, loading
from ..checkpoint.layout import TrainState
from ..codes.limits import require_vocab_fits
from ..codes.schemes import SCHEMES, FixedCode
from ..config.arguments import check_rank_fits_vocab
from ..config.derived import LOAD_ONLY_FLAGS, Derived, Resolved, derive, run_record
from ..config.schedule import scheduler_steps
from ..datasets.tokenizer import tokenizer_digest, tokenizer_from_args
from ..model.attention import document_mask_refusal, local_core_attention
from ..model.provider import build_code
from ..runtime.device_checks import check_cuda_connections, fp8_refusal
from ..runtime.device_checks import transformer_engine_imports, transformer_engine_version
from ..runtime.errors import DeviceError, FlagError
from ..runtime.log import log
from .compile_layers import check_compile_flags, compile_layers
from .fused_adam import fuse_torch_adam, torch_adam_fused
from .profiling import validate_profile_args


def check_flags(args: argparse.Namespace, device: str) -> tuple:
    """Refuse what cannot run on ``device`` (``cuda`` or ``cpu``); returns ``(tokenizer,
    derived, resolved)``: the values derived from the flags, the world and the tokenizer
    (:class:`~megatron_ext.config.derived.Derived`) and the flags settled for this machine
    (:class:`~megatron_ext.config.derived.Resolved`, with the flags' schedule), built once. ``args``
    is not written into."""
    tokenizer = tokenizer_from_args(args)
    derived = derive(args, torch.distributed.get_world_size(), tokenizer.vocab_size,
                     tokenizer_digest(tokenizer))
    if args.log_layer_norms and args.use_distributed_optimizer:
        raise FlagError("--log-layer-norms reads whole gradients, which "
                        "--use-distributed-optimizer scatters across ranks; drop one")
    if (args.use_distributed_optimizer and args.dist_ckpt_optim_fully_reshardable
            and not distrib_optimizer.HAVE_APEX_OR_TE):
        raise FlagError("--dist-ckpt-optim-fully-reshardable: neither Transformer "
                        "Engine nor Apex imports, so the distributed optimizer runs torch's "
                        "Adam, whose state megatron-core 0.16.1 cannot load in that layout; "
                        "drop the flag (the default layout resumes) or pip install '.[gpu]'")
    transformer_impl, sequence_parallel = resolve_layers(args, device)
    check_compile_flags(args, transformer_impl)
    resolved = Resolved(device, transformer_impl, sequence_parallel,
                        {k: getattr(args, k) for k in compatibility.SCHEDULE_FLAGS},
                        args.finetune, args.no_load_optim, args.no_load_rng)
    for flag in LOAD_ONLY_FLAGS:
        if getattr(args, flag) and not args.load:
            raise FlagError(f"--{flag.replace('_', '-')} needs --load (the checkpoint it "
                            f"reads)")
    if args.overlap_param_gather and not (args.use_distributed_optimizer
                                          and args.overlap_grad_reduce):
        raise FlagError("--overlap-param-gather needs --use-distributed-optimizer and "
                        "--overlap-grad-reduce, as in Megatron-LM")
    validate_profile_args(resolved.applied_to(args))
    torch_adam_fused(args, device)  # refuses what cannot apply
    if args.ckpt_step is not None and not args.load:
        raise FlagError("--ckpt-step needs --load")
    for flag in ("save_interval", "async_save", "keep_last_checkpoints"):
        if getattr(args, flag) and not args.save:
            raise FlagError(f"--{flag.replace('_', '-')} needs --save")
    if args.keep_checkpoints_every and not args.keep_last_checkpoints:
        raise FlagError("--keep-checkpoints-every applies with --keep-last-checkpoints "
                        "only (without it every save is kept)")
    if args.input_interface in SCHEMES:
        require_vocab_fits(derived.padded_vocab_size, args.code_bits, tokenizer.vocab_size)
    check_rank_fits_vocab(args, derived.padded_vocab_size)
    check_input_table_optimizer_flags(args)
    return tokenizer, derived, resolved


def check_input_table_optimizer_flags(args: argparse.Namespace) -> None:
    """The input table's own learning-rate multiplier and weight decay: a trained table's
    (learned, factorized), its own (not tied to the head), not below 0."""
    custom = [flag for flag, value, default in (
        ("--input-table-lr-mult", args.input_table_lr_mult, 1.0),
        ("--input-table-weight-decay", args.input_table_weight_decay, None)) if value != default]
    for flag, value in (("--input-table-lr-mult", args.input_table_lr_mult),
                        ("--input-table-weight-decay", args.input_table_weight_decay)):
        if value is not None and value < 0:
            raise FlagError(f"{flag} {value} is below 0")
    if custom and args.input_interface not in ("learned", "factorized"):
        raise FlagError(f"{', '.join(custom)}: --input-interface {args.input_interface} has no "
                        f"trained input table (learned and factorized have)")
    if custom and not args.untie_embeddings_and_output_weights:
        raise FlagError(f"{', '.join(custom)}: the input table is tied to the output head, "
                        f"which keeps the recipe's; drop --no-untie-embeddings-and-output-weights")


def input_table_overrides(args: argparse.Namespace) -> Optional[dict]:
    """Megatron-Core's optimizer overrides for the input table's parameters (``embedding.*``):
    its peak and final learning rates times ``--input-table-lr-mult``, its weight decay
    ``--input-table-weight-decay``; None (Megatron's default groups) when both are the
    recipe's. Megatron's standard override stays: no weight decay on biases and 1-D weights."""
    if args.input_table_lr_mult == 1.0 and args.input_table_weight_decay is None:
        return None
    overrides = get_standard_config_overrides(OptimizerConfig(lr=args.lr, min_lr=args.min_lr))
    table = {}
    if args.input_table_lr_mult != 1.0:
        table.update(max_lr=args.lr * args.input_table_lr_mult,
                     min_lr=args.min_lr * args.input_table_lr_mult)
    if args.input_table_weight_decay is not None:
        table.update(start_wd=args.input_table_weight_decay,
                     end_wd=args.input_table_weight_decay)
    # named as the optimizer sees them: inside the DDP (and Float16Module) wrappers
    overrides[ParamKey(name=("embedding.*", "*.embedding.*"))] = ParamGroupOverride(**table)
    return overrides


def resolve_layers(args: argparse.Namespace, device: str) -> tuple[str, bool]:
    """``(transformer_impl, sequence_parallel)``: the transformer layers, attention, FP8 and
    sequence parallelism for ``device``, settled as Megatron-LM settles them
    (megatron/training/arguments.py): Transformer Engine layers by default on a GPU where TE
    imports (local layers otherwise, said in the log), sequence parallelism turned off with a
    warning at TP=1; on a GPU, the checks of :mod:`megatron_ext.runtime.device_checks`."""
    impl, sequence_parallel = args.transformer_impl, args.sequence_parallel
    if impl is None:
        te = device == "cuda" and transformer_engine_imports()
        impl = "transformer_engine" if te else "local"
        if device == "cuda":
            log(f"[fixedcode] --transformer-impl {impl} (the default on a GPU: "
                + ("Transformer Engine imports)" if te else
                   "Transformer Engine does not import; pip install '.[gpu]' for it)"))
    elif impl == "transformer_engine" and device == "cpu":
        raise FlagError("--transformer-impl transformer_engine needs a GPU (Transformer "
                        "Engine's layers run on CUDA only); use --transformer-impl local")
    if impl == "transformer_engine" and args.fp32_residual_connection:
        raise FlagError(
            "--fp32-residual-connection with --transformer-impl transformer_engine"
            + (" (the default on a GPU where TE imports)" if args.transformer_impl is None
               else "") + ": TE's fused norm + linear takes the layer's dtype and would "
            "receive the fp32 stream; use --transformer-impl local, or drop "
            "--fp32-residual-connection")
    if args.fp8_format and impl != "transformer_engine":
        raise FlagError("--fp8-format needs --transformer-impl transformer_engine "
                        "(Transformer Engine layers, on a GPU)")
    if impl == "local":
        local_core_attention(args.attention_backend)  # refuses TE's own backends
    elif args.attention_backend == "local":
        raise FlagError("--attention-backend local is Megatron-Core's attention of the "
                        "local layers: it needs --transformer-impl local, as in Megatron-LM")
    if args.reset_attention_mask:
        refusal = document_mask_refusal(impl, args.attention_backend, device,
                                        args.masked_softmax_fusion,
                                        args.pipeline_model_parallel_size)
        if refusal:
            raise FlagError(refusal)
    if sequence_parallel and args.tensor_model_parallel_size == 1:
        log("[fixedcode] warning: --sequence-parallel turned off: it splits activations over "
            "tensor-parallel ranks, and --tensor-model-parallel-size is 1 (as in Megatron-LM)")
        sequence_parallel = False
    if device == "cuda":
        capability = torch.cuda.get_device_capability()
        check_cuda_connections(args.tensor_model_parallel_size, sequence_parallel,
                               capability, os.environ)
        if args.fp8_format:
            refusal = fp8_refusal(args.fp8_recipe, capability, transformer_engine_version())
            if refusal:
                raise DeviceError(refusal)
    return impl, sequence_parallel


def resolve_checkpoint(args: argparse.Namespace, derived: Derived, resolved: Resolved):
    """``(path, common, code, resolved)``: the checkpoint to resume (``None, None`` for a
    fresh run), the run's fixed code (``None`` for the learned arm), resolved once: the
    checkpoint's saved code (A and b are never redrawn), else one drawn from the flags; and
    ``resolved`` with the schedule the run keeps (the checkpoint's, with
    ``--use-checkpoint-opt_param-scheduler``). The caller passes the code to the model
    provider and to saving.

    A ``--save`` directory that holds a checkpoint is the run's own: it is resumed even when
    ``--load`` names another directory (a requeued branch continues, rather than starting
    over from where it branched), and a run without ``--load`` refuses to overwrite it.
    ``--finetune``, ``--no-load-optim`` and ``--no-load-rng`` apply to ``--load``'s checkpoint
    only (``resolved`` says whether they do), and need one there: a run resuming its own
    saves resumes them whole. Without the optimizer's state the schedule is the flags', from
    its step 0."""
    load = args.load
    saved = layout.latest_iteration(args.save) if args.save else None
    if args.finetune and saved is not None and \
            os.path.realpath(load) == os.path.realpath(args.save):
        raise FlagError(f"--finetune from --load {load} into the same --save: a --save "
                        f"directory that holds checkpoints is resumed as the run's own; "
                        f"save the fine-tuning to another directory")
    if saved is not None and not (load and os.path.realpath(load) == os.path.realpath(args.save)):
        if not load:
            raise FlagError(f"--save {args.save} already holds checkpoints (latest: "
                            f"iteration {saved}); resume them with --load {args.save}, or "
                            f"save to another directory")
        log(f"[fixedcode] --save {args.save} holds iteration {saved}: resuming from it, not "
            f"from --load {load}")
        load = args.save
    step = args.ckpt_step if load == args.load else None
    if load != args.load:  # the run's own saves: resumed whole
        resolved = dataclasses.replace(resolved, **dict.fromkeys(LOAD_ONLY_FLAGS, False))
    latest = layout.latest_iteration(load) if load else None
    asked = [f"--{flag.replace('_', '-')}" for flag in LOAD_ONLY_FLAGS
             if getattr(resolved, flag)]
    own = bool(load and args.save) and os.path.realpath(load) == os.path.realpath(args.save)
    if asked and step is None and latest is None and own and not resolved.finetune:
        # Megatron-LM's first launch of a job that resumes its own saves (--load = --save):
        # nothing to load yet, so it starts anew; the flags apply to the saves it resumes
        log(f"[fixedcode] --load {load} holds no checkpoint yet: starting from a random "
            f"initialisation ({' '.join(asked)} apply when it resumes its saves)")
    elif asked and step is None and latest is None:
        raise FlagError(f"{' '.join(asked)}: --load {load} holds no checkpoint (no "
                        f"{layout.MARKER}); without one the run would start from a random "
                        f"initialisation")
    path = common = None
    if load and (step is not None or latest is not None):
        path, common = loading.load_common(load, step)
        current = run_record(resolved.applied_to(args), derived)
        compatibility.check_compatible(common["args"], current, path)
        changed = compatibility.changed_on_resume(common["args"], current)
        if changed and not resolved.finetune:
            log(f"[fixedcode] WARNING: resuming {path} with flags changed since it was saved "
                f"(from here the data order, or what the model computes, is not the "
                f"uninterrupted run's):\n  " + "\n  ".join(changed))
        saved = common["fixed_code"]
        code = None if saved is None else FixedCode.from_dict(saved)
        if resolved.finetune or resolved.no_load_optim:  # the flags' schedule, from step 0
            return path, common, code, resolved
        compatibility.check_optimizer_resharding(common, args, path)
        changes, schedule = compatibility.reconcile_schedule(
            common["args"], args, derived.train_iters, derived.global_batch_size, path)
        resolved = dataclasses.replace(resolved, schedule=schedule)
        if changes:
            log("[fixedcode] learning-rate schedule " + (
                "from these flags, not the checkpoint's: " if args.override_opt_param_scheduler
                else "kept from the checkpoint; ignored: ") + ", ".join(changes))
    else:
        code = build_code(args, derived.padded_vocab_size)
    return path, common, code, resolved


def build_model_and_optimizer(args, derived: Derived, model_provider: Callable,
                              code: Optional[FixedCode] = None):
    """``args``: the flags as the run applies them (:meth:`Resolved.applied_to`); ``code``:
    the run's fixed code (:func:`resolve_checkpoint`); omitted, the model provider draws one
    from the flags."""
    pre = parallel_state.is_pipeline_first_stage()
    post = parallel_state.is_pipeline_last_stage()
    model = model_provider(args, derived.padded_vocab_size, pre_process=pre, post_process=post,
                           code=code)
    if args.device == "cuda":
        model.cuda(torch.cuda.current_device())
    if args.torch_compile_layers:
        layers = compile_layers(model, args.torch_compile_backend)
        log(f"[fixedcode] torch.compile ({args.torch_compile_backend}) of each transformer "
            f"layer: {layers} layers, compiled in the first step (--torch-compile-layers)")
    # As Megatron-LM: under --bf16/--fp16 every parameter (norms included, which the local
    # layers create in fp32) is cast to the training dtype, and so are the first stage's
    # float inputs; the last stage's output comes back in fp32. ``model`` stays the bare
    # GPTModel (checkpoints, metrics, norms); the wrapper shares its parameters.
    module = Float16Module(model.config, model) if args.bf16 or args.fp16 else model
    ddp = DistributedDataParallel(
        config=model.config,
        ddp_config=DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=args.overlap_grad_reduce,
            overlap_param_gather=args.overlap_param_gather,
            bucket_size=args.ddp_bucket_size,
            use_distributed_optimizer=args.use_distributed_optimizer),
        module=module)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=args.lr, min_lr=args.min_lr,
                        weight_decay=args.weight_decay, adam_beta1=args.adam_beta1,
                        adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
                        clip_grad=args.clip_grad, bf16=args.bf16, fp16=args.fp16,
                        log_num_zeros_in_grad=args.log_num_zeros_in_grad,
                        params_dtype=model.config.params_dtype,
                        use_distributed_optimizer=args.use_distributed_optimizer),
        [ddp], config_overrides=input_table_overrides(args))
    if torch_adam_fused(args, args.device) and fuse_torch_adam(optimizer):
        log("[fixedcode] optimizer: torch's AdamW with its fused kernel (--torch-adam-fused)")
    steps = scheduler_steps(vars(args), args.train_samples, derived.train_iters,
                            derived.global_batch_size)
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=args.lr_warmup_init, max_lr=args.lr, min_lr=args.min_lr,
        lr_warmup_steps=steps.warmup, lr_decay_steps=steps.decay,
        lr_decay_style=args.lr_decay_style,
        start_wd=args.weight_decay, end_wd=args.weight_decay,
        wd_incr_steps=steps.wd_incr, wd_incr_style="constant",
        wsd_decay_steps=steps.wsd_decay, lr_wsd_decay_style=args.lr_wsd_decay_style,
        # The schedule was settled on resume (compatibility.reconcile_schedule): the
        # scheduler takes its own values, which are the flags' or the checkpoint's.
        use_checkpoint_opt_param_scheduler=False, override_opt_param_scheduler=True)
    model.config.finalize_model_grads_func = finalize_model_grads
    model.config.no_sync_func = ddp.no_sync
    if args.fp16:
        model.config.grad_scale_func = optimizer.scale_loss
    return model, ddp, optimizer, scheduler


def save_initialised_model(args: argparse.Namespace) -> str:
    """Build the model of the training flags ``args`` on the CPU, initialised as a run starts
    it (``--seed``), and save it alone to ``--save`` as iteration 0: what the converter reads
    (tools/convert_to_hf.py), made without a step, the optimizer's state or the memory they
    take (bench/bench_convert.py converts the 1.7B shape so). Training cannot resume it.
    Needs a process group of one rank; returns the checkpoint's path."""
    from ..checkpoint.saving import save_checkpoint
    from ..model.provider import model_provider
    from ..runtime.initialize import set_seed
    tokenizer = tokenizer_from_args(args)
    derived = derive(args, 1, tokenizer.vocab_size, tokenizer_digest(tokenizer))
    code = build_code(args, derived.padded_vocab_size)
    set_seed(args.seed)
    model = model_provider(args, derived.padded_vocab_size, on_cpu=True, code=code)
    return save_checkpoint(args, derived, model, None, None, TrainState(), code)


@dataclasses.dataclass
class TrainingSetup:
    """What the loop starts from: the flags as this run applies them (``run``), the values
    derived from them, the tokenizer, the model (the bare GPTModel), its DDP wrapper, the
    optimizer and scheduler, the run's fixed code (None for the learned arm), the train
    state (resumed or fresh), and the checkpoint resumed (``resume_path`` and its common
    objects; None for a fresh run)."""
    run: argparse.Namespace
    derived: Derived
    tokenizer: object
    model: torch.nn.Module
    ddp: DistributedDataParallel
    optimizer: object
    scheduler: OptimizerParamScheduler
    code: Optional[FixedCode]
    state: TrainState
    resume_path: Optional[str] = None
    common: Optional[dict] = None


def set_up(args: argparse.Namespace, device: str, model_provider: Callable) -> TrainingSetup:
    """Check the flags, resolve the checkpoint, build the model and optimizer and load the
    checkpoint into them; the process group is already initialised."""
    tokenizer, derived, resolved = check_flags(args, device)
    resume_path, common, code, resolved = resolve_checkpoint(args, derived, resolved)
    run = resolved.applied_to(args)
    model, ddp, optimizer, scheduler = build_model_and_optimizer(run, derived, model_provider,
                                                                 code)
    state = TrainState()
    if resume_path:
        loading.load_checkpoint(resume_path, common, model, optimizer, scheduler,
                                load_optim=not (run.finetune or run.no_load_optim),
                                load_rng=not (run.finetune or run.no_load_rng))
        if torch_adam_fused(run, device):
            fuse_torch_adam(optimizer)  # the loaded parameter groups are the saved ones
        if run.finetune:  # as Megatron-LM: iteration 0, consumed samples 0
            log(f"[fixedcode] --finetune: model weights from {resume_path}, iteration 0")
        else:
            state = TrainState.from_common(common)
            log(f"[fixedcode] resumed from {resume_path} at iteration {state.iteration}")
    elif args.load:
        log(f"[fixedcode] no checkpoint in {args.load} yet: starting from scratch")
    return TrainingSetup(run, derived, tokenizer, model, ddp, optimizer, scheduler, code, state,
                         resume_path, common)
