"""Input layer alone, forward and forward+backward, at vocabulary 49,152 and hidden 2048 (bf16):
Megatron's ``LanguageModelEmbedding`` (its ``VocabParallelEmbedding``) against
``FixedCodeEmbedding`` for every code scheme and tiling (PyTorch path; on a GPU also the fused
CUDA kernel), measured side by side in one run on whatever device is present. Each row runs in
its own process.

Every row also times a copy of the output's bytes into a freshly allocated tensor, its calls
taking turns with the forward's: "fwd / fresh copy" is what the input costs against the least
any layer that returns a new tensor of that size can cost (on a CPU, mostly the page faults of
the new allocation). On a GPU it also reports the kernel's output bandwidth against a
device-to-device copy of the same bytes, both timed from CUDA-graph replays (no launch
overhead)::

    python bench/bench_embedding.py                      # 8k and 32k tokens
    python bench/bench_embedding.py --tokens 8192 --reps 5
"""

from __future__ import annotations

import argparse

import torch

import measure
from megatron_ext.codes.schemes import SCHEMES, TILINGS

VOCAB, HIDDEN, SEQ = 49152, 2048, 2048
DTYPE = torch.bfloat16


def build(arm: str, impl: str, dev: str) -> torch.nn.Module:
    """``arm``: ``learned``, or ``SCHEME/TILING`` of a fixed code."""
    from megatron.core.models.common.embeddings.language_model_embedding import (
        LanguageModelEmbedding)
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron_ext.codes.schemes import build_code
    from megatron_ext.codes.embedding import FixedCodeEmbedding
    from megatron_ext.config.model_config import ModelConfig
    config = TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=16,
                               bf16=True, params_dtype=DTYPE, hidden_dropout=0.0,
                               use_cpu_initialization=dev == "cpu")
    if arm == "learned":
        return LanguageModelEmbedding(config, VOCAB, SEQ, position_embedding_type="rope")
    scheme, tiling = arm.split("/")
    code = build_code(ModelConfig().replace(input_interface=scheme, code_tiling=tiling,
                                            hidden_size=HIDDEN), VOCAB)  # the flags' defaults
    return FixedCodeEmbedding(config, VOCAB, SEQ, position_embedding_type="rope", code=code,
                              impl=impl).to(dev)


def kernel_bandwidth(module, ids: torch.Tensor, reps: int) -> dict:
    """Fused kernel alone vs ``copy_`` of its output's bytes, GB/s from graph replays."""
    from megatron_ext.codes.kernels import fixed_code_forward
    ids_sb = ids.t().contiguous()  # as the kernel reads them: no copy inside the timing
    out_bytes = ids.numel() * HIDDEN * DTYPE.itemsize
    kernel_ms = measure.graph_time_ms(
        lambda: fixed_code_forward(module.code, ids_sb, module.code_table, module.code_lookup,
                                   HIDDEN, DTYPE, "cuda"), reps)
    src = torch.empty(out_bytes, dtype=torch.uint8, device=ids.device)
    dst = torch.empty_like(src)
    copy_ms = measure.graph_time_ms(lambda: dst.copy_(src), reps)
    return {"kernel_ms": kernel_ms, "copy_ms": copy_ms,
            "kernel_write_GBps": out_bytes / kernel_ms / 1e6,
            "copy_read_write_GBps": 2 * out_bytes / copy_ms / 1e6}


def child(arm: str, impl: str, tokens: int, warmup: int, reps: int) -> None:
    from megatron_ext.runtime.initialize import initialize_distributed
    dev = measure.device()
    initialize_distributed(dev)
    seq = min(SEQ, tokens)
    ids = torch.randint(0, VOCAB, (tokens // seq, seq), device=dev)
    grad = torch.randn(seq, tokens // seq, HIDDEN, dtype=DTYPE, device=dev)

    baseline = measure.memory_now()
    module = build(arm, impl, dev)
    measure.reset_peak()

    def forward_backward():  # one training step's worth: gradients start cleared
        module.zero_grad(set_to_none=True)
        out = module(ids, None)
        if out.requires_grad:  # the learned table; the fixed code has nothing to train
            out.backward(grad)

    step_ms = measure.time_ms(forward_backward, warmup, reps)
    peak = measure.peak_memory() - baseline
    src = torch.randn(tokens, HIDDEN, device=dev).to(DTYPE)
    times = measure.time_interleaved_ms(
        {"fwd": lambda: module(ids, None), "copy": lambda: torch.empty_like(src).copy_(src)},
        warmup, reps)
    result = {"fwd_ms": times["fwd"], "fresh_copy_ms": times["copy"], "fwd_bwd_ms": step_ms,
              "peak_bytes": peak,
              "trainable": sum(p.numel() for p in module.parameters() if p.requires_grad)}
    if impl == "cuda":
        result.update(kernel_bandwidth(module, ids, reps))
    measure.emit(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--warmup", type=int, default=None, help="default 5 GPU, 1 CPU")
    parser.add_argument("--reps", type=int, default=None, help="default 50 GPU, 5 CPU")
    parser.add_argument("--child", nargs=3, metavar=("ARM", "IMPL", "TOKENS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    gpu = measure.device() == "cuda"
    warmup = args.warmup if args.warmup is not None else (5 if gpu else 1)
    reps = args.reps if args.reps is not None else (50 if gpu else 5)
    if args.child:
        arm, impl, tokens = args.child
        return child(arm, impl, int(tokens), warmup, reps)

    impls = ("torch", "cuda") if gpu else ("torch",)
    rows = [("learned", "-")] + [(f"{s}/{t}", i) for i in impls for s in SCHEMES for t in TILINGS]
    print(f"# bench_embedding: vocab {VOCAB}, hidden {HIDDEN}, {DTYPE}, warmup {warmup}, "
          f"reps {reps} (median; fwd: wall)\n# machine: {measure.machine()}\n# memory: "
          f"{measure.MEMORY_KIND}")
    clocks = measure.clocks()
    print("| tokens | input | impl | trainable | fwd ms | "
          + " | ".join(f"fwd / fresh copy {c}" for c in clocks) + " | "
          + " | ".join(f"fwd+bwd {c} ms" for c in clocks) + " | peak MiB | "
          + " | ".join(f"learned/this fwd+bwd {c}" for c in clocks) + " | learned/this peak |")
    print("|---|---|---|" + "---:|" * (4 + 3 * len(clocks)))
    for tokens in args.tokens:  # each row printed as its process ends: a cut run keeps them
        results = {}
        for arm, impl in rows:
            r = results[arm, impl] = measure.run_child(
                __file__, arm, impl, str(tokens), "--warmup", str(warmup), "--reps", str(reps))
            base = results[("learned", "-")]
            print(f"| {tokens} | {arm} | {impl} | {r['trainable']:,} "
                  f"| {r['fwd_ms']['wall']:.1f} | "
                  + " | ".join(f"{r['fwd_ms'][c] / r['fresh_copy_ms'][c]:.2f}" for c in clocks)
                  + " | "
                  + " | ".join(f"{r['fwd_bwd_ms'][c]:.1f}" for c in clocks)
                  + f" | {r['peak_bytes'] / 2**20:.0f} | "
                  + " | ".join(f"{base['fwd_bwd_ms'][c] / r['fwd_bwd_ms'][c]:.1f}x"
                               for c in clocks)
                  + f" | {base['peak_bytes'] / max(r['peak_bytes'], 1):.1f}x |", flush=True)
        for (arm, impl), r in results.items():
            if impl == "cuda":
                print(f"# {tokens} tokens, {arm} kernel alone: {r['kernel_ms'] * 1e3:.1f} us, "
                      f"{r['kernel_write_GBps']:.0f} GB/s written; copy_ of the same bytes: "
                      f"{r['copy_ms'] * 1e3:.1f} us, {r['copy_read_write_GBps']:.0f} GB/s read+"
                      f"written; kernel/copy bandwidth "
                      f"{r['kernel_write_GBps'] / r['copy_read_write_GBps']:.2f}")

if __name__ == "__main__":
    from megatron_ext.runtime.errors import exits_on_error
    with exits_on_error():
        main()
