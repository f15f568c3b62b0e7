"""A run planned before it is queued, from its flags and the cluster alone (no GPU, no data):
memory per GPU (:mod:`megatron_ext.model.memory`, Megatron-LM's accounting), FLOPs per
iteration (:func:`megatron_ext.metrics.flops.flops_per_token`, the log's and the study's
count), time to the run's last iteration at a model FLOPs utilisation that was measured
(:data:`MEASURED_MFU`, bench/RESULTS.md) or is assumed (``--assume-mfu``), and GPU-hours, per run
and summed over the runs of a submission or a study. tools/plan.py prints it; tools/submit.py
and ``tools/study.py run --launcher slurm`` print it and refuse to submit a run that does not
fit the stated GPU memory (:func:`check_fits`).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Callable, Optional, Sequence

from ..config.arguments import add_training_args, parse_model_config
from ..config.derived import derive
from ..config.flag_fields import add_flags, flag
from ..config.run_config import RunConfig
from ..datasets.tokenizer import tokenizer_from_args
from ..metrics.flops import PEAK_TFLOPS, flops_per_token, peak_flops
from ..model.memory import GIB, TABLE_ARMS, Footprint, footprint, stage_parameters
from ..runtime.errors import FixedcodeError, FlagError, LaunchError
from .slurm import Layout

# The throughput measured on a GPU (bench/RESULTS.md, "GPU: the first runs"), as MFU: the log's
# count (Megatron-LM 0.16.1's FLOPs) over the dense bf16 peak.
MEASURED_RUN = ("2026-11-30, one H200, the 1.7B shape, local layers, unfused attention, bf16, "
                "8 x 2048 tokens per step; bench/RESULTS.md")
MEASURED_MFU = {"learned": 0.154, "binary": 0.157}


def measured_mfu(interface: str) -> float:
    """The measured MFU of an arm: its own, else learned's for a table arm, binary's for a
    fixed code."""
    if interface in MEASURED_MFU:
        return MEASURED_MFU[interface]
    return MEASURED_MFU["learned" if interface in TABLE_ARMS else "binary"]


@dataclasses.dataclass(frozen=True)
class Cluster(Layout):
    """Where the runs go: ``nodes`` x ``gpus_per_node`` GPUs (:class:`.slurm.Layout`'s
    flags: a job's layout, a plan's) named ``gpu`` (a name of
    :data:`~megatron_ext.metrics.flops.PEAK_TFLOPS`), each of ``memory_gib`` (None: not checked); ``mfu``: the utilisation assumed (None: the
    measured one). A value out of range is a :class:`FlagError` naming its flag."""
    FLAG_GROUP = "plan (memory per GPU, time, GPU-hours)"
    gpu: str = flag("H100", "GPU model whose dense bf16 peak the MFU is of: "
                    + ", ".join(name for name, _, _ in PEAK_TFLOPS) + " (default H100, SXM)")
    memory_gib: Optional[float] = flag(
        None, "memory of one GPU in GiB (80 for an 80 GB H100): a run whose planned memory "
              "per GPU exceeds it is refused before it is queued", names=("--gpu-memory",),
        metavar="GIB")
    mfu: Optional[float] = flag(
        None, "time the runs at this model FLOPs utilisation (0 < MFU <= 1) besides the "
              "measured one (bench/RESULTS.md)", names=("--assume-mfu",))

    def __post_init__(self):
        if self.memory_gib is not None and not 0 < self.memory_gib <= 4096:
            raise FlagError(f"--gpu-memory {self.memory_gib:g}: a GPU's memory in GiB, above 0 "
                            f"and at most 4096")
        if self.mfu is not None and not 0 < self.mfu <= 1:
            raise FlagError(f"--assume-mfu {self.mfu:g}: a utilisation, above 0 and at most "
                            f"1 (0.4 is 40%)")
        if peak_flops(self.gpu, False) is None:
            raise FlagError(f"--gpu {self.gpu}: no bf16 peak known; one of "
                            + ", ".join(name for name, _, _ in PEAK_TFLOPS))
        for name, value in (("--nodes", self.nodes), ("--gpus-per-node", self.gpus_per_node)):
            if value < 1:
                raise FlagError(f"{name} {value}: a plan needs at least one")

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    def check_world(self, config: RunConfig) -> None:
        """The layout rule that needs the world (``ParallelConfig.check_world``), for this
        cluster's GPUs."""
        config.parallel.check_world(self.world, f"--nodes {self.nodes} x --gpus-per-node "
                                                f"{self.gpus_per_node} = {self.world} GPUs")


def add_plan_args(parser: argparse.ArgumentParser) -> None:
    """The flags of a plan besides the layout (shared by plan.py, submit.py, study.py)."""
    add_flags(parser.add_argument_group(Cluster.FLAG_GROUP), Cluster, title=Cluster.FLAG_GROUP)


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """One run: its name (an arm, a study's cell and arm), layout, memory per GPU on the
    most loaded stage, FLOPs, iterations, and how long they take on the cluster."""
    name: str
    interface: str
    layout: str  # "TP t, PP p, DP d, m micro-batches"
    parameters: int  # the trained parameters of the whole model
    footprint: Footprint
    flops_per_iteration: float
    iterations: int
    tokens: int
    gpus: int
    peak: float  # FLOP/s of one GPU (dense bf16)
    count: int = 1  # runs alike (a study's seeds)

    def seconds(self, mfu: float) -> float:
        return self.flops_per_iteration * self.iterations / (mfu * self.peak * self.gpus)

    def gpu_hours(self, mfu: float) -> float:
        return self.seconds(mfu) * self.gpus / 3600


def run_config(flags: Sequence[str]) -> RunConfig:
    """A run's flags as training parses them, the model's checked (argparse's own refusals
    exit, as training's do)."""
    return parse_model_config(list(flags), "plan", add_training_args)[0]


def readable_vocab_size(flags: Sequence[str]) -> Optional[int]:
    """The vocabulary size of the tokenizer ``flags`` name, or None where it cannot be read
    here (a login node without the tokenizer's files)."""
    try:
        return vocab_size_of(run_config(flags))
    except FlagError:
        return None


def vocab_size_of(config: RunConfig, given: Optional[int] = None) -> int:
    """The tokenizer's vocabulary size: ``given``, else read from the run's tokenizer (a
    ``FlagError`` naming ``--vocab-size`` where it cannot be read here)."""
    if given is not None:
        if given < 1:
            raise FlagError(f"--vocab-size {given}: at least 1")
        return given
    data = config.data
    try:
        return tokenizer_from_args(data).vocab_size
    except (FixedcodeError, OSError, ValueError) as e:
        raise FlagError(f"the plan needs the vocabulary: the tokenizer "
                        f"({data.tokenizer_type} {data.tokenizer_model}) cannot be read here "
                        f"({e}); give --vocab-size") from e


def gpu_layers(config: RunConfig) -> tuple[str, bool]:
    """``(transformer_impl, sequence_parallel)`` of the run of ``config`` on a GPU where
    Transformer Engine imports (the image's), settled by the run's rule
    (:meth:`~megatron_ext.config.run_config.RunConfig.settle_layers`), refused as the run
    refuses them."""
    return config.settle_layers("cuda", te_imports=True)


def plan_run(name: str, flags: Sequence[str], cluster: Cluster,
             vocab_size: Optional[int] = None, iterations: Optional[int] = None,
             count: int = 1) -> RunPlan:
    """The plan of the run of training ``flags`` on ``cluster``; ``iterations``: those it
    trains (default all: a study's branch trains from its branch point). Its layout is
    refused as the run refuses it (``RunConfig.check_layout``, ``ParallelConfig.
    check_world``)."""
    config = run_config(flags)
    cluster.check_world(config)
    config.check_layout()
    vocab = vocab_size_of(config, vocab_size)
    try:
        derived = derive(config, cluster.world, vocab)
    except FlagError as e:
        raise FlagError(f"{e} (data-parallel size from --nodes {cluster.nodes} x "
                        f"--gpus-per-node {cluster.gpus_per_node})") from e
    model, parallel = config.model, config.parallel
    impl, sequence_parallel = gpu_layers(config)
    applied = config.replace(transformer_impl=impl, sequence_parallel=sequence_parallel)
    padded = derived.padded_vocab_size
    whole = applied.replace(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    tokens_per_iteration = derived.global_batch_size * model.seq_length
    return RunPlan(
        name=name, interface=model.input_interface,
        layout=(f"TP {parallel.tensor_model_parallel_size}, PP "
                f"{parallel.pipeline_model_parallel_size}, DP {derived.data_parallel_size}, "
                f"{derived.num_microbatches} micro-batches"),
        parameters=stage_parameters(whole, padded, 0).trained,
        footprint=footprint(applied, padded, derived.data_parallel_size,
                            derived.num_microbatches),
        flops_per_iteration=flops_per_token(model, padded) * tokens_per_iteration,
        iterations=derived.train_iters if iterations is None else iterations,
        tokens=tokens_per_iteration, gpus=cluster.world,
        peak=peak_flops(cluster.gpu, False), count=count)


def plan_arms(recipe: Sequence[str], arms: Sequence[tuple[str, list]], cluster: Cluster,
              vocab_size: Optional[int] = None) -> list[RunPlan]:
    """The plans of a recipe's arms, ``(name, training flags)`` each."""
    return [plan_run(name, [*recipe, *flags], cluster, vocab_size) for name, flags in arms]


def plan_submission(recipe: Sequence[str], plan: Callable[[int], list], cluster: Cluster
                    ) -> tuple[list, str]:
    """``(plans, their table)`` for a submission of runs of ``recipe`` (``plan(vocabulary
    size)`` makes them). Where the recipe's tokenizer cannot be read here: no plans and a
    line saying so, or, where ``--gpu-memory`` asks for the check, a :class:`FlagError`."""
    vocab = readable_vocab_size(recipe)
    if vocab is None:
        why = ("the recipe's tokenizer cannot be read here (tools/plan.py --vocab-size plans "
               "without it)")
        if cluster.memory_gib is not None:
            raise FlagError(f"--gpu-memory {cluster.memory_gib:g}: no plan to check, {why}")
        return [], f"# plan: none, {why}"
    plans = plan(vocab)
    return plans, plan_table(plans, cluster)


def check_fits(plans: Sequence[RunPlan], cluster: Cluster) -> None:
    """Refuse (:class:`LaunchError`) the runs whose memory per GPU exceeds the stated
    memory, each with its largest term and the lever that shrinks it."""
    if cluster.memory_gib is None:
        return
    problems = []
    for plan in plans:
        fp = plan.footprint
        if fp.total <= cluster.memory_gib * GIB:
            continue
        largest = fp.largest()
        lever = {
            "activations": "--recompute-granularity selective or full, a smaller "
                           "--micro-batch-size, or more --tensor-model-parallel-size with "
                           "--sequence-parallel",
            "optimizer state": "--use-distributed-optimizer (shards it over the data-parallel "
                               "ranks), or more --tensor-model-parallel-size / "
                               "--pipeline-model-parallel-size",
        }.get(largest, "more --tensor-model-parallel-size or --pipeline-model-parallel-size")
        size = getattr(fp, "optimizer" if largest == "optimizer state" else largest)
        problems.append(f"{plan.name} ({plan.layout}) needs {fp.total / GIB:.1f} GiB per GPU, "
                        f"above --gpu-memory {cluster.memory_gib:g}: its largest term is "
                        f"{largest}, {size / GIB:.1f} GiB; lever: {lever}")
    if problems:
        raise LaunchError("does not fit the GPU memory, nothing submitted:\n  "
                          + "\n  ".join(problems))


def _days(seconds: float) -> str:
    return f"{seconds / 86400:.2f}"


def plan_table(plans: Sequence[RunPlan], cluster: Cluster) -> str:
    """The plan as markdown: per run, memory per GPU and its terms, Megatron-LM's start-up
    line, FLOPs, and days and GPU-hours at the measured MFU (and at ``--assume-mfu``); the
    total over the runs."""
    memory = f" (of {cluster.memory_gib:g})" if cluster.memory_gib else ""
    assumed = cluster.mfu
    header = ["run", "runs", "layout", "trained params", "weights GiB", "gradients GiB",
              "optimizer GiB", "activations GiB", f"total GiB{memory}",
              "TFLOP / iteration", "iterations", "measured MFU", "days at it",
              "GPU-hours at it"]
    if assumed:
        header += [f"days at {assumed:.0%}", f"GPU-hours at {assumed:.0%}"]
    lines = [f"# plan: {cluster.world} x {cluster.gpu} ({cluster.nodes} node(s) x "
             f"{cluster.gpus_per_node}); memory per GPU on the most loaded pipeline stage",
             "| " + " | ".join(header) + " |", "|---|---:|---|" + "---:|" * (len(header) - 3)]
    totals = {"measured": 0.0, "assumed": 0.0}
    for plan in plans:
        fp = plan.footprint
        mfu = measured_mfu(plan.interface)
        row = [plan.name, str(plan.count), plan.layout, f"{plan.parameters:,}",
               f"{fp.weights / GIB:.2f}", f"{fp.gradients / GIB:.2f}",
               f"{fp.optimizer / GIB:.2f}", f"{fp.activations / GIB:.2f}",
               f"{fp.total / GIB:.2f}", f"{plan.flops_per_iteration / 1e12:,.0f}",
               f"{plan.iterations:,}", f"{mfu:.1%}", _days(plan.seconds(mfu)),
               f"{plan.gpu_hours(mfu):,.0f}"]
        totals["measured"] += plan.count * plan.gpu_hours(mfu)
        if assumed:
            row += [_days(plan.seconds(assumed)), f"{plan.gpu_hours(assumed):,.0f}"]
            totals["assumed"] += plan.count * plan.gpu_hours(assumed)
        lines.append("| " + " | ".join(row) + " |")
    runs = sum(plan.count for plan in plans)
    lines.append(f"total: {runs} run(s), {totals['measured']:,.0f} GPU-hours at the measured "
                 f"MFU" + (f", {totals['assumed']:,.0f} at {assumed:.0%}" if assumed else ""))
    lines.append(f"measured MFU: {MEASURED_RUN}: "
                 + ", ".join(f"{arm} {mfu:.1%}" for arm, mfu in MEASURED_MFU.items())
                 + " (the other table arms take learned's, the other codes binary's); MFU is "
                 f"of the dense bf16 peak, {peak_flops(cluster.gpu, False) / 1e12:g} TFLOP/s "
                 f"for {cluster.gpu}")
    alike = {}  # Megatron-LM's line -> the runs it is of
    for plan in plans:
        alike.setdefault(plan.footprint.megatron_line(), []).append(plan.name)
    for line, names in alike.items():
        more = f" (and {len(names) - 1} more alike)" if len(names) > 1 else ""
        lines.append(f"[{names[0]}{more}] {line}")
    return "\n".join(lines)

