"""The set-up of a training run, before its first step, as torchtitan separates it from the
loop: the run's config checked against the machine and the tokenizer and settled for the
machine (:func:`check_machine_and_tokenizer`; the flags' own checks ran when they were
parsed), the layers settled (:func:`resolve_layers`), the checkpoint to resume and the run's
fixed code (:func:`~megatron_ext.checkpoint.resume.resolve_checkpoint`), the model, its DDP
wrapper, optimizer and scheduler (:func:`build_model_and_optimizer`); :func:`set_up` does
them in order and returns one :class:`TrainingSetup`, whose ``config`` is the one the rest of
the run reads. Configs are frozen: what start-up settles is a new config, beside the
:class:`~megatron_ext.config.derived.Derived` values."""

from __future__ import annotations

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

from ..checkpoint import loading
from ..checkpoint.layout import TrainState
from ..checkpoint.resume import resolve_checkpoint
from ..codes.schemes import FixedCode, build_code
from ..config.derived import Derived, derive
from ..config.run_config import RunConfig
from ..config.schedule import scheduler_steps
from ..config.training_config import TrainingConfig
from ..datasets.tokenizer import tokenizer_digest, tokenizer_from_args
from ..runtime.device_checks import check_cuda_connections, fp8_refusal
from ..runtime.device_checks import transformer_engine_imports, transformer_engine_version
from ..runtime.errors import DeviceError, FlagError
from ..runtime.log import log
from .compile_layers import compile_layers
from .fused_adam import fuse_torch_adam, torch_adam_fused


def check_machine_and_tokenizer(config: RunConfig, device: str) -> tuple:
    """The checks of the run's config that need this machine (``device``: ``cuda`` or
    ``cpu``), its world and what imports, and the tokenizer; the flags' own checks ran when
    they were parsed (:meth:`~megatron_ext.config.run_config.RunConfig.validate`). Returns
    ``(tokenizer, config, derived)``: the config settled for this machine (the device, the
    layers, sequence parallelism) and the values derived from the flags, the world and the
    tokenizer (:class:`~megatron_ext.config.derived.Derived`), each built once: what
    :func:`~megatron_ext.checkpoint.resume.resolve_checkpoint` takes next."""
    model, checkpoint, logging = config.model, config.checkpoint, config.logging
    parallel = config.parallel
    tokenizer = tokenizer_from_args(config.data)
    derived = derive(config, torch.distributed.get_world_size(), tokenizer.vocab_size,
                     tokenizer_digest(tokenizer))
    if (parallel.use_distributed_optimizer
            and checkpoint.dist_ckpt_optim_fully_reshardable
            and not distrib_optimizer.HAVE_APEX_OR_TE):
        raise FlagError("--dist-ckpt-optim-fully-reshardable: neither Transformer "
                        "Engine nor Apex imports, so the distributed optimizer runs torch's "
                        "Adam, whose state megatron-core 0.16.1 cannot load in that layout; "
                        "drop the flag (the default layout resumes) or pip install '.[gpu]'")
    transformer_impl, sequence_parallel = resolve_layers(config, device)
    logging.check_device(device)
    torch_adam_fused(parallel.torch_adam_fused, device)  # refuses what cannot apply
    model.check_vocab(derived.padded_vocab_size, tokenizer.vocab_size)
    settled = config.replace(device=device, transformer_impl=transformer_impl,
                             sequence_parallel=sequence_parallel)
    return tokenizer, settled, derived


def input_table_overrides(training: TrainingConfig) -> Optional[dict]:
    """Megatron-Core's optimizer overrides for the input table's parameters (``embedding.*``):
    its peak and final learning rates times ``--input-table-lr-mult``, its weight decay
    ``--input-table-weight-decay``; None (Megatron's default groups) when both are the
    recipe's. Megatron's standard override stays: no weight decay on biases and 1-D weights."""
    given = training.input_table_flags()
    if not given:
        return None
    overrides = get_standard_config_overrides(OptimizerConfig(lr=training.lr,
                                                              min_lr=training.min_lr))
    table = {}
    if "--input-table-lr-mult" in given:
        table.update(max_lr=training.lr * training.input_table_lr_mult,
                     min_lr=training.min_lr * training.input_table_lr_mult)
    if "--input-table-weight-decay" in given:
        table.update(start_wd=training.input_table_weight_decay,
                     end_wd=training.input_table_weight_decay)
    # named as the optimizer sees them: inside the DDP (and Float16Module) wrappers
    overrides[ParamKey(name=("embedding.*", "*.embedding.*"))] = ParamGroupOverride(**table)
    return overrides


def resolve_layers(config: RunConfig, device: str) -> tuple[str, bool]:
    """``(transformer_impl, sequence_parallel)``: the transformer layers, attention, FP8 and
    sequence parallelism for ``device``, settled by the rule the planner shares
    (:meth:`~megatron_ext.config.run_config.RunConfig.settle_layers`) with whether TE
    imports here: the GPU's default layers said in the log, sequence parallelism turned off
    at TP=1 with a warning; on a GPU, the checks of
    :mod:`megatron_ext.runtime.device_checks`."""
    model, parallel = config.model, config.parallel
    chosen = model.transformer_impl is None and device == "cuda"  # the GPU's default
    te = chosen and transformer_engine_imports()
    impl, sequence_parallel = config.settle_layers(device, te)
    if chosen:
        log(f"[fixedcode] --transformer-impl {impl} (the default on a GPU: "
            + ("Transformer Engine imports)" if te else
               "Transformer Engine does not import; pip install '.[gpu]' for it)"))
    if parallel.sequence_parallel and not sequence_parallel:
        log("[fixedcode] warning: --sequence-parallel turned off: it splits activations over "
            "tensor-parallel ranks, and --tensor-model-parallel-size is 1 (as in Megatron-LM)")
    if device == "cuda":
        capability = torch.cuda.get_device_capability()
        check_cuda_connections(parallel.tensor_model_parallel_size, sequence_parallel,
                               capability, os.environ)
        if model.fp8_format:
            refusal = fp8_refusal(model.fp8_recipe, capability, transformer_engine_version())
            if refusal:
                raise DeviceError(refusal)
    return impl, sequence_parallel


def build_model_and_optimizer(config: RunConfig, derived: Derived, model_provider: Callable,
                              code: Optional[FixedCode] = None):
    """``config``: the run's, settled at set-up; ``code``: the run's fixed code
    (:func:`~megatron_ext.checkpoint.resume.resolve_checkpoint`); omitted, the model provider
    draws one from the flags."""
    flags, parallel, training = config.model, config.parallel, config.training
    pre = parallel_state.is_pipeline_first_stage()
    post = parallel_state.is_pipeline_last_stage()
    model = model_provider(config, derived.padded_vocab_size, pre_process=pre,
                           post_process=post, code=code)
    if training.device == "cuda":
        model.cuda(torch.cuda.current_device())
    if flags.torch_compile_layers:
        layers = compile_layers(model, flags.torch_compile_backend)
        log(f"[fixedcode] torch.compile ({flags.torch_compile_backend}) of each transformer "
            f"layer: {layers} layers, compiled in the first step (--torch-compile-layers)")
    # As Megatron-LM: under --bf16/--fp16 every parameter (norms included, which the local
    # layers create in fp32) is cast to the training dtype, and so are the first stage's
    # float inputs; the last stage's output comes back in fp32. ``model`` stays the bare
    # GPTModel (checkpoints, metrics, norms); the wrapper shares its parameters.
    module = Float16Module(model.config, model) if flags.bf16 or flags.fp16 else model
    ddp = DistributedDataParallel(
        config=model.config,
        ddp_config=DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=parallel.overlap_grad_reduce,
            overlap_param_gather=parallel.overlap_param_gather,
            bucket_size=parallel.ddp_bucket_size,
            use_distributed_optimizer=parallel.use_distributed_optimizer),
        module=module)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=training.lr, min_lr=training.min_lr,
                        weight_decay=training.weight_decay, adam_beta1=training.adam_beta1,
                        adam_beta2=training.adam_beta2, adam_eps=training.adam_eps,
                        clip_grad=training.clip_grad, bf16=flags.bf16, fp16=flags.fp16,
                        log_num_zeros_in_grad=config.logging.log_num_zeros_in_grad,
                        params_dtype=model.config.params_dtype,
                        use_distributed_optimizer=parallel.use_distributed_optimizer),
        [ddp], config_overrides=input_table_overrides(training))
    if torch_adam_fused(parallel.torch_adam_fused, training.device) \
            and fuse_torch_adam(optimizer):
        log("[fixedcode] optimizer: torch's AdamW with its fused kernel (--torch-adam-fused)")
    steps = scheduler_steps(training.record(), training.train_samples, derived.train_iters,
                            derived.global_batch_size)
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=training.lr_warmup_init, max_lr=training.lr, min_lr=training.min_lr,
        lr_warmup_steps=steps.warmup, lr_decay_steps=steps.decay,
        lr_decay_style=training.lr_decay_style,
        start_wd=training.weight_decay, end_wd=training.weight_decay,
        wd_incr_steps=steps.wd_incr, wd_incr_style="constant",
        wsd_decay_steps=steps.wsd_decay, lr_wsd_decay_style=training.lr_wsd_decay_style,
        # The schedule was settled on resume (compatibility.reconcile_schedule): the
        # scheduler takes its own values, which are the flags' or the checkpoint's.
        use_checkpoint_opt_param_scheduler=False, override_opt_param_scheduler=True)
    model.config.finalize_model_grads_func = finalize_model_grads
    model.config.no_sync_func = ddp.no_sync
    if flags.fp16:
        model.config.grad_scale_func = optimizer.scale_loss
    return model, ddp, optimizer, scheduler


def save_initialised_model(config: RunConfig) -> str:
    """Build the model of the training config on the CPU, initialised as a run starts it
    (``--seed``), and save it alone to ``--save`` as iteration 0: what the converter reads
    (tools/convert_to_hf.py), made without a step, the optimizer's state or the memory they
    take (bench/bench_convert.py converts the 1.7B shape so). Training cannot resume it.
    Needs a process group of one rank; returns the checkpoint's path."""
    from ..checkpoint.saving import save_checkpoint
    from ..model.provider import model_provider
    from ..runtime.initialize import set_seed
    tokenizer = tokenizer_from_args(config.data)
    derived = derive(config, 1, tokenizer.vocab_size, tokenizer_digest(tokenizer))
    code = build_code(config.model, derived.padded_vocab_size)
    set_seed(config.training.seed)
    model = model_provider(config, derived.padded_vocab_size, on_cpu=True, code=code)
    return save_checkpoint(config, derived, model, None, None, TrainState(), code)


@dataclasses.dataclass
class TrainingSetup:
    """What the loop starts from: the run's config as set-up settled it (the machine's
    values, the checkpoint's schedule: what the rest of the run reads), the values derived
    from it, the tokenizer, the model (the bare GPTModel), its DDP wrapper, the optimizer and
    scheduler, the run's fixed code (None for the learned arm), the train state (resumed or
    fresh), and the checkpoint resumed (``resume_path`` and its common objects, None for a
    fresh run; ``own``: one of the run's own saves)."""
    config: RunConfig
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
    own: bool = False


def set_up(config: RunConfig, device: str, model_provider: Callable) -> TrainingSetup:
    """Check the config against the machine and the tokenizer, resolve the checkpoint, build
    the model and optimizer and load the checkpoint into them; the process group is already
    initialised."""
    tokenizer, config, derived = check_machine_and_tokenizer(config, device)
    resume = resolve_checkpoint(config, derived)
    config, flags = resume.config, resume.config.checkpoint
    model, ddp, optimizer, scheduler = build_model_and_optimizer(config, derived,
                                                                 model_provider, resume.code)
    state = TrainState()
    if resume.path:
        loading.load_checkpoint(resume.path, resume.common, model, optimizer, scheduler,
                                load_optim=not (flags.finetune or flags.no_load_optim),
                                load_rng=not (flags.finetune or flags.no_load_rng))
        if torch_adam_fused(config.parallel.torch_adam_fused, device):
            fuse_torch_adam(optimizer)  # the loaded parameter groups are the saved ones
        if flags.finetune:  # as Megatron-LM: iteration 0, consumed samples 0
            log(f"[fixedcode] --finetune: model weights from {resume.path}, iteration 0")
        else:
            state = TrainState.from_common(resume.common)
            log(f"[fixedcode] resumed from {resume.path} at iteration {state.iteration}")
    elif flags.load:
        log(f"[fixedcode] no checkpoint in {flags.load} yet: starting from scratch")
    return TrainingSetup(config, derived, tokenizer, model, ddp, optimizer, scheduler,
                         resume.code, state, resume.path, resume.common, resume.own)
