"""The row-parallel linear of the local layers (attention's output projection, the MLP's second
linear): megatron-core 0.16.1's ``RowParallelLinear`` handing its own tensor-parallel group to
its matmul, so that torch.compile traces each layer as one graph (``--torch-compile-layers``).

Megatron-Core 0.16.1's ``RowParallelLinear.forward`` calls its matmul with ``tp_group=None``
(tensor_parallel/layers.py), which looks the default group up and, on rank 0, calls
``warnings.warn(..., DeprecationWarning)`` at every forward pass. Dynamo cannot trace that call
(nor reorder it: it takes a category): each layer's graph broke there twice, the first time
inside megatron-core's activation-offloading context manager, which breaks it once more, 9
graphs per layer. The group handed over is the one looked up (the layer's ``tp_group`` is the
default group), and a row-parallel matmul does not use it (no sequence-parallel gather, no
gradient all-reduce there: the reduction follows the matmul), so nothing computed changes.
"""

from __future__ import annotations

from megatron.core.tensor_parallel import layers


class RowParallelLinear(layers.RowParallelLinear):
    """megatron-core's ``RowParallelLinear`` whose matmul gets the layer's ``tp_group``."""

    def _forward_impl(self, input, weight, *args, **kwargs):
        if kwargs.get("tp_group") is None:
            kwargs["tp_group"] = self.tp_group
        return super()._forward_impl(input, weight, *args, **kwargs)
