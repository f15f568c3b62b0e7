"""Command-line arguments with Megatron-LM's flag names, plus the fixed-code options.

One parser serves the training entry point and the tools (parameter report, converter), so a
flag means the same thing everywhere. Defaults are the paper's backbone: RMSNorm, SwiGLU, no
linear biases, RoPE, untied output head; Megatron-LM's spellings of those choices
(``--swiglu``, ``--disable-bias-linear``, ``--untie-embeddings-and-output-weights``,
``--normalization RMSNorm``) are accepted, and each has a ``--no-...`` form.
"""

from __future__ import annotations

import argparse
import math
from typing import Optional, Sequence

from ..codes.limits import ARMS, TILINGS
from ..runtime.errors import FlagError
from .flag_types import add_tokenizer_flags, nonnegative_int, positive_int
from .run_config import ModelConfig, RunConfig

# Megatron-LM's --attention-backend values (megatron.core.transformer.enums.AttnBackend).
ATTENTION_BACKENDS = ("auto", "flash", "fused", "unfused", "local")

# The reference shape of the paper (SmolLM2-1.7B-like).
PRESETS = {
    "smollm2-1.7b": dict(num_layers=24, hidden_size=2048, num_attention_heads=32,
                         ffn_hidden_size=8192, seq_length=2048, max_position_embeddings=2048,
                         vocab_size=49152, rotary_base=130000),
}


def add_model_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument("--preset", choices=sorted(PRESETS),
                   help="fill the model shape from a named preset (explicit flags still win)")
    g.add_argument("--num-layers", type=positive_int, help="transformer layers")
    g.add_argument("--hidden-size", type=positive_int,
                   help="model width h (the fixed code is tiled to it)")
    g.add_argument("--kv-channels", type=positive_int, default=None,
                   help="the head width: taken when it is --hidden-size / "
                        "--num-attention-heads, the width fixedcode builds (Megatron-LM's "
                        "default)")
    g.add_argument("--ffn-hidden-size", type=positive_int,
                   help="default, as in Megatron-LM: 4 x hidden size, or with --swiglu 2/3 of "
                        "that rounded down to a multiple of 64")
    g.add_argument("--num-attention-heads", type=positive_int, help="attention heads")
    g.add_argument("--num-query-groups", type=positive_int, default=None,
                   help="grouped-query attention groups (default: no GQA)")
    g.add_argument("--group-query-attention", action="store_true",
                   help="Megatron-LM's switch for --num-query-groups, accepted; "
                        "--num-query-groups alone turns grouped-query attention on too")
    g.add_argument("--seq-length", type=positive_int, help="tokens per training sequence")
    g.add_argument("--max-position-embeddings", type=positive_int, help="default --seq-length")
    g.add_argument("--position-embedding-type", choices=["rope", "none"], default="rope",
                   help="rope, or none (no position information)")
    g.add_argument("--rotary-base", type=positive_int, default=10000, help="RoPE base frequency")
    g.add_argument("--normalization", choices=["RMSNorm", "LayerNorm"], default="RMSNorm",
                   help="the layers' norm")
    g.add_argument("--norm-epsilon", type=float, default=1e-5, help="epsilon of the norms")
    g.add_argument("--swiglu", action=argparse.BooleanOptionalAction, default=True,
                   help="SwiGLU MLP (--no-swiglu: GELU)")
    g.add_argument("--disable-bias-linear", action=argparse.BooleanOptionalAction, default=True,
                   help="no biases in the linear layers (--no-disable-bias-linear: biases)")
    g.add_argument("--untie-embeddings-and-output-weights",
                   action=argparse.BooleanOptionalAction, default=True,
                   help="an output head of its own (--no-...: tied to the learned input table)")
    g.add_argument("--init-method-std", type=float, default=0.02,
                   help="standard deviation of the weight initialisation (and of the learned "
                        "table)")
    g.add_argument("--hidden-dropout", type=float, default=0.0,
                   help="dropout on the residual stream")
    g.add_argument("--attention-dropout", type=float, default=0.0,
                   help="dropout on the attention probabilities")
    g.add_argument("--make-vocab-size-divisible-by", type=positive_int, default=128,
                   help="pad the vocabulary to a multiple of this x tensor-parallel size")
    g.add_argument("--bf16", action="store_true",
                   help="bf16 weights and activations, fp32 main weights in the optimizer")
    g.add_argument("--fp16", action="store_true",
                   help="fp16 weights and activations, fp32 main weights, dynamic loss scaling")
    g.add_argument("--transformer-impl", choices=["local", "transformer_engine"],
                   default=None,
                   help="transformer layers (default: transformer_engine on a GPU where "
                        "Transformer Engine imports, as in Megatron-LM; local otherwise)")
    g.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="auto",
                   help="Transformer Engine layers: TE's attention backend, as in Megatron-LM "
                        "(auto: TE's choice). Local layers: auto or flash run torch's fused "
                        "scaled_dot_product_attention (flash: the flash kernel only on a GPU), "
                        "unfused or local Megatron-Core's DotProductAttention; fused is TE's")
    g.add_argument("--fp32-residual-connection", action="store_true",
                   help="keep the residual stream in fp32 under --bf16/--fp16 (the layers "
                        "still compute in the training dtype); docs/gpu.md says what a bf16 "
                        "stream loses with +-1 codes")
    g.add_argument("--fp8-format", choices=["e4m3", "hybrid"], default=None,
                   help="FP8 training with Transformer Engine")
    g.add_argument("--fp8-recipe", choices=["delayed", "tensorwise", "blockwise", "mxfp8"],
                   default="delayed",
                   help="FP8 scaling: delayed (amax history), tensorwise (current scaling), "
                        "blockwise (Hopper, TE >= 2.3), mxfp8 (Blackwell)")
    g.add_argument("--fp8-amax-history-len", type=positive_int, default=1,
                   help="delayed recipe: amax history length (default 1, as in Megatron-LM)")
    g.add_argument("--fp8-amax-compute-algo", choices=["most_recent", "max"],
                   default="most_recent",
                   help="delayed recipe: scale from the most recent or the largest amax of the "
                        "history (default most_recent, as in Megatron-LM)")
    # Fused kernels, on by default on GPUs as in Megatron-LM (never used on CPU).
    g.add_argument("--no-bias-swiglu-fusion", dest="bias_swiglu_fusion", action="store_false",
                   help="unfused SwiGLU (default: fused on GPUs)")
    g.add_argument("--no-rope-fusion", dest="rope_fusion", action="store_false",
                   help="unfused RoPE (default: Transformer Engine's fused RoPE on a GPU where "
                        "TE imports, for TE and local layers)")
    g.add_argument("--no-masked-softmax-fusion", dest="masked_softmax_fusion",
                   action="store_false",
                   help="unfused attention softmax in the local layers (default: fused where "
                        "apex's softmax kernels import)")
    g.add_argument("--cross-entropy-loss-fusion", action=argparse.BooleanOptionalAction,
                   default=None,
                   help="Megatron-Core's fused cross-entropy of the output logits (default: "
                        "on on a GPU under --bf16; off on CPU, where its torch.compile'd "
                        "kernels compile slowly; native needs --bf16)")
    g.add_argument("--cross-entropy-fusion-impl", choices=["native", "te"], default="native",
                   help="--cross-entropy-loss-fusion: Megatron-Core's own (native) or "
                        "Transformer Engine's (te: TE must import)")
    g.add_argument("--no-gradient-accumulation-fusion", dest="gradient_accumulation_fusion",
                   action="store_false",
                   help="weight gradients not accumulated in the GEMM (default: fused on a "
                        "GPU where apex's fused_weight_gradient_mlp_cuda imports)")
    g.add_argument("--torch-compile-layers", action="store_true",
                   help="torch.compile each transformer layer, one graph per layer (local "
                        "layers; off by default: its GPU speed-up is not measured yet; the "
                        "compile time is logged after the step that spent it)")
    g.add_argument("--torch-compile-backend", choices=["inductor", "aot_eager", "eager"],
                   default="inductor",
                   help="--torch-compile-layers: inductor generates the kernels (Triton on a "
                        "GPU, C++ on CPU); aot_eager and eager trace the graphs but run "
                        "torch's own kernels (tests, debugging)")

    c = parser.add_argument_group("fixed-code input")
    c.add_argument("--input-interface", choices=ARMS, default="learned",
                   help="learned table (control); frozen: Megatron's initial table, never "
                        "trained; factorized: a learned table of rank --input-table-rank; or a "
                        "fixed code (docs/codes.md): binary code of the id, GF(2) affine code, "
                        "binary code of a seeded permutation of the ids, or a seeded random "
                        "code")
    c.add_argument("--input-table-rank", type=positive_int, default=None,
                   help="factorized: the rank r of the input table, a V x r table times an "
                        "r x h map (ALBERT's factorised embedding), r <= --hidden-size and <= "
                        "the padded vocabulary")
    c.add_argument("--embedding-init-method-std", type=float, default=None,
                   help="standard deviation of the input table's initialisation (learned, "
                        "frozen, factorized; default --init-method-std), as in Megatron-LM")
    c.add_argument("--code-projection", action="store_true",
                   help="a fixed code: a trainable n x h linear map from the n-bit code to the "
                        "width, instead of tiling it (initialised to the tiling: the first "
                        "step's input is the fixed arm's)")
    c.add_argument("--code-bits", type=positive_int, default=16,
                   help="bits n of the code, 1..62 (vocab <= 2^n; the last copy is truncated "
                        "when n does not divide --hidden-size)")
    c.add_argument("--code-values", choices=["pm1", "01"], default="pm1",
                   help="bit value mapping: pm1 -> {-1,+1} (default), 01 -> {0,1}")
    c.add_argument("--code-scale", type=float, default=1.0,
                   help="multiplies the code values: the input RMS of a pm1 code (a learned "
                        "table starts at RMS ~ --init-method-std; tools/param_report.py "
                        "prints the matching scale)")
    c.add_argument("--code-tiling", choices=list(TILINGS), default="repeat",
                   help="fill the width with copies of the code (repeat), or with a seeded "
                        "invertible GF(2) affine recoding of it per copy (recode)")
    c.add_argument("--code-seed", type=nonnegative_int, default=1234,
                   help="seed drawing the code's random parts (gf2's A and b, the permutation, "
                        "the random code, the recodings); they are stored with the model")
    c.add_argument("--fixed-code-impl", choices=["auto", "torch", "cuda"], default="auto",
                   help="auto: fused CUDA kernel on a GPU when it builds, else PyTorch; "
                        "cuda: the kernel or an error")

    p = parser.add_argument_group("parallelism")
    p.add_argument("--tensor-model-parallel-size", type=positive_int, default=1,
                   help="tensor-parallel ranks per model replica")
    p.add_argument("--pipeline-model-parallel-size", type=positive_int, default=1,
                   help="pipeline stages")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="split the norms and dropout along the sequence over tensor-parallel ranks"
                        " (GPU, TE layers)")
    p.add_argument("--use-distributed-optimizer", action="store_true",
                   help="shard the optimizer state over data-parallel ranks (GPU)")
    p.add_argument("--overlap-grad-reduce", action="store_true",
                   help="reduce gradients bucket by bucket during the backward pass")
    p.add_argument("--overlap-param-gather", action="store_true",
                   help="--use-distributed-optimizer: gather the updated parameters bucket by "
                        "bucket during the next forward pass (needs --overlap-grad-reduce)")
    p.add_argument("--torch-adam-fused", choices=["auto", "on", "off"], default="auto",
                   help="where neither Transformer Engine nor Apex supplies a FusedAdam, "
                        "megatron-core's optimizer is torch's AdamW: run its fused kernel "
                        "(auto: on a GPU; on: also on CPU; off: torch's for-each update)")
    p.add_argument("--ddp-bucket-size", type=positive_int, default=None,
                   help="--overlap-grad-reduce: parameters per gradient bucket (default max(40M, "
                        "1M x DP size)); without it one bucket, as in megatron-core")

    r = parser.add_argument_group("activation recompute")
    r.add_argument("--recompute-granularity", choices=["full", "selective"], default=None,
                   help="full: recompute whole transformer layers in the backward pass; "
                        "selective: only core attention")
    r.add_argument("--recompute-method", choices=["uniform", "block"], default=None,
                   help="full recompute: uniform (every layer, in chunks of "
                        "--recompute-num-layers) or block (the first --recompute-num-layers "
                        "layers of each pipeline stage)")
    r.add_argument("--recompute-num-layers", type=positive_int, default=None,
                   help="full recompute: layers per chunk (uniform) or per stage (block)")

    t = parser.add_argument_group("tokenizer")
    add_tokenizer_flags(t, default="NullTokenizer")
    t.add_argument("--vocab-size", type=positive_int,
                   help="NullTokenizer: ids 0 .. V-1, and EOD V (V + 1 ids, as in Megatron-LM)")


def add_training_args(parser: argparse.ArgumentParser) -> None:
    """Flags of the training entry point (pretrain_fixedcode.py)."""
    g = parser.add_argument_group("training")
    g.add_argument("--micro-batch-size", type=positive_int, default=1,
                   help="sequences per micro-batch per data-parallel rank")
    g.add_argument("--global-batch-size", type=positive_int, default=None,
                   help="default micro batch x data-parallel size; accumulation is derived")
    g.add_argument("--train-iters", type=positive_int, help="training steps (or --train-samples)")
    g.add_argument("--train-samples", type=positive_int,
                   help="training sequences; steps = this / --global-batch-size")
    g.add_argument("--lr", type=float, default=3e-4, help="peak learning rate")
    g.add_argument("--min-lr", type=float, default=0.0,
                   help="learning rate at the end of the decay")
    g.add_argument("--lr-warmup-iters", type=nonnegative_int, default=0,
                   help="linear warm-up steps")
    g.add_argument("--lr-warmup-init", type=float, default=0.0,
                   help="learning rate at the start of the warm-up")
    g.add_argument("--lr-warmup-fraction", type=float, default=None,
                   help="warm-up as a fraction of the decay length (--lr-decay-iters or "
                        "--lr-decay-samples), instead of --lr-warmup-iters/--lr-warmup-samples")
    g.add_argument("--lr-warmup-samples", type=nonnegative_int, default=0,
                   help="--train-samples runs: linear warm-up over this many samples")
    g.add_argument("--lr-decay-iters", type=positive_int, default=None,
                   help="default --train-iters")
    g.add_argument("--lr-decay-samples", type=positive_int, default=None,
                   help="--train-samples runs: decay over this many samples (default "
                        "--train-samples)")
    g.add_argument("--rampup-batch-size", nargs=3, type=positive_int, default=None,
                   metavar=("START", "INCREMENT", "SAMPLES"),
                   help="--train-samples runs: grow the global batch from START by INCREMENT "
                        "over SAMPLES samples up to --global-batch-size, as in Megatron-LM")
    g.add_argument("--lr-decay-style", choices=["constant", "linear", "cosine", "WSD"],
                   default="cosine",
                   help="decay after the warm-up (WSD: constant, then --lr-wsd-decay-iters of "
                        "decay)")
    g.add_argument("--lr-wsd-decay-iters", type=positive_int, default=None,
                   help="WSD: length of the final decay phase")
    g.add_argument("--lr-wsd-decay-samples", type=positive_int, default=None,
                   help="--train-samples runs: WSD's final decay in samples")
    g.add_argument("--lr-wsd-decay-style", choices=["linear", "cosine", "exponential",
                                                     "minus_sqrt"], default="exponential",
                   help="WSD: shape of the final decay (default exponential, as in "
                        "Megatron-LM)")
    g.add_argument("--optimizer", choices=["adam"], default="adam",
                   help="Adam with decoupled weight decay (Megatron-LM's adam; its others are "
                        "not supported)")
    g.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay")
    g.add_argument("--input-table-lr-mult", type=float, default=1.0,
                   help="learned, factorized: the input table's learning rate is the "
                        "schedule's times this (0 freezes it; the head and backbone keep the "
                        "schedule's)")
    g.add_argument("--input-table-weight-decay", type=float, default=None,
                   help="learned, factorized: the input table's AdamW weight decay (default "
                        "--weight-decay)")
    g.add_argument("--adam-beta1", type=float, default=0.9, help="Adam beta1")
    g.add_argument("--adam-beta2", type=float, default=0.95, help="Adam beta2")
    g.add_argument("--adam-eps", type=float, default=1e-8, help="Adam epsilon")
    g.add_argument("--clip-grad", type=float, default=1.0, help="0 disables clipping")
    g.add_argument("--seed", type=nonnegative_int, default=1234,
                   help="seed of the backbone initialisation and the data order (the same backbone"
                        " in every arm)")
    g.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="auto: GPU when one is visible, else CPU over gloo")
    g.add_argument("--manual-gc", action="store_true",
                   help="turn Python's automatic garbage collector off and collect at fixed "
                        "points (before and after validation, every --manual-gc-interval "
                        "steps) so that ranks pause together, as in Megatron-LM")
    g.add_argument("--manual-gc-interval", type=nonnegative_int, default=0,
                   help="--manual-gc: collect every this many steps (0: not between steps)")
    g.add_argument("--no-manual-gc-eval", dest="manual_gc_eval", action="store_false",
                   help="--manual-gc: no collection around validation")
    g.add_argument("--check-for-spiky-loss", action="store_true",
                   help="flag a step whose loss is --spiky-loss-factor x the largest of the "
                        "first --spiky-loss-samples steps', as Megatron-LM (without its "
                        "rerun); logged, or acted on with --spiky-loss-action")
    g.add_argument("--spiky-loss-factor", type=float, default=10.0,
                   help="--check-for-spiky-loss: Megatron-LM's SPIKY_LOSS_FACTOR")
    g.add_argument("--spiky-loss-samples", type=positive_int, default=100,
                   help="--check-for-spiky-loss: the first steps whose largest loss is the "
                        "reference")
    g.add_argument("--spiky-loss-action", choices=["log", "skip", "stop"], default="log",
                   help="--check-for-spiky-loss: log the spike (Megatron-LM's fatal=False), "
                        "skip its update, or skip it and save and stop")
    g.add_argument("--max-nonfinite-steps", type=positive_int, default=10,
                   help="stop with an error after this many updates in a row skipped for a "
                        "non-finite loss, non-finite gradients, or an fp16 overflow at the "
                        "minimum loss scale (overflows above it only lower the scale)")

    d = parser.add_argument_group("data")
    d.add_argument("--data-path", nargs="+", default=None,
                   help="indexed dataset prefixes, optionally weighted: [W1] P1 [W2] P2 ...")
    d.add_argument("--split", default="969,30,1", help="train,valid,test proportions")
    for split in ("train", "valid", "test"):
        d.add_argument(f"--{split}-data-path", nargs="+", default=None,
                       help=f"{split} split from its own prefixes (instead of --data-path/--split)")
    d.add_argument("--data-args-path", default=None,
                   help="a file holding --data-path's value (whitespace-separated [W1] P1 "
                        "...), for blends too long for a command line, as in Megatron-LM")
    d.add_argument("--per-split-data-args-path", default=None,
                   help="a JSON file {\"train\": ..., \"valid\": ..., \"test\": ...} of "
                        "--train/valid/test-data-path values (lists or whitespace-separated "
                        "strings), as in Megatron-LM")
    d.add_argument("--mock-data", action="store_true", help="synthetic tokens, no files")
    d.add_argument("--eod-mask-loss", action="store_true",
                   help="no loss on end-of-document tokens (the dataset's loss mask)")
    d.add_argument("--reset-position-ids", action="store_true",
                   help="position ids restart after each end-of-document token")
    d.add_argument("--reset-attention-mask", action="store_true",
                   help="documents packed in one sequence do not attend to each other: an "
                        "explicit mask, on local layers with --attention-backend auto or "
                        "unfused/local (refused with flash and with Transformer Engine layers)")
    d.add_argument("--data-cache-path", default=None,
                   help="where Megatron's dataset index caches go (rank 0 builds them, the "
                        "others load them: a directory every node shares)")
    d.add_argument("--require-data-cache", action="store_true",
                   help="load the index caches from --data-cache-path, never build them: "
                        "missing ones are an error (build them ahead with "
                        "tools/build_data_cache.py; tools/submit.py --build-cache sets this)")
    d.add_argument("--max-data-epochs", type=float, default=None,
                   help="refuse to start when the train samples would read a data file's train "
                        "split more than this many times (default: only warn above 1)")
    d.add_argument("--num-workers", type=nonnegative_int, default=2, help="data loader workers")

    e = parser.add_argument_group("validation and logging")
    e.add_argument("--eval-interval", type=positive_int, default=1000,
                   help="validate every this many steps (and at the last)")
    e.add_argument("--eval-iters", type=nonnegative_int, default=10,
                   help="global batches per validation (0: no validation)")
    e.add_argument("--log-interval", type=positive_int, default=100,
                   help="log (and record) every this many steps")
    e.add_argument("--tensorboard-dir", default=None,
                   help="write the metrics as TensorBoard scalars here")
    e.add_argument("--tensorboard-log-interval", type=positive_int, default=1,
                   help="TensorBoard and wandb: the iteration's loss, learning rate, batch size "
                        "and grad norm every this many iterations (default 1, as in "
                        "Megatron-LM); the rest every --log-interval")
    e.add_argument("--metrics-file", default=None,
                   help="append one JSON line per log interval and validation here (default: "
                        "metrics.jsonl in --save)")
    e.add_argument("--log-params-norm", action="store_true",
                   help="log the L2 norm of all parameters (one extra reduction per log "
                        "interval)")
    e.add_argument("--log-num-zeros-in-grad", action="store_true",
                   help="log the number of zero gradient entries (counted at every step)")
    e.add_argument("--log-layer-norms", action="store_true",
                   help="log gradient and parameter norms of the input table, the first, "
                        "middle and last layer and the output head (one extra reduction per "
                        "log interval)")
    e.add_argument("--wandb-project", default=None,
                   help="log to this Weights & Biases project (needs the wandb extra; "
                        "WANDB_MODE=offline on clusters without internet, then wandb sync)")
    e.add_argument("--wandb-exp-name", default=None, help="the wandb run's name")
    e.add_argument("--wandb-entity", default=None, help="the wandb team or user")
    e.add_argument("--wandb-save-dir", default=None,
                   help="where wandb writes its run files (default: --save/wandb)")

    f = parser.add_argument_group("profiling (see megatron_ext/train/profiling.py)")
    f.add_argument("--profile", action="store_true",
                   help="record iterations --profile-step-start+1 .. --profile-step-end: for "
                        "Nsight Systems (GPU), or with --use-pytorch-profiler")
    f.add_argument("--use-pytorch-profiler", action="store_true",
                   help="a PyTorch profiler trace per rank in --tensorboard-dir")
    f.add_argument("--profile-step-start", type=nonnegative_int, default=10,
                   help="profile from the step after this one")
    f.add_argument("--profile-step-end", type=nonnegative_int, default=12,
                   help="profile up to and including this step")
    f.add_argument("--profile-ranks", type=nonnegative_int, nargs="+", default=[0],
                   help="ranks to profile")

    add_refused_args(parser)

    c = parser.add_argument_group("checkpointing and exit")
    c.add_argument("--save", default=None, help="checkpoint directory")
    c.add_argument("--save-interval", type=positive_int, default=None,
                   help="save a checkpoint every this many steps (and at the end)")
    c.add_argument("--async-save", action="store_true",
                   help="write each save in the background (megatron-core's asynchronous "
                        "dist-checkpointing); the marker moves once every rank has written, "
                        "and the next save, an exit and the last iteration wait for it")
    c.add_argument("--keep-last-checkpoints", type=positive_int, default=None, metavar="N",
                   help="after each completed save, delete the older saves but the newest N "
                        "(default: keep every save); never the marker's, a .partial, or one "
                        "a study's evaluation is reading")
    c.add_argument("--keep-checkpoints-every", type=positive_int, default=None, metavar="K",
                   help="with --keep-last-checkpoints: keep every save whose iteration is a "
                        "multiple of K for good (a study's curves)")
    c.add_argument("--ckpt-format", choices=["torch_dist"], default="torch_dist",
                   help="Megatron-Core dist_checkpointing (Megatron-LM's torch_dist), the only "
                        "format")
    c.add_argument("--save-lease-timeout", type=positive_int, default=300, metavar="SECS",
                   help="a run holds a lease on --save (.locks/run.lease, a heartbeat every "
                        "tenth of this) and another run refuses that directory; a lease "
                        "without a heartbeat for this long is taken over (at once: one of "
                        "this Slurm job, or of a gone process on this host)")
    c.add_argument("--load", default=None,
                   help="resume from the latest checkpoint here (none yet: start fresh)")
    c.add_argument("--ckpt-step", type=nonnegative_int, default=None,
                   help="load this iteration of --load, not the latest")
    c.add_argument("--use-checkpoint-args", action="store_true",
                   help="take the model and input flags from the checkpoint in --load, as in "
                        "Megatron-LM: the shape flags where not given here, the others "
                        "(--swiglu, --normalization, --input-interface, --code-*, ...) always")
    c.add_argument("--no-load-optim", action="store_true",
                   help="on resume: load neither the optimizer state nor the learning-rate "
                        "scheduler's (the schedule restarts from its step 0), as in "
                        "Megatron-LM; the iteration and data position continue")
    c.add_argument("--no-load-rng", action="store_true",
                   help="on resume: do not load the random-number states (re-seeded from "
                        "--seed)")
    c.add_argument("--finetune", action="store_true",
                   help="load only the model weights from --load: iteration 0, fresh "
                        "optimizer, schedule and data order, as in Megatron-LM (a --save "
                        "directory holding this run's own saves still resumes them fully)")
    c.add_argument("--override-opt_param-scheduler", "--override-opt-param-scheduler",
                   dest="override_opt_param_scheduler", action="store_true",
                   help="on resume: continue with the schedule these flags give (--lr, "
                        "--lr-decay-iters, ...) where it differs from the checkpoint's")
    c.add_argument("--use-checkpoint-opt_param-scheduler",
                   "--use-checkpoint-opt-param-scheduler",
                   dest="use_checkpoint_opt_param_scheduler", action="store_true",
                   help="on resume: keep the checkpoint's schedule whatever these flags say")
    c.add_argument("--dist-ckpt-optim-fully-reshardable", action="store_true",
                   help="--use-distributed-optimizer: save the optimizer state gathered per "
                        "parameter on data-parallel rank 0, so it resumes at any TP/PP size "
                        "(default: dp_reshardable, written by every rank in parallel, resumes "
                        "at another data-parallel size only), as in Megatron-LM")
    c.add_argument("--exit-signal-handler", action="store_true",
                   help="on SIGTERM/SIGUSR1: finish the step, save, exit 0")
    c.add_argument("--exit-duration-in-mins", type=float, default=None,
                   help="save and exit after this many minutes of wall time")
    c.add_argument("--exit-interval", type=positive_int, default=None,
                   help="save and exit when the iteration is a multiple of this")


# Megatron-LM flags a recipe may carry that fixedcode does not take, with why; each is
# refused by name (not argparse's "unrecognized arguments"). docs/training.md lists them.
REFUSED_FLAGS = {
    "--context-parallel-size": "context parallelism is not implemented (TP, PP, DP only)",
    "--num-experts": "the backbone is dense: mixture-of-experts layers are not built",
    "--start-weight-decay": "the weight decay is constant: give --weight-decay",
    "--end-weight-decay": "the weight decay is constant: give --weight-decay",
    "--weight-decay-incr-style": "the weight decay is constant: give --weight-decay",
    "--check-for-nan-in-loss-and-grad": "non-finite steps are always checked and skipped on "
                                        "every rank; --max-nonfinite-steps bounds them",
    "--rerun-mode": "the rerun state machine is not part of fixedcode",
    "--legacy-tokenizer": "the tokenizers have megatron.core's semantics (docs/data.md)",
    "--vocab-extra-ids": "no tokens are added to the tokenizer's vocabulary",
    "--use-flash-attn": "give --attention-backend flash",
    "--dataloader-type": "the loader is fixedcode's resumable sampler (Megatron-LM's single)",
    "--rotary-percent": "RoPE rotates the whole head: partial rotary embeddings are not built",
}
# Of those, the values that ask for what fixedcode does anyway: taken, so that a Megatron-LM
# script passing them runs unchanged.
NO_OP_VALUES = {"--context-parallel-size": ("1",), "--dataloader-type": ("single",),
                "--rotary-percent": ("1", "1.0")}
# Megatron-LM switches that ask for what fixedcode always does, taken and ignored.
NO_OP_SWITCHES = {
    "--log-throughput": "throughput is always logged",
    "--use-mcore-models": "the models are always Megatron-Core's (deprecated in Megatron-LM)",
    "--no-create-attention-mask-in-dataloader": "no mask is built unless "
                                                "--reset-attention-mask",
}


class Refused(argparse.Action):
    """A Megatron-LM flag fixedcode does not take: an error naming it and why (taken at its
    :data:`NO_OP_VALUES`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        taken = NO_OP_VALUES.get(option_string, ())
        if list(values) and all(v in taken for v in values):
            return
        raise FlagError(f"{option_string} (Megatron-LM's) is not supported: "
                        f"{REFUSED_FLAGS[option_string]}"
                        + (f" (it is taken as {taken[0]} only)" if taken else ""))


class Ignored(argparse.Action):
    """A Megatron-LM switch that asks for what fixedcode always does: taken, nothing set."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        pass


def add_refused_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Megatron-LM flags refused (each says why)")
    for flag, why in REFUSED_FLAGS.items():
        taken = NO_OP_VALUES.get(flag)
        g.add_argument(flag, action=Refused, nargs="*", default=argparse.SUPPRESS,
                       help=f"refused: {why}" + (f" (taken: {taken[0]})" if taken else ""))
    g = parser.add_argument_group("Megatron-LM switches taken as they ask for what is done "
                                  "anyway")
    for flag, why in NO_OP_SWITCHES.items():
        g.add_argument(flag, action=Ignored, help=why)


def apply_preset(args: argparse.Namespace, argv: Sequence[str]) -> None:
    """Fill shape flags from ``--preset`` unless given explicitly on the command line."""
    if not args.preset:
        return
    given = {a.split("=")[0] for a in argv if a.startswith("--")}
    for key, value in PRESETS[args.preset].items():
        if "--" + key.replace("_", "-") not in given:
            setattr(args, key, value)


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """Megatron's padding: a multiple of ``divisible_by x tensor-parallel size``."""
    multiple = divisible_by * tp
    return int(math.ceil(vocab_size / multiple) * multiple)


def fill_dependent_defaults(args: argparse.Namespace) -> None:
    """The defaults argparse cannot give, as Megatron-LM fills them: ``--ffn-hidden-size`` 4 x
    hidden size, or with ``--swiglu`` 2/3 of that rounded down to a multiple of 64;
    ``--max-position-embeddings`` ``--seq-length``. Part of parsing, as ``--preset`` is."""
    if args.ffn_hidden_size is None and args.hidden_size is not None:
        args.ffn_hidden_size = (int(4 * args.hidden_size * 2 / 3 / 64) * 64 if args.swiglu
                                else 4 * args.hidden_size)
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length


class ShowDefaults(argparse.HelpFormatter):
    """``--help`` shows each flag's default, where it has one (not None or False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        hidden = action.default is None or action.default is False \
            or action.default == argparse.SUPPRESS
        if not hidden and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


def build_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, allow_abbrev=False,
                                     formatter_class=ShowDefaults)
    add_model_args(parser)
    return parser


def read_training_flags(flags: Sequence[str]) -> argparse.Namespace:
    """pretrain_fixedcode.py's flags ``flags`` as its parser reads them, neither validated nor
    derived (flags it does not know are left out): what the study tools read off a recipe."""
    parser = build_parser("")
    add_training_args(parser)
    return parser.parse_known_args(list(flags))[0]


def parse_flags(argv: Optional[Sequence[str]], description: str, extra=None,
                fill=None) -> argparse.Namespace:
    """Parse ``argv`` with the model flags (and ``extra(parser)`` groups): the flags, with
    ``--preset``'s, ``fill(args)``'s (flags from elsewhere: the training entry point's
    ``--use-checkpoint-args``) and the defaults that depend on other flags filled in; not
    validated."""
    import sys
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(description)
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    apply_preset(args, argv)
    if fill is not None:
        fill(args)
    fill_dependent_defaults(args)
    return args


def parse_model_args(argv: Optional[Sequence[str]], description: str,
                     extra=None, fill=None) -> argparse.Namespace:
    """:func:`parse_flags`, the model flags validated (:meth:`ModelConfig.validate`): what a
    tool that builds or counts a model reads."""
    args = parse_flags(argv, description, extra, fill)
    ModelConfig.from_args(args).validate()
    return args


def parse_training_args(argv: Optional[Sequence[str]], description: str,
                        fill=None) -> argparse.Namespace:
    """pretrain_fixedcode.py's flags, refused by every check the flags alone allow
    (:meth:`RunConfig.validate`) before anything starts."""
    args = parse_flags(argv, description, add_training_args, fill)
    RunConfig.from_args(args).validate()
    return args


def check_run_flags(flags: Sequence[str]) -> RunConfig:
    """The config of a run that will start with ``flags`` (a study's run, a job to submit),
    refused now as the run would refuse them when it starts (``--use-checkpoint-args`` left
    out: there is no checkpoint to read yet)."""
    return RunConfig.from_args(parse_training_args(flags, ""))
