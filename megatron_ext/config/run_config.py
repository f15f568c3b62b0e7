"""What a run is told, as typed values: :class:`RunConfig`, one frozen config per concern, each
field declaring its flag (``flag_fields.py``; Megatron-LM's names, as its
``megatron/training/config/training_config.py`` has them), the parser made from them:

* :class:`~.model_config.ModelConfig`: the model and its input arm;
* :class:`~.parallel_config.ParallelConfig`: tensor, pipeline and data parallelism;
* :class:`~.training_config.TrainingConfig`: the schedule and the optimizer, the seed and
  device, the step's guards and the garbage-collection policy;
* :class:`~.data_config.DataConfig`: the tokenizer and the data;
* :class:`~.checkpoint_config.CheckpointConfig`: saving, loading, resuming and exiting;
* :class:`~.logging_config.LoggingConfig`: validation, logging and profiling.

A run's config is built once from the parsed flags (:meth:`RunConfig.from_flags`, in
``arguments.py``) and checked there by :meth:`RunConfig.validate`: every check that needs
nothing but the flags, each concern's and those joining two (the layout rules among them).
Set-up then settles it for the machine and the checkpoint (``train/setup.py``,
``checkpoint/resume.py``) into the config the rest of the run reads; a check that needs the
machine, the tokenizer, the data or a checkpoint is named for what it needs
(``check_vocab``, ``check_device``, ``check_world``) or stays where that is known. A
checkpoint stores the config as its ``args`` record (:meth:`RunConfig.record`) and a reader
builds it back (:meth:`RunConfig.from_record`). What a resume does with each flag, its fields
declare (``flag_fields.flag``); :func:`fields_where` gives the flags of a declaration, for
``checkpoint/`` and ``study/`` to build their sets from."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Optional

from ..runtime.errors import FlagError
from .checkpoint_config import CheckpointConfig
from .data_config import DataConfig
from .logging_config import LoggingConfig
from .model_config import ModelConfig, attention_backend_refusal, document_mask_refusal
from .parallel_config import ParallelConfig
from .training_config import TrainingConfig

CONCERNS = (ModelConfig, ParallelConfig, TrainingConfig, DataConfig, CheckpointConfig,
            LoggingConfig)


def fields_where(**facts) -> list[tuple[type, dataclasses.Field]]:
    """``(concern, field)`` of each flag of a run (every concern's, in :class:`RunConfig`'s
    order) whose declared facts (``flag_fields.flag``'s ``resume``, ``checkpoint_args``,
    ``added``, ``study``) are ``facts``: ``fields_where(resume="model")``, the flags a
    resume refuses to change. The one place the resume's, ``--use-checkpoint-args``'s and
    the study's sets of flags come from."""
    return [(concern, field) for concern in CONCERNS for field in concern.flag_fields()
            if all(field.metadata[fact] == value for fact, value in facts.items())]


def declared_defaults(*names: str) -> dict:
    """The declared defaults of the flags ``names`` (field names)."""
    defaults = RunConfig().record()
    return {name: defaults[name] for name in names}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A training run's flags, one config per concern."""
    model: ModelConfig = ModelConfig()
    parallel: ParallelConfig = ParallelConfig()
    training: TrainingConfig = TrainingConfig()
    data: DataConfig = DataConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()

    @classmethod
    def from_flags(cls, flags: argparse.Namespace) -> "RunConfig":
        """The config of the parsed flags: the one place a Namespace becomes the run's
        config (a flag the parser did not have keeps its declared default)."""
        return cls.from_record(vars(flags))

    @classmethod
    def from_record(cls, record: dict) -> "RunConfig":
        """The config of a record of flags by name (a checkpoint's saved ``args``)."""
        return cls(*(concern.from_record(record) for concern in CONCERNS))

    def record(self) -> dict:
        """Every flag by name, as a checkpoint and a tracker store them (lists as argparse
        gives them)."""
        return {k: v for field in dataclasses.fields(self)
                for k, v in getattr(self, field.name).record().items()}

    def replace(self, **changes) -> "RunConfig":
        """A copy with flags changed by name, each in its concern (``seq_length=...``)."""
        concerns = {}
        for field in dataclasses.fields(self):
            concern = getattr(self, field.name)
            own = {k: v for k, v in changes.items()
                   if k in {f.name for f in dataclasses.fields(concern)}}
            concerns[field.name] = concern.replace(**own) if own else concern
        unknown = set(changes) - {k for c in concerns.values() for k in c.record()}
        if unknown:
            raise TypeError(f"no such flags: {sorted(unknown)}")
        return RunConfig(**concerns)

    def with_dependent_defaults(self) -> "RunConfig":
        """The model's defaults that depend on other flags filled in
        (:meth:`ModelConfig.with_dependent_defaults`)."""
        return dataclasses.replace(self, model=self.model.with_dependent_defaults())

    def validate(self) -> None:
        """Every check that needs only the flags: each concern's, then those that join two."""
        for field in dataclasses.fields(self):
            getattr(self, field.name).validate()
        model, parallel = self.model, self.parallel
        self.check_layout()
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
        if model.transformer_impl is not None:
            self.check_layers(model.transformer_impl)

    def settle_layers(self, device: str, te_imports: bool) -> tuple[str, bool]:
        """``(transformer_impl, sequence_parallel)`` of a run on ``device`` (``cuda``,
        ``cpu``), as Megatron-LM settles them (megatron/training/arguments.py): the run's
        rule at start-up (``train.setup.resolve_layers``) and the planner's
        (``launch.plan``). ``--transformer-impl`` left out: Transformer Engine layers on a
        GPU where TE imports (``te_imports``), local ones otherwise; TE's asked for on a CPU
        refused; sequence parallelism off at TP 1; then what these layers cannot run
        refused (:meth:`check_layers`)."""
        model, parallel = self.model, self.parallel
        impl = model.transformer_impl
        if impl is None:
            impl = "transformer_engine" if device == "cuda" and te_imports else "local"
        elif impl == "transformer_engine" and device == "cpu":
            raise FlagError("--transformer-impl transformer_engine needs a GPU (Transformer "
                            "Engine's layers run on CUDA only); use --transformer-impl local")
        self.check_layers(impl, device)
        return impl, parallel.sequence_parallel and parallel.tensor_model_parallel_size > 1

    def check_layers(self, impl: str, device: Optional[str] = None) -> None:
        """What the transformer layers ``impl`` cannot run with these flags, refused naming
        them: when the flags are parsed where ``--transformer-impl`` is given, at start-up
        for the layers the machine settles (``train.setup.resolve_layers``, with its
        ``device``: the rules of the document mask that need it)."""
        model = self.model
        if impl == "transformer_engine" and model.fp32_residual_connection:
            raise FlagError(
                "--fp32-residual-connection with --transformer-impl transformer_engine"
                + (" (the default on a GPU where TE imports)" if model.transformer_impl is None
                   else "") + ": TE's fused norm + linear takes the layer's dtype and would "
                "receive the fp32 stream; use --transformer-impl local, or drop "
                "--fp32-residual-connection")
        if model.torch_compile_layers and impl != "local":
            raise FlagError("--torch-compile-layers compiles the local layers (Transformer "
                            "Engine's bring their own fused kernels and were never compiled "
                            "here): add --transformer-impl local")
        if model.fp8_format and impl != "transformer_engine":
            raise FlagError("--fp8-format needs --transformer-impl transformer_engine "
                            "(Transformer Engine layers, on a GPU)")
        refusal = attention_backend_refusal(impl, model.attention_backend)
        if refusal is None and self.data.reset_attention_mask:
            refusal = document_mask_refusal(impl, model.attention_backend, device,
                                            model.masked_softmax_fusion,
                                            self.parallel.pipeline_model_parallel_size)
        if refusal:
            raise FlagError(refusal)

    def check_layout(self) -> None:
        """The model's sizes the parallel sizes must divide (the run's and the planner's
        rule: :meth:`ParallelConfig.check_model`)."""
        model = self.model
        self.parallel.check_model(model.num_layers, model.num_attention_heads,
                                  model.num_query_groups, model.ffn_hidden_size)

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
