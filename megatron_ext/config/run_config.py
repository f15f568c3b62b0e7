"""What a run is told, as typed values: one frozen dataclass per concern, built from the parsed
flags by their names (the fields are Megatron-LM's flag names, as in its
``megatron/training/config/training_config.py``; argparse stays the front end, and
``--help`` lists every flag):

* :class:`ModelConfig`: the model and its input arm (the shape, precision, layers, fusions,
  activation recompute, the fixed code);
* :class:`ParallelConfig`: tensor, pipeline and data parallelism and the optimizer's
  sharding;
* :class:`TrainingConfig`: the schedule and the optimizer (batch, length, learning rate,
  AdamW), the seed and device, the step's guards and the garbage-collection policy;
* :class:`DataConfig`: the tokenizer and the data training reads;
* :class:`CheckpointConfig`: saving, loading, resuming and exiting;
* :class:`LoggingConfig`: validation, logging and profiling.

Each ``validate()`` holds every check of its flags that needs nothing but the flags;
:meth:`RunConfig.validate` runs them all, then the checks that join two concerns. They run
when the flags are parsed (``config.arguments.parse_training_args``), and for every run of a
study before any is started or submitted (``study.launch.check_runs``). A check that needs
the machine (the device, the world size, what imports), the tokenizer or the data is a
method named for what it needs (``check_vocab``, ``check_device``) or stays where that is
known (``train/setup.py``, ``datasets/``). Nothing here writes into the parsed flags. Its
place: beside ``arguments.py`` (the parser), below ``derived.py`` (values of the world)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Optional

from ..codes.limits import SCHEMES, check_options, check_vocab_fits
from ..runtime.errors import FlagError
from .flag_types import check_tokenizer_flags


def flag(name: str) -> str:
    """``--flag-name`` of a field ``flag_name``."""
    return "--" + name.replace("_", "-")


class FlagConfig:
    """A config built from the parsed flags by field name (lists become tuples: a config is
    frozen)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace):
        values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


@dataclasses.dataclass(frozen=True)
class ModelConfig(FlagConfig):
    """The model and its input arm. ``ffn_hidden_size`` and ``max_position_embeddings`` hold
    Megatron-LM's defaults where the flags leave them (filled when the flags are parsed,
    ``arguments.fill_dependent_defaults``)."""
    num_layers: Optional[int]
    hidden_size: Optional[int]
    kv_channels: Optional[int]
    ffn_hidden_size: Optional[int]
    num_attention_heads: Optional[int]
    num_query_groups: Optional[int]
    group_query_attention: bool
    seq_length: Optional[int]
    max_position_embeddings: Optional[int]
    position_embedding_type: str
    rotary_base: int
    normalization: str
    norm_epsilon: float
    swiglu: bool
    disable_bias_linear: bool
    untie_embeddings_and_output_weights: bool
    init_method_std: float
    hidden_dropout: float
    attention_dropout: float
    make_vocab_size_divisible_by: int
    bf16: bool
    fp16: bool
    transformer_impl: Optional[str]
    attention_backend: str
    fp32_residual_connection: bool
    fp8_format: Optional[str]
    fp8_recipe: str
    fp8_amax_history_len: int
    fp8_amax_compute_algo: str
    bias_swiglu_fusion: bool
    rope_fusion: bool
    masked_softmax_fusion: bool
    cross_entropy_loss_fusion: Optional[bool]
    cross_entropy_fusion_impl: str
    gradient_accumulation_fusion: bool
    torch_compile_layers: bool
    torch_compile_backend: str
    recompute_granularity: Optional[str]
    recompute_method: Optional[str]
    recompute_num_layers: Optional[int]
    input_interface: str
    input_table_rank: Optional[int]
    embedding_init_method_std: Optional[float]
    code_projection: bool
    code_bits: int
    code_values: str
    code_scale: float
    code_tiling: str
    code_seed: int
    fixed_code_impl: str

    def validate(self) -> None:
        """Refuse inconsistent model flags, naming them."""
        for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length"):
            if getattr(self, name) is None:
                raise FlagError(f"{flag(name)} is required (or use --preset)")
        if self.hidden_size % self.num_attention_heads:
            raise FlagError(f"--hidden-size {self.hidden_size} is not divisible by "
                            f"--num-attention-heads {self.num_attention_heads}")
        head = self.hidden_size // self.num_attention_heads
        if self.kv_channels not in (None, head):
            raise FlagError(f"--kv-channels {self.kv_channels}: the head width here is "
                            f"--hidden-size / --num-attention-heads = {head}; heads of another "
                            f"width are not built")
        if self.group_query_attention and self.num_query_groups is None:
            raise FlagError("--group-query-attention needs --num-query-groups")
        if self.bf16 and self.fp16:
            raise FlagError("--bf16 and --fp16 are exclusive")
        if self.recompute_granularity == "full":
            if self.recompute_method is None or self.recompute_num_layers is None:
                raise FlagError("--recompute-granularity full needs --recompute-method "
                                "{uniform,block} and --recompute-num-layers")
            if not 1 <= self.recompute_num_layers <= self.num_layers:
                raise FlagError(f"--recompute-num-layers {self.recompute_num_layers} is "
                                f"outside [1, --num-layers {self.num_layers}]")
        elif self.recompute_method is not None or self.recompute_num_layers is not None:
            raise FlagError("--recompute-method and --recompute-num-layers apply to "
                            "--recompute-granularity full only")
        self.validate_input()
        if not self.ffn_hidden_size:
            raise FlagError(f"--swiglu at --hidden-size {self.hidden_size}: the default MLP "
                            "width (2/3 x 4 x hidden size, a multiple of 64) is 0; give "
                            "--ffn-hidden-size")

    def validate_input(self) -> None:
        """The input flags that do not fit the arm ``--input-interface``, named (part of
        :meth:`validate`; tools/param_report.py checks each arm it counts with it)."""
        arm = self.input_interface
        if arm != "learned" and not self.untie_embeddings_and_output_weights:
            raise FlagError(
                f"--input-interface {arm} has no input table to tie to the output head"
                + (" (tied, the head would train it)" if arm == "frozen" else
                   " (V x r times r x h is no V x h head)" if arm == "factorized" else "")
                + "; drop --no-untie-embeddings-and-output-weights")
        if arm in SCHEMES:
            check_options(self.code_bits, self.code_scale, self.hidden_size)
            if self.code_projection and self.code_tiling != "repeat":
                raise FlagError(f"--code-projection maps the n-bit code to the width in place "
                                f"of the tiling: drop --code-tiling {self.code_tiling}")
            if self.embedding_init_method_std is not None:
                raise FlagError(f"--embedding-init-method-std: --input-interface {arm} has no "
                                f"input table")
        else:
            if self.code_tiling != "repeat":
                raise FlagError(f"--code-tiling {self.code_tiling} needs a fixed-code "
                                f"--input-interface, not {arm}")
            if self.code_projection:
                raise FlagError(f"--code-projection maps a fixed code to the width: it needs a "
                                f"fixed-code --input-interface ({', '.join(SCHEMES)}), not "
                                f"{arm}")
        if arm == "factorized":
            rank = self.input_table_rank
            if rank is None:
                raise FlagError("--input-interface factorized needs --input-table-rank")
            if not 1 <= rank <= self.hidden_size:
                raise FlagError(f"--input-table-rank {rank} is outside [1, --hidden-size "
                                f"{self.hidden_size}]: above the width, a factorised table "
                                f"holds nothing a full one does not")
        elif self.input_table_rank is not None:
            raise FlagError(f"--input-table-rank applies to --input-interface factorized only, "
                            f"not {arm}")
        if self.embedding_init_method_std is not None and self.embedding_init_method_std <= 0:
            raise FlagError(f"--embedding-init-method-std {self.embedding_init_method_std} "
                            f"must be positive")

    def check_vocab(self, padded_vocab: int, tokens: int) -> None:
        """The checks that need the tokenizer (``tokens`` ids, padded to ``padded_vocab``): a
        fixed code codes every id, a factorized table's rank is at most the vocabulary."""
        if self.input_interface in SCHEMES:
            check_vocab_fits(padded_vocab, self.code_bits, tokens)
        if self.input_interface == "factorized" and self.input_table_rank > padded_vocab:
            raise FlagError(f"--input-table-rank {self.input_table_rank} is above the padded "
                            f"vocabulary of {padded_vocab} tokens: a table of V rows has rank "
                            f"at most V")

    def arm_description(self) -> str:
        """The arm as the start-up line names it: ``binary arm``, or ``binary arm with a
        trainable 16 x 64 projection of the code (--code-projection)``."""
        return f"{self.input_interface} arm" + (
            f" with a trainable {self.code_bits} x {self.hidden_size} projection of the code "
            f"(--code-projection)" if self.code_projection else "")


@dataclasses.dataclass(frozen=True)
class ParallelConfig(FlagConfig):
    """Tensor, pipeline and data parallelism, and the optimizer's sharding over data-parallel
    ranks (the data-parallel size itself is the world's: ``derived.Derived``)."""
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    sequence_parallel: bool
    use_distributed_optimizer: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    torch_adam_fused: str
    ddp_bucket_size: Optional[int]

    def validate(self) -> None:
        if self.overlap_param_gather and not (self.use_distributed_optimizer
                                              and self.overlap_grad_reduce):
            raise FlagError("--overlap-param-gather needs --use-distributed-optimizer and "
                            "--overlap-grad-reduce, as in Megatron-LM")


@dataclasses.dataclass(frozen=True)
class TrainingConfig(FlagConfig):
    """The schedule and the optimizer: the batch and the run's length, the learning-rate
    schedule (in samples, as Megatron-LM counts it: ``schedule.py``), AdamW, the input
    table's own rate and decay; the seed and the device; the step's guards (non-finite
    steps, spiky losses) and the garbage-collection policy."""
    micro_batch_size: int
    global_batch_size: Optional[int]
    train_iters: Optional[int]
    train_samples: Optional[int]
    lr: float
    min_lr: float
    lr_warmup_iters: int
    lr_warmup_init: float
    lr_warmup_fraction: Optional[float]
    lr_warmup_samples: int
    lr_decay_iters: Optional[int]
    lr_decay_samples: Optional[int]
    rampup_batch_size: Optional[tuple]
    lr_decay_style: str
    lr_wsd_decay_iters: Optional[int]
    lr_wsd_decay_samples: Optional[int]
    lr_wsd_decay_style: str
    optimizer: str
    weight_decay: float
    input_table_lr_mult: float
    input_table_weight_decay: Optional[float]
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    clip_grad: float
    seed: int
    device: str
    manual_gc: bool
    manual_gc_interval: int
    manual_gc_eval: bool
    check_for_spiky_loss: bool
    spiky_loss_factor: float
    spiky_loss_samples: int
    spiky_loss_action: str
    max_nonfinite_steps: int

    def validate(self) -> None:
        """The run's length is given one way, and the schedule flags go together: the
        sample-based ones need ``--train-samples`` (as in Megatron-LM), a warm-up is given
        one way, and under a batch ramp the schedule is in samples."""
        if (self.train_iters is None) == (self.train_samples is None):
            raise FlagError("give exactly one of --train-iters and --train-samples")
        sample_flags = {"--lr-warmup-samples": self.lr_warmup_samples,
                        "--lr-decay-samples": self.lr_decay_samples,
                        "--lr-wsd-decay-samples": self.lr_wsd_decay_samples,
                        "--rampup-batch-size": self.rampup_batch_size}
        given = [name for name, value in sample_flags.items() if value]
        if self.train_iters is not None and given:
            raise FlagError(f"{', '.join(given)} count samples: use them with --train-samples, "
                            f"not --train-iters (as in Megatron-LM)")
        if self.lr_warmup_fraction is not None:
            if self.lr_warmup_iters or self.lr_warmup_samples:
                raise FlagError("give one of --lr-warmup-fraction, --lr-warmup-iters and "
                                "--lr-warmup-samples")
            if not 0 <= self.lr_warmup_fraction <= 1:
                raise FlagError(f"--lr-warmup-fraction {self.lr_warmup_fraction} is outside "
                                f"[0, 1]")
        if self.lr_warmup_iters and self.lr_warmup_samples:
            raise FlagError("give one of --lr-warmup-iters and --lr-warmup-samples")
        if self.lr_decay_iters is not None and self.lr_decay_samples is not None:
            raise FlagError("give one of --lr-decay-iters and --lr-decay-samples")
        if self.lr_wsd_decay_iters is not None and self.lr_wsd_decay_samples is not None:
            raise FlagError("give one of --lr-wsd-decay-iters and --lr-wsd-decay-samples")
        if self.rampup_batch_size:
            iteration_flags = [name for name, value in (
                ("--lr-warmup-iters", self.lr_warmup_iters),
                ("--lr-decay-iters", self.lr_decay_iters),
                ("--lr-wsd-decay-iters", self.lr_wsd_decay_iters)) if value]
            if iteration_flags:
                raise FlagError(f"{', '.join(iteration_flags)}: under --rampup-batch-size an "
                                f"iteration has no fixed size; give the schedule in samples "
                                f"(--lr-warmup-samples, --lr-decay-samples, "
                                f"--lr-warmup-fraction)")
        for name in ("input_table_lr_mult", "input_table_weight_decay"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise FlagError(f"{flag(name)} {value} is below 0")

    def input_table_flags(self) -> list[str]:
        """The input table's own optimizer flags given (not the recipe's rate and decay)."""
        return [name for name, value, default in (
            ("--input-table-lr-mult", self.input_table_lr_mult, 1.0),
            ("--input-table-weight-decay", self.input_table_weight_decay, None))
            if value != default]


@dataclasses.dataclass(frozen=True)
class DataConfig(FlagConfig):
    """The tokenizer and the data training reads (a blend and its split, or a blend per
    split, or mock data) and how it is read."""
    tokenizer_type: str
    tokenizer_model: Optional[str]
    vocab_file: Optional[str]
    merge_file: Optional[str]
    vocab_size: Optional[int]
    data_path: Optional[tuple]
    split: str
    train_data_path: Optional[tuple]
    valid_data_path: Optional[tuple]
    test_data_path: Optional[tuple]
    data_args_path: Optional[str]
    per_split_data_args_path: Optional[str]
    mock_data: bool
    eod_mask_loss: bool
    reset_position_ids: bool
    reset_attention_mask: bool
    data_cache_path: Optional[str]
    require_data_cache: bool
    max_data_epochs: Optional[float]
    num_workers: int

    def validate(self) -> None:
        """The tokenizer's flags, and the data given one way (the files themselves are read
        when the datasets are built: ``datasets/``)."""
        check_tokenizer_flags(self.tokenizer_type, self.tokenizer_model, self.vocab_size,
                              self.vocab_file, self.merge_file)
        if self.data_args_path and self.data_path:
            raise FlagError("give one of --data-path and --data-args-path")
        split_flags = [f"--{s}-data-path" for s in ("train", "valid", "test")
                       if getattr(self, f"{s}_data_path")]
        if self.per_split_data_args_path and split_flags:
            raise FlagError("give one of --train/valid/test-data-path and "
                            "--per-split-data-args-path")
        # the flag a blend came from, and the first of those a blend per split came from
        blend = ("--data-path" if self.data_path else
                 f"--data-args-path {self.data_args_path}" if self.data_args_path else None)
        per_split = (f"--per-split-data-args-path {self.per_split_data_args_path}"
                     if self.per_split_data_args_path else next(iter(split_flags), None))
        if self.mock_data and (blend or per_split):
            raise FlagError(f"give either {blend or per_split} or --mock-data, not both: "
                            f"--mock-data trains on synthetic tokens, and the data given "
                            f"would be ignored")
        if blend and per_split:
            raise FlagError("give either --data-path (with --split) or --train-data-path/"
                            "--valid-data-path/--test-data-path")
        if not (self.mock_data or blend or self.train_data_path
                or self.per_split_data_args_path):
            raise FlagError("give --data-path (indexed dataset prefixes), "
                            "--train-data-path, or --mock-data")
        if self.require_data_cache and (self.mock_data or not self.data_cache_path):
            raise FlagError("--require-data-cache needs --data-cache-path (the caches "
                            "tools/build_data_cache.py built) and indexed data, not --mock-data")


# The flags that apply to the checkpoint of --load only (derived.Resolved's fields).
LOAD_ONLY_FLAGS = ("finetune", "no_load_optim", "no_load_rng")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(FlagConfig):
    """Saving (where, when, which saves are kept), loading and resuming (what is loaded,
    which schedule continues), and exiting (signals, a wall-clock budget, an interval)."""
    save: Optional[str]
    save_interval: Optional[int]
    async_save: bool
    keep_last_checkpoints: Optional[int]
    keep_checkpoints_every: Optional[int]
    ckpt_format: str
    save_lease_timeout: int
    load: Optional[str]
    ckpt_step: Optional[int]
    use_checkpoint_args: bool
    no_load_optim: bool
    no_load_rng: bool
    finetune: bool
    override_opt_param_scheduler: bool
    use_checkpoint_opt_param_scheduler: bool
    dist_ckpt_optim_fully_reshardable: bool
    exit_signal_handler: bool
    exit_duration_in_mins: Optional[float]
    exit_interval: Optional[int]

    def validate(self) -> None:
        for name in LOAD_ONLY_FLAGS:
            if getattr(self, name) and not self.load:
                raise FlagError(f"{flag(name)} needs --load (the checkpoint it reads)")
        if self.ckpt_step is not None and not self.load:
            raise FlagError("--ckpt-step needs --load")
        for name in ("save_interval", "async_save", "keep_last_checkpoints"):
            if getattr(self, name) and not self.save:
                raise FlagError(f"{flag(name)} needs --save")
        if self.keep_checkpoints_every and not self.keep_last_checkpoints:
            raise FlagError("--keep-checkpoints-every applies with --keep-last-checkpoints "
                            "only (without it every save is kept)")
        if self.override_opt_param_scheduler and self.use_checkpoint_opt_param_scheduler:
            raise FlagError("--override-opt_param-scheduler and "
                            "--use-checkpoint-opt_param-scheduler are exclusive")


@dataclasses.dataclass(frozen=True)
class LoggingConfig(FlagConfig):
    """Validation, the log line and the metrics' sinks (metrics file, TensorBoard, wandb),
    and profiling."""
    eval_interval: int
    eval_iters: int
    log_interval: int
    tensorboard_dir: Optional[str]
    tensorboard_log_interval: int
    metrics_file: Optional[str]
    log_params_norm: bool
    log_num_zeros_in_grad: bool
    log_layer_norms: bool
    wandb_project: Optional[str]
    wandb_exp_name: Optional[str]
    wandb_entity: Optional[str]
    wandb_save_dir: Optional[str]
    profile: bool
    use_pytorch_profiler: bool
    profile_step_start: int
    profile_step_end: int
    profile_ranks: tuple

    def validate(self) -> None:
        if not self.profile:
            return
        if not 0 <= self.profile_step_start < self.profile_step_end:
            raise FlagError(f"--profile-step-start {self.profile_step_start} must be >= 0 "
                            f"and below --profile-step-end {self.profile_step_end}")
        if self.use_pytorch_profiler and not self.tensorboard_dir:
            raise FlagError("--use-pytorch-profiler writes its trace to --tensorboard-dir; "
                            "give one")

    def check_device(self, device: str) -> None:
        """The check that needs the run's device (``--device auto`` settled)."""
        if self.profile and not self.use_pytorch_profiler and device != "cuda":
            raise FlagError("--profile without --use-pytorch-profiler is for Nsight Systems "
                            "and needs a GPU; add --use-pytorch-profiler on CPU")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A training run's flags, one config per concern."""
    model: ModelConfig
    parallel: ParallelConfig
    training: TrainingConfig
    data: DataConfig
    checkpoint: CheckpointConfig
    logging: LoggingConfig

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "RunConfig":
        return cls(ModelConfig.from_args(args), ParallelConfig.from_args(args),
                   TrainingConfig.from_args(args), DataConfig.from_args(args),
                   CheckpointConfig.from_args(args), LoggingConfig.from_args(args))

    def validate(self) -> None:
        """Every check that needs only the flags: each concern's, then those that join two."""
        for field in dataclasses.fields(self):
            getattr(self, field.name).validate()
        model, parallel = self.model, self.parallel
        if self.logging.log_layer_norms and parallel.use_distributed_optimizer:
            raise FlagError("--log-layer-norms reads whole gradients, which "
                            "--use-distributed-optimizer scatters across ranks; drop one")
        custom = self.training.input_table_flags()
        if custom and model.code_projection:
            raise FlagError(f"{', '.join(custom)}: --input-interface {model.input_interface} "
                            f"has no input table: with --code-projection it trains a "
                            f"{model.code_bits} x {model.hidden_size} projection of its fixed "
                            f"code, at the schedule's learning rate and weight decay "
                            f"(learned and factorized train a table)")
        if custom and model.input_interface not in ("learned", "factorized"):
            raise FlagError(f"{', '.join(custom)}: --input-interface {model.input_interface} "
                            f"has no trained input table (learned and factorized have)")
        if custom and not model.untie_embeddings_and_output_weights:
            raise FlagError(f"{', '.join(custom)}: the input table is tied to the output head, "
                            f"which keeps the recipe's; drop "
                            f"--no-untie-embeddings-and-output-weights")
        if model.torch_compile_layers:
            self.check_compile_layers()

    def check_compile_layers(self) -> None:
        """``--torch-compile-layers`` is refused where a layer did not compile as one graph,
        tried on CPU with megatron-core 0.16.1 and torch 2.13 (the layers themselves, local
        ones only, are settled on the machine: ``train.setup.resolve_layers``)."""
        model = self.model
        why = {
            "--tensor-model-parallel-size > 1": self.parallel.tensor_model_parallel_size > 1
            and "megatron-core's tensor-parallel linears run collectives with async_op=True, "
                "which dynamo does not trace",
            "--recompute-granularity selective": model.recompute_granularity == "selective"
            and "megatron-core's checkpoint of core attention saves the RNG state inside the "
                "layer, which dynamo does not trace (full recompute compiles)",
            "--overlap-param-gather": self.parallel.overlap_param_gather and
            "the DDP's forward pre-hooks wait for async all-gathers inside each layer",
            f"--attention-backend {model.attention_backend}":
            model.attention_backend in ("unfused", "local") and
            "megatron-core's DotProductAttention did not trace on CPU (its scores' buffer "
            "comes from torch.cuda.current_device, redirected there) and was never compiled "
            "on a GPU; the SDPA backends (auto, flash) compile",
        }
        for name, reason in why.items():
            if reason:
                raise FlagError(f"--torch-compile-layers with {name}: {reason}; drop one")
