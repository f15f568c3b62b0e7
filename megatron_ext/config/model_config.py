"""The model and its input arm as flags: :class:`ModelConfig`, one field per flag (Megatron-LM's
names: ``--num-layers``, ``--swiglu``, ...; ours: ``--input-interface``, ``--code-*``), with the
checks that need only these flags (:meth:`ModelConfig.validate`) and the one that needs the
tokenizer (:meth:`ModelConfig.check_vocab`); what attention and a document mask need of the
layers (:func:`attention_backend_refusal`, :func:`document_mask_refusal`); the named shapes
of ``--preset`` and Megatron's vocabulary padding. Defaults are the paper's backbone: RMSNorm, SwiGLU, no linear biases,
RoPE, an untied output head; Megatron-LM's spellings of those choices (``--swiglu``,
``--disable-bias-linear``, ``--untie-embeddings-and-output-weights``, ``--normalization
RMSNorm``) are accepted, and each has a ``--no-...`` form."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ..codes.limits import ARMS, SCHEMES, TILINGS, check_options, check_vocab_fits
from ..runtime.errors import FlagError
from .flag_fields import FlagConfig, flag, flag_name

# Megatron-LM's --attention-backend values (megatron.core.transformer.enums.AttnBackend).
ATTENTION_BACKENDS = ("auto", "flash", "fused", "unfused", "local")

# The reference shape of the paper (SmolLM2-1.7B-like).
PRESETS = {
    "smollm2-1.7b": dict(num_layers=24, hidden_size=2048, num_attention_heads=32,
                         ffn_hidden_size=8192, seq_length=2048, max_position_embeddings=2048,
                         vocab_size=49152, rotary_base=130000),
}

INPUT_GROUP = "fixed-code input"
RECOMPUTE_GROUP = "activation recompute"


def attention_backend_refusal(transformer_impl: str, backend: str) -> Optional[str]:
    """Why ``--attention-backend`` cannot run on the layers ``transformer_impl``, or None:
    ``fused`` is Transformer Engine's (cuDNN) attention, ``local`` Megatron-Core's attention
    of the local layers."""
    if transformer_impl == "local" and backend == "fused":
        return ("--attention-backend fused selects Transformer Engine's fused (cuDNN) "
                "attention, which needs --transformer-impl transformer_engine; on local layers "
                "use auto or flash (torch's SDPA) or unfused")
    if transformer_impl != "local" and backend == "local":
        return ("--attention-backend local is Megatron-Core's attention of the local layers: "
                "it needs --transformer-impl local, as in Megatron-LM")
    return None


def document_mask_refusal(transformer_impl: str, backend: str, device: Optional[str],
                          masked_softmax_fusion: bool, pipeline_size: int) -> Optional[str]:
    """Why ``--reset-attention-mask`` (an explicit ``[b, 1, s, s]`` mask, documents packed in
    one sequence kept apart) cannot run with these layers, or None. It runs on local layers
    with SDPA (``auto``: on a GPU the memory-efficient or cuDNN kernel, which take a mask) or
    with Megatron-Core's ``DotProductAttention`` (``unfused``/``local``; on a GPU with
    ``--no-masked-softmax-fusion``: the fused causal softmax ignores the mask)."""
    if transformer_impl != "local":
        return ("--reset-attention-mask needs --transformer-impl local: Transformer Engine's "
                "layers are built for a causal mask and are not given this one")
    if backend == "flash":
        return ("--reset-attention-mask: --attention-backend flash runs the flash kernel, "
                "which takes no mask; use auto (SDPA picks a kernel that does) or unfused")
    if backend in ("unfused", "local") and device == "cuda" and masked_softmax_fusion:
        return ("--reset-attention-mask with --attention-backend unfused on a GPU needs "
                "--no-masked-softmax-fusion: the fused causal softmax ignores the mask")
    if pipeline_size > 2:
        return ("--reset-attention-mask with more than 2 pipeline stages: the middle stages "
                "read no batch, so they would not have the mask")
    return None


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """Megatron's padding: a multiple of ``divisible_by x tensor-parallel size``."""
    multiple = divisible_by * tp
    return int(math.ceil(vocab_size / multiple) * multiple)


@dataclasses.dataclass(frozen=True)
class ModelConfig(FlagConfig):
    """The model and its input arm: the shape, precision, layers, fusions, the fixed code,
    activation recompute. ``ffn_hidden_size`` and ``max_position_embeddings`` hold
    Megatron-LM's defaults where the flags leave them (:meth:`with_dependent_defaults`)."""
    FLAG_GROUP = "model"
    preset: Optional[str] = flag(
        None, "fill the model shape from a named preset (explicit flags still win)",
        choices=sorted(PRESETS), resume="free")
    num_layers: Optional[int] = flag(None, "transformer layers",
                                     resume="model", checkpoint_args="unset_only")
    hidden_size: Optional[int] = flag(None, "model width h (the fixed code is tiled to it)",
                                      resume="model", checkpoint_args="unset_only")
    # resume free: it can only be the head width, which the shape's flags give
    kv_channels: Optional[int] = flag(
        None, "the head width: taken when it is --hidden-size / --num-attention-heads, the "
              "width fixedcode builds (Megatron-LM's default)", resume="free")
    ffn_hidden_size: Optional[int] = flag(
        None, "default, as in Megatron-LM: 4 x hidden size, or with --swiglu 2/3 of that "
              "rounded down to a multiple of 64", resume="model", checkpoint_args="unset_only")
    num_attention_heads: Optional[int] = flag(None, "attention heads",
                                              resume="model", checkpoint_args="unset_only")
    num_query_groups: Optional[int] = flag(
        None, "grouped-query attention groups (default: no GQA)",
        resume="model", checkpoint_args="always")
    # resume free: --num-query-groups alone decides the attention built here
    group_query_attention: bool = flag(
        False, "Megatron-LM's switch for --num-query-groups, accepted; --num-query-groups "
               "alone turns grouped-query attention on too", resume="free")
    seq_length: Optional[int] = flag(None, "tokens per training sequence", resume="said",
                                     checkpoint_args="unset_only", study="arm_fixed")
    max_position_embeddings: Optional[int] = flag(None, "default --seq-length",
                                                  resume="free", checkpoint_args="unset_only")
    position_embedding_type: str = flag("rope", "rope, or none (no position information)",
                                        choices=("rope", "none"),
                                        resume="model", checkpoint_args="always",
                                        megatron_lm=("learned_absolute",
                                                     "a learned position table"))
    rotary_base: int = flag(10000, "RoPE base frequency", resume="said", checkpoint_args="always")
    normalization: str = flag("RMSNorm", "the layers' norm", choices=("RMSNorm", "LayerNorm"),
                              resume="model", checkpoint_args="always",
                              megatron_lm=("LayerNorm", "LayerNorm"))
    norm_epsilon: float = flag(1e-5, "epsilon of the norms",
                               resume="said", checkpoint_args="always")
    swiglu: bool = flag(True, "SwiGLU MLP (--no-swiglu: GELU)", switch="both",
                        resume="model", checkpoint_args="always",
                        megatron_lm=(False, "a GELU MLP"))
    disable_bias_linear: bool = flag(
        True, "no biases in the linear layers (--no-disable-bias-linear: biases)",
        switch="both",
        resume="model", checkpoint_args="always",
        megatron_lm=(False, "biases in the linear layers"))
    untie_embeddings_and_output_weights: bool = flag(
        True, "an output head of its own (--no-...: tied to the learned input table)",
        switch="both",
        resume="model", checkpoint_args="always",
        megatron_lm=(False, "the head tied to the input table"))
    # resume free: the initialisation only (a resume loads the weights), as is --embedding-init-method-std's
    init_method_std: float = flag(
        0.02, "standard deviation of the weight initialisation (and of the learned table)",
        resume="free")
    hidden_dropout: float = flag(0.0, "dropout on the residual stream",
                                 resume="said", checkpoint_args="always",
                                 megatron_lm=(0.1, "dropout 0.1 on the residual stream"))
    attention_dropout: float = flag(0.0, "dropout on the attention probabilities",
                                    resume="said", checkpoint_args="always",
                                    megatron_lm=(0.1,
                                                 "dropout 0.1 on the attention probabilities"))
    # resume free: the padded vocabulary it gives is what a resume compares (compatibility.py)
    make_vocab_size_divisible_by: int = flag(
        128, "pad the vocabulary to a multiple of this x tensor-parallel size", resume="free")
    bf16: bool = flag(False, "bf16 weights and activations, fp32 main weights in the optimizer",
                      resume="precision")
    fp16: bool = flag(False, "fp16 weights and activations, fp32 main weights, dynamic loss "
                             "scaling", resume="precision")
    transformer_impl: Optional[str] = flag(
        None, "transformer layers (default: transformer_engine on a GPU where Transformer "
              "Engine imports, as in Megatron-LM; local otherwise)",
        choices=("local", "transformer_engine"), resume="free")
    attention_backend: str = flag(
        "auto", "Transformer Engine layers: TE's attention backend, as in Megatron-LM (auto: "
                "TE's choice). Local layers: auto or flash run torch's fused "
                "scaled_dot_product_attention (flash: the flash kernel only on a GPU), unfused "
                "or local Megatron-Core's DotProductAttention; fused is TE's",
        choices=ATTENTION_BACKENDS, resume="free")
    fp32_residual_connection: bool = flag(
        False, "keep the residual stream in fp32 under --bf16/--fp16 (the layers still compute "
               "in the training dtype); docs/gpu.md says what a bf16 stream loses with +-1 "
               "codes", resume="free")
    fp8_format: Optional[str] = flag(None, "FP8 training with Transformer Engine",
                                     choices=("e4m3", "hybrid"), resume="free")
    fp8_recipe: str = flag(
        "delayed", "FP8 scaling: delayed (amax history), tensorwise (current scaling), "
                   "blockwise (Hopper, TE >= 2.3), mxfp8 (Blackwell)",
        choices=("delayed", "tensorwise", "blockwise", "mxfp8"), resume="free")
    fp8_amax_history_len: int = flag(
        1, "delayed recipe: amax history length (as in Megatron-LM)", resume="free")
    fp8_amax_compute_algo: str = flag(
        "most_recent", "delayed recipe: scale from the most recent or the largest amax of the "
                       "history (as in Megatron-LM)", choices=("most_recent", "max"),
        resume="free")
    # Fused kernels, on by default on GPUs as in Megatron-LM (never used on CPU).
    bias_swiglu_fusion: bool = flag(True, "unfused SwiGLU (default: fused on GPUs)", resume="free")
    rope_fusion: bool = flag(
        True, "unfused RoPE (default: Transformer Engine's fused RoPE on a GPU where TE "
              "imports, for TE and local layers)", resume="free")
    masked_softmax_fusion: bool = flag(
        True, "unfused attention softmax in the local layers (default: fused where apex's "
              "softmax kernels import)", resume="free")
    cross_entropy_loss_fusion: Optional[bool] = flag(
        None, "Megatron-Core's fused cross-entropy of the output logits (default: on on a GPU "
              "under --bf16; off on CPU, where its torch.compile'd kernels compile slowly; "
              "native needs --bf16)", switch="both", resume="free")
    cross_entropy_fusion_impl: str = flag(
        "native", "--cross-entropy-loss-fusion: Megatron-Core's own (native) or Transformer "
                  "Engine's (te: TE must import)", choices=("native", "te"), resume="free")
    gradient_accumulation_fusion: bool = flag(
        True, "weight gradients not accumulated in the GEMM (default: fused on a GPU where "
              "apex's fused_weight_gradient_mlp_cuda imports)", resume="free")
    torch_compile_layers: bool = flag(
        False, "torch.compile each transformer layer, one graph per layer (local layers; off "
               "by default: its GPU speed-up is not measured yet; the compile time is logged "
               "after the step that spent it)", resume="free")
    torch_compile_backend: str = flag(
        "inductor", "--torch-compile-layers: inductor generates the kernels (Triton on a GPU, "
                    "C++ on CPU); aot_eager and eager trace the graphs but run torch's own "
                    "kernels (tests, debugging)", choices=("inductor", "aot_eager", "eager"),
        resume="free")

    input_interface: str = flag(
        "learned", "learned table (control); frozen: Megatron's initial table, never trained; "
                   "factorized: a learned table of rank --input-table-rank; or a fixed code "
                   "(docs/codes.md): binary code of the id, GF(2) affine code, binary code of "
                   "a seeded permutation of the ids, or a seeded random code",
        choices=ARMS, group=INPUT_GROUP, resume="model", checkpoint_args="always", study="per_run")
    input_table_rank: Optional[int] = flag(
        None, "factorized: the rank r of the input table, a V x r table times an r x h map "
              "(ALBERT's factorised embedding), r <= --hidden-size and <= the padded "
              "vocabulary", group=INPUT_GROUP, resume="model", added=True)
    embedding_init_method_std: Optional[float] = flag(
        None, "standard deviation of the input table's initialisation (learned, frozen, "
              "factorized; default --init-method-std), as in Megatron-LM", group=INPUT_GROUP,
        resume="free", added=True)
    code_projection: bool = flag(
        False, "a fixed code: a trainable n x h linear map from the n-bit code to the width, "
               "instead of tiling it (initialised to the tiling: the first step's input is "
               "the fixed arm's)", group=INPUT_GROUP, resume="model", added=True)
    code_bits: int = flag(
        16, "bits n of the code, 1..62 (vocab <= 2^n; the last copy is truncated when n does "
            "not divide --hidden-size)", group=INPUT_GROUP,
        resume="model", checkpoint_args="always")
    code_values: str = flag("pm1", "bit value mapping: pm1 -> {-1,+1}, 01 -> {0,1}",
                            choices=("pm1", "01"), group=INPUT_GROUP,
                            resume="model", checkpoint_args="always")
    code_scale: float = flag(
        1.0, "multiplies the code values: the input RMS of a pm1 code (a learned table starts "
             "at RMS ~ --init-method-std; tools/param_report.py prints the matching scale)",
        group=INPUT_GROUP, resume="model", checkpoint_args="always")
    code_tiling: str = flag(
        "repeat", "fill the width with copies of the code (repeat), or with a seeded "
                  "invertible GF(2) affine recoding of it per copy (recode)",
        choices=TILINGS, group=INPUT_GROUP, resume="model", checkpoint_args="always", added=True)
    # resume free: the code it drew is stored with the model, and a resume loads that one
    code_seed: int = flag(
        1234, "seed drawing the code's random parts (gf2's A and b, the permutation, the "
              "random code, the recodings); they are stored with the model", least=0,
        group=INPUT_GROUP, resume="free", checkpoint_args="always")
    fixed_code_impl: str = flag(
        "auto", "auto: fused CUDA kernel on a GPU when it builds, else PyTorch; cuda: the "
                "kernel or an error", choices=("auto", "torch", "cuda"), group=INPUT_GROUP,
        resume="free")

    recompute_granularity: Optional[str] = flag(
        None, "full: recompute whole transformer layers in the backward pass; selective: only "
              "core attention", choices=("full", "selective"), group=RECOMPUTE_GROUP,
        resume="free")
    recompute_method: Optional[str] = flag(
        None, "full recompute: uniform (every layer, in chunks of --recompute-num-layers) or "
              "block (the first --recompute-num-layers layers of each pipeline stage)",
        choices=("uniform", "block"), group=RECOMPUTE_GROUP, resume="free")
    recompute_num_layers: Optional[int] = flag(
        None, "full recompute: layers per chunk (uniform) or per stage (block)",
        group=RECOMPUTE_GROUP, resume="free")

    def with_dependent_defaults(self) -> "ModelConfig":
        """The defaults a flag cannot declare, as Megatron-LM fills them: ``--ffn-hidden-size``
        4 x hidden size, or with ``--swiglu`` 2/3 of that rounded down to a multiple of 64;
        ``--max-position-embeddings`` ``--seq-length``."""
        ffn, positions = self.ffn_hidden_size, self.max_position_embeddings
        if ffn is None and self.hidden_size is not None:
            ffn = (int(4 * self.hidden_size * 2 / 3 / 64) * 64 if self.swiglu
                   else 4 * self.hidden_size)
        return self.replace(ffn_hidden_size=ffn,
                            max_position_embeddings=positions or self.seq_length)

    def validate(self) -> None:
        """Refuse inconsistent model flags, naming them."""
        for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length"):
            if getattr(self, name) is None:
                raise FlagError(f"{flag_name(name)} is required (or use --preset)")
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
        if self.cross_entropy_loss_fusion and self.cross_entropy_fusion_impl == "native" \
                and not self.bf16:
            raise FlagError("--cross-entropy-loss-fusion with --cross-entropy-fusion-impl "
                            "native needs --bf16: megatron-core 0.16.1's native fused "
                            "cross-entropy rounds the logits' gradient to bf16")
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
