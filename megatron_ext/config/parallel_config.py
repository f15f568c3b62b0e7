"""Tensor, pipeline and data parallelism as flags: :class:`ParallelConfig`, and the layout
rules, once: what the parallel sizes must divide in the model (:meth:`ParallelConfig.
check_model`, a flag-only check, run when the flags are parsed and by the planner) and in the
world (:meth:`ParallelConfig.check_world`, which needs the world: at start-up, and in a plan
from its nodes)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..runtime.errors import FlagError
from .flag_fields import FlagConfig, flag


@dataclasses.dataclass(frozen=True)
class ParallelConfig(FlagConfig):
    """Tensor, pipeline and data parallelism, and the optimizer's sharding over data-parallel
    ranks (the data-parallel size itself is the world's: ``derived.Derived``)."""
    FLAG_GROUP = "parallelism"
    tensor_model_parallel_size: int = flag(1, "tensor-parallel ranks per model replica",
                                           resume="free")
    pipeline_model_parallel_size: int = flag(1, "pipeline stages", resume="free")
    sequence_parallel: bool = flag(
        False, "split the norms and dropout along the sequence over tensor-parallel ranks "
               "(GPU, TE layers)", resume="free")
    use_distributed_optimizer: bool = flag(
        False, "shard the optimizer state over data-parallel ranks (GPU)", resume="free")
    overlap_grad_reduce: bool = flag(
        False, "reduce gradients bucket by bucket during the backward pass", resume="free")
    overlap_param_gather: bool = flag(
        False, "--use-distributed-optimizer: gather the updated parameters bucket by bucket "
               "during the next forward pass (needs --overlap-grad-reduce)", resume="free")
    torch_adam_fused: str = flag(
        "auto", "where neither Transformer Engine nor Apex supplies a FusedAdam, "
                "megatron-core's optimizer is torch's AdamW: run its fused kernel (auto: on a "
                "GPU; on: also on CPU; off: torch's for-each update)",
        choices=("auto", "on", "off"), resume="free")
    ddp_bucket_size: Optional[int] = flag(
        None, "--overlap-grad-reduce: parameters per gradient bucket (default max(40M, 1M x "
              "DP size)); without it one bucket, as in megatron-core", resume="free")

    def validate(self) -> None:
        if self.overlap_param_gather and not (self.use_distributed_optimizer
                                              and self.overlap_grad_reduce):
            raise FlagError("--overlap-param-gather needs --use-distributed-optimizer and "
                            "--overlap-grad-reduce, as in Megatron-LM")

    @property
    def model_parallel_size(self) -> int:
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    def check_model(self, num_layers: int, num_attention_heads: int,
                    num_query_groups: Optional[int], ffn_hidden_size: int) -> None:
        """The model's sizes the parallel sizes must divide: layers by the pipeline stages,
        heads, query groups and MLP width by the tensor-parallel size."""
        t, p = self.tensor_model_parallel_size, self.pipeline_model_parallel_size
        if num_layers % p:
            raise FlagError(f"--pipeline-model-parallel-size {p} does not divide --num-layers "
                            f"{num_layers}")
        for name, value in (("--num-attention-heads", num_attention_heads),
                            ("--num-query-groups", num_query_groups),
                            ("--ffn-hidden-size", ffn_hidden_size)):
            if value is not None and value % t:
                raise FlagError(f"--tensor-model-parallel-size {t} does not divide {name} "
                                f"{value}")

    def check_world(self, world: int, named: str) -> None:
        """The check that needs the world: ``world`` ranks (``named`` as the message says
        where the number comes from) are whole model replicas."""
        if world % self.model_parallel_size:
            raise FlagError(f"{named} is not a multiple of --tensor-model-parallel-size "
                            f"{self.tensor_model_parallel_size} x "
                            f"--pipeline-model-parallel-size "
                            f"{self.pipeline_model_parallel_size}")
