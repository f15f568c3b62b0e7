"""Memory per GPU of a training run, from its flags alone: the bytes of weights, gradients and
optimizer state, and of activations, on the most loaded pipeline stage, as Megatron-LM's
``report_theoretical_memory`` (megatron/training/theoretical_memory_usage.py) accounts them
and prints them at start-up (:meth:`Footprint.megatron_line`). The plan of a run
(:mod:`megatron_ext.launch.plan`) and the training log's start-up line read it; no torch is
imported.

**Weights, gradients, optimizer state** (:func:`state_bytes`): the parameters one rank holds
(its pipeline stage's layers, its tensor-parallel shard, the replicated norms whole), counted
per arm (no input table for a fixed code; the frozen table has weights only), times the bytes
the training loop keeps per parameter: weights 2 under ``--bf16``/``--fp16`` (4 in fp32),
gradients 4 (Megatron DDP reduces in fp32, megatron_ext/train/setup.py), Adam's fp32 master
copy (16-bit weights only) and two moments: 12 or 8, divided over the data-parallel ranks
under ``--use-distributed-optimizer``. That is Megatron-LM's 18 (or 6 + 12/DP) bytes per
parameter under bf16. Tests check the counts against a built model's tensors.

**Activations** (:func:`activation_bytes`): the tensors the forward pass keeps for the
backward pass, Korthikanti et al.'s accounting (arXiv:2205.05198, Table 2) that Megatron-LM's
report uses, written out tensor by tensor for the layers this package builds, with what
Megatron-LM's formula leaves out: SwiGLU's wider MLP, grouped-query attention, the s x s
probabilities of unfused attention (``--attention-backend unfused``/``local``), fp32
activations without ``--bf16``/``--fp16``, ``--recompute-granularity full`` (and selective),
dropout masks only where dropout is on, and the norms as each device computes them (fused
kernels keep their input; torch's CPU norms keep two fp32 copies). Per micro-batch in flight:
on stage i of a 1F1B pipeline min(PP - i, micro-batches); ``--sequence-parallel`` splits the
tensors tensor-parallel ranks would otherwise replicate. The peak adds the logits' transient
copy in the training dtype. FP8 is counted as bf16 (an upper bound). Tests measure the peak
of a CPU training step's tensors against it (tests/integration/test_memory_plan.py).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..config.run_config import RunConfig

MB = 2 ** 20  # Megatron-LM's NUM_BYTES_IN_MEGABYTE
GIB = 2 ** 30
TABLE_ARMS = ("learned", "frozen", "factorized")


@dataclasses.dataclass(frozen=True)
class Parameters:
    """Parameters one rank of a pipeline stage holds: trained, and frozen (the frozen arm's
    table: weights only)."""
    trained: int
    frozen: int = 0


def _shape(config: RunConfig) -> tuple:
    model = config.model
    h, a = model.hidden_size, model.num_attention_heads
    return h, a, model.num_query_groups or a, h // a, model.ffn_hidden_size


def layer_parameters(config: RunConfig) -> int:
    """One transformer layer's parameters on one tensor-parallel rank."""
    model, parallel = config.model, config.parallel
    h, a, g, d, f = _shape(config)
    t = parallel.tensor_model_parallel_size
    bias = not model.disable_bias_linear
    norm = h * (2 if model.normalization == "LayerNorm" else 1)  # replicated on every rank
    qkv = (a + 2 * g) * d * (h + bias) // t  # column-parallel: weight and bias split
    proj = a * d * h // t + bias * h  # row-parallel: its bias replicated
    fc1_out = f * (2 if model.swiglu else 1)
    fc1 = fc1_out * (h + bias) // t
    fc2 = f * h // t + bias * h
    return 2 * norm + qkv + proj + fc1 + fc2


def input_parameters(config: RunConfig, padded_vocab: int) -> Parameters:
    """The input layer's parameters on one tensor-parallel rank of the first stage."""
    model, parallel = config.model, config.parallel
    arm, h, t = model.input_interface, model.hidden_size, parallel.tensor_model_parallel_size
    table = padded_vocab * h // t  # vocabulary-parallel
    if arm == "learned":
        return Parameters(table)
    if arm == "frozen":
        return Parameters(0, table)
    if arm == "factorized":
        return Parameters(padded_vocab * model.input_table_rank // t + h * model.input_table_rank)
    return Parameters(model.code_bits * h if model.code_projection else 0)


def stage_parameters(config: RunConfig, padded_vocab: int, stage: int) -> Parameters:
    """What one rank of pipeline stage ``stage`` holds: its layers, the input layer on the
    first stage, the final norm and the output head on the last (a head tied to the table
    is the first stage's table; a last stage of its own holds a copy)."""
    model, parallel = config.model, config.parallel
    p = parallel.pipeline_model_parallel_size
    h, t = model.hidden_size, parallel.tensor_model_parallel_size
    trained = model.num_layers // p * layer_parameters(config)
    frozen = 0
    if stage == 0:
        first = input_parameters(config, padded_vocab)
        trained, frozen = trained + first.trained, first.frozen
    if stage == p - 1:
        trained += h * (2 if model.normalization == "LayerNorm" else 1)
        if model.untie_embeddings_and_output_weights or p > 1:
            trained += padded_vocab * h // t
    return Parameters(trained, frozen)


def dtype_bytes(config: RunConfig) -> int:
    """Bytes of a weight or an activation in the training dtype (FP8 counted as bf16)."""
    model = config.model
    return 2 if model.bf16 or model.fp16 else 4


def state_bytes(config: RunConfig, padded_vocab: int, data_parallel: int,
                stage: int) -> dict:
    """``{"weights", "gradients", "optimizer"}``: bytes one rank of ``stage`` holds."""
    parallel = config.parallel
    n = stage_parameters(config, padded_vocab, stage)
    weight = dtype_bytes(config)
    # Adam's two fp32 moments, and an fp32 master copy of 16-bit weights
    optimizer = 8 + (4 if weight == 2 else 0)
    shards = data_parallel if parallel.use_distributed_optimizer else 1
    return {"weights": (n.trained + n.frozen) * weight, "gradients": n.trained * 4,
            "optimizer": n.trained * optimizer / shards}


def _replicated(config: RunConfig) -> float:
    """The share of a tensor that tensor-parallel ranks would replicate one rank keeps:
    ``--sequence-parallel`` splits it."""
    parallel = config.parallel
    t = parallel.tensor_model_parallel_size
    return 1 / t if parallel.sequence_parallel and t > 1 else 1


def norm_bytes(config: RunConfig, device: str) -> float:
    """What a norm keeps, per micro-batch: its input (the fp32 stream under
    ``--fp32-residual-connection``) and its statistics; torch's RMSNorm on a CPU (a
    composite of operators) keeps two fp32 tensors, the input and the normalised input."""
    model, training = config.model, config.training
    tokens = model.seq_length * training.micro_batch_size
    stream = 4 if model.fp32_residual_connection else dtype_bytes(config)
    composite = (device == "cpu" and model.transformer_impl != "transformer_engine"
                 and model.normalization == "RMSNorm")
    per_token = 8 * model.hidden_size if composite else stream * model.hidden_size + 8
    return per_token * tokens * _replicated(config)


def layer_activation_bytes(config: RunConfig, device: str) -> dict:
    """What one transformer layer keeps for its backward pass, per micro-batch on one
    tensor-parallel rank: ``{"layer": bytes kept, "core_attention": the part of it
    selective recompute drops}``."""
    model, parallel, training = config.model, config.parallel, config.training
    h, a, g, d, f = _shape(config)
    t = parallel.tensor_model_parallel_size
    seq, tokens = model.seq_length, model.seq_length * training.micro_batch_size
    e, rep = dtype_bytes(config), _replicated(config)
    te = model.transformer_impl == "transformer_engine"
    heads, groups = a // t, g // t
    # the fused QKV output, kept whole (the value is a view of it); with RoPE the rotated
    # query and key besides, and the rotation's cos and sin for each
    qkv = e * tokens * d * (heads + 2 * groups)
    if model.position_embedding_type == "rope":
        qkv += e * tokens * d * (heads + groups) + 4 * seq * d * e
    probs = training.micro_batch_size * heads * seq ** 2  # elements of the s x s probabilities
    if model.attention_backend in ("unfused", "local"):
        # Megatron-Core's DotProductAttention: the probabilities in fp32 (its softmax) and,
        # in 16-bit training, again in the training dtype (their product with the values);
        # the causal mask; under GQA the key and value repeated to every head; the context
        # made contiguous for the projection
        core = probs * (4 + (e if e != 4 else 0)) + seq ** 2
        if model.attention_dropout:
            core += probs * (1 + e)  # the dropout's mask and output
        if groups != heads:
            qkv += e * tokens * d * 2 * heads
        context = e * tokens * heads * d
    else:
        # SDPA, flash, TE: the output (which the projection takes as a view) and its
        # log-sum-exp. With attention dropout torch's CPU SDPA takes its math path: the
        # scores, the probabilities, the dropout's mask and output.
        core, context = e * tokens * heads * d + 4 * tokens * heads, 0
        if model.attention_dropout and device == "cpu" and not te:
            core += probs * (3 * e + 1)
    attention = e * tokens * h * rep + qkv + core + context  # the QKV linear's input first
    fused = device == "cuda" and (te or model.bias_swiglu_fusion)
    # fc1's input, fc1's output (SwiGLU: both halves; unfused, the two factors of their
    # product besides), fc2's input
    width = (2 + (0 if fused else 2)) if model.swiglu else 1
    mlp = e * tokens * h * rep + e * tokens * f // t * (width + 1)
    masks = 2 * tokens * h * rep if model.hidden_dropout else 0  # after attention and MLP
    layer = 2 * norm_bytes(config, device) + attention + mlp + masks
    return {"layer": layer, "core_attention": core}


def _micro_batches_in_flight(config: RunConfig, num_microbatches: int, stage: int) -> int:
    """A 1F1B pipeline's stage ``stage`` holds the activations of at most this many
    micro-batches (one without a pipeline)."""
    parallel = config.parallel
    return max(1, min(parallel.pipeline_model_parallel_size - stage, num_microbatches))


def activation_bytes(config: RunConfig, padded_vocab: int, num_microbatches: int,
                     stage: int, device: str = "cuda") -> float:
    """Peak activation bytes on one rank of pipeline stage ``stage``: at the end of a
    micro-batch's forward pass (its logits on the last stage), or, under full recompute,
    while the backward pass recomputes a chunk (the later layers' activations freed)."""
    model, parallel, training = config.model, config.parallel, config.training
    p, t = parallel.pipeline_model_parallel_size, parallel.tensor_model_parallel_size
    tokens, e = model.seq_length * training.micro_batch_size, dtype_bytes(config)
    hidden = e * tokens * model.hidden_size * _replicated(config)  # one residual-stream tensor
    layers = model.num_layers // p
    per_layer = layer_activation_bytes(config, device)
    layer = per_layer["layer"]
    if model.recompute_granularity == "selective":
        layer -= per_layer["core_attention"]
    first = _input_activation_bytes(config, tokens, e) if stage == 0 else 0
    kept, recomputing = layers * layer, None
    if model.recompute_granularity == "full":
        # a recomputed layer (uniform: a chunk of n layers) keeps its input; the backward
        # pass recomputes what it would have kept, a chunk (block: a layer) at a time
        n = min(model.recompute_num_layers, layers)
        chunk = n if model.recompute_method == "uniform" else 1
        inputs = (-(-layers // n) if model.recompute_method == "uniform" else n) * hidden
        kept = inputs + (0 if model.recompute_method == "uniform" else (layers - n) * layer)
        recomputing = inputs + first + chunk * layer
    kept += first
    in_flight = _micro_batches_in_flight(config, num_microbatches, stage)
    forward = in_flight * kept
    if stage == p - 1:
        # the final norm, the head's input and cross-entropy's fp32 softmax of this rank's
        # vocabulary, and the logits' copy in the training dtype while it is computed
        logits = tokens * padded_vocab / t
        forward += norm_bytes(config, device) + hidden + 4 * logits + 2 * logits
    # a backward pass, the other micro-batches in flight kept: this one's activations (or
    # its recomputed chunk) and the gradients of its widest tensors, fc1's output and the
    # residual stream
    width = model.ffn_hidden_size * (2 if model.swiglu else 1) // t
    backward = ((in_flight - 1) * kept + (kept if recomputing is None else recomputing)
                + e * tokens * width + hidden)
    return max(forward, backward)


def _input_activation_bytes(config: RunConfig, tokens: int, e: int) -> float:
    """What the input layer keeps: a table lookup its ids (int64), a factorised table its
    rank-r output, a code's projection its n-bit input; a dropout its mask."""
    model = config.model
    arm = model.input_interface
    kept = 8 * tokens if arm in TABLE_ARMS else 0
    if arm == "factorized":
        kept += e * tokens * model.input_table_rank
    elif model.code_projection:
        kept += e * tokens * model.code_bits
    if model.hidden_dropout:
        kept += tokens * model.hidden_size * _replicated(config)
    return kept


@dataclasses.dataclass(frozen=True)
class Footprint:
    """Bytes per GPU on the most loaded pipeline stage ``stage``."""
    stage: int
    weights: float
    gradients: float
    optimizer: float
    activations: float

    @property
    def weight_and_optimizer(self) -> float:
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return self.weight_and_optimizer + self.activations

    def largest(self) -> str:
        """The name of the largest term."""
        terms = {"weights": self.weights, "gradients": self.gradients,
                 "optimizer state": self.optimizer, "activations": self.activations}
        return max(terms, key=terms.get)

    def megatron_line(self) -> str:
        """Megatron-LM's start-up line (training.py's ``report_theoretical_memory``)."""
        return (f"Theoretical memory footprints: weight and optimizer="
                f"{self.weight_and_optimizer / MB:.2f} MB, activation="
                f"{self.activations / MB:.2f} MB, total={self.total / MB:.2f} MB")


def footprint(config: RunConfig, padded_vocab: int, data_parallel: int,
              num_microbatches: int, device: str = "cuda",
              stage: Optional[int] = None) -> Footprint:
    """The footprint of the pipeline stage whose total is largest (or of ``stage``).
    ``config``: the flags as the run applies them (``--sequence-parallel`` off at TP 1, the
    layers settled), with ``--ffn-hidden-size`` filled in."""
    parallel = config.parallel
    stages = range(parallel.pipeline_model_parallel_size) if stage is None else [stage]
    prints = []
    for i in stages:
        state = state_bytes(config, padded_vocab, data_parallel, i)
        prints.append(Footprint(i, state["weights"], state["gradients"], state["optimizer"],
                                activation_bytes(config, padded_vocab, num_microbatches, i,
                                                 device)))
    return max(prints, key=lambda fp: fp.total)
