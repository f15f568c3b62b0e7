"""``--torch-compile-layers``: torch.compile of each transformer layer, as torchtitan compiles
each block, one graph per layer (``fullgraph``: a graph break is an error, not a silent
fall-back to eager pieces). On a GPU, inductor is to fuse the elementwise chains between the
matmuls (RoPE, the casts, the residual adds, SwiGLU) into Triton kernels (not yet measured:
docs/gpu.md). The local layers
compile whole thanks to :mod:`megatron_ext.model.row_linear`; megatron-core is not patched.

Compilation is lazy (the first step's forward and backward passes compile); after each step
or validation that compiled, :class:`CompileTime` logs how long it took, from dynamo's own
account, so that the time is not read as the first step's throughput. Where it is refused:
``config.run_config.RunConfig.check_compile_layers`` (the flags), ``train.setup.resolve_layers``
(the layers)."""

from __future__ import annotations

import torch

from ..runtime.log import log


def compile_layers(model: torch.nn.Module, backend: str) -> int:
    """Mark every transformer layer of ``model`` (a GPTModel, this pipeline stage's layers)
    for compilation with ``backend``; returns their number. Nothing compiles before the first
    forward pass."""
    layers = list(model.decoder.layers)
    for layer in layers:
        layer.compile(backend=backend, fullgraph=True)
    return len(layers)


def compile_seconds() -> float:
    """Seconds torch.compile spent in this process so far: dynamo's tracing, the backend's
    compile of the forward and of the backward graphs (torch's private
    ``torch._dynamo.utils.calculate_time_spent``, read as torch 2.13 has it); None where this
    torch has no such account (then the log says so instead of a time)."""
    account = getattr(torch._dynamo.utils, "calculate_time_spent", None)
    seconds = account().get("total_wall_time") if account is not None else None
    return float(seconds) if seconds is not None else None


class CompileTime:
    """Logs the compile time of each phase that compiled (a step, a validation): the layers',
    and megatron-core's own torch.compile'd functions' (the fused cross-entropy), with the
    graphs compiled so far."""

    def __init__(self):
        self.seconds = compile_seconds()
        self.graphs = self._graphs()

    @staticmethod
    def _graphs() -> int:
        return torch._dynamo.utils.counters["stats"]["unique_graphs"]

    def report(self, phase: str) -> None:
        """Log the seconds spent compiling since the last report, if any, as ``phase``'s."""
        seconds, graphs = compile_seconds(), self._graphs()
        if seconds is None:
            if graphs > self.graphs:
                log(f"[fixedcode] torch.compile: {phase} compiled ({graphs} graphs in all); "
                    f"torch {torch.__version__} keeps no account of the time, so {phase}'s "
                    "time includes it")
        elif seconds > self.seconds:
            log(f"[fixedcode] torch.compile: {seconds - self.seconds:.1f} s of {phase} spent "
                f"compiling ({graphs} graphs compiled in all)")
        self.seconds, self.graphs = seconds, graphs
