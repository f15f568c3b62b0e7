"""The local layers' norm: torch's ``RMSNorm``/``LayerNorm``, usable under sequence parallelism.

Megatron-Core 0.16.1's ``WrappedTorchNorm`` (what its local layer spec uses for RMSNorm, and
for LayerNorm without apex) refuses ``sequence_parallel``. Under sequence parallelism each
tensor-parallel rank normalises its own slice of the sequence, so each holds only part of
the norm's weight gradient; Megatron's own norms (apex's, TE's) mark their parameters
``sequence_parallel`` and ``finalize_model_grads`` then sums those gradients over the
tensor-parallel group. :class:`TorchNorm` does the same for torch's norms. It also serves
``--fp32-residual-connection`` (an fp32 stream in, the weights' dtype out). The modules and
their parameter names are torch's, as before: checkpoints are unchanged.
:func:`megatron_ext.model.provider.local_layer_spec` puts it in place of ``WrappedTorchNorm``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from megatron.core.transformer.transformer_config import TransformerConfig

NORMS = {"RMSNorm": torch.nn.RMSNorm, "LayerNorm": torch.nn.LayerNorm}


class StreamRMSNorm(torch.nn.RMSNorm):
    """RMSNorm of an fp32 residual stream with weights in the training dtype: computed in
    fp32 (torch's kernel needs one dtype: mixed, it takes a slow composite path), returned
    in the weights' dtype for the layer after it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight.float(),
                          self.eps).to(self.weight.dtype)


class StreamLayerNorm(torch.nn.LayerNorm):
    """LayerNorm counterpart of :class:`StreamRMSNorm`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight.float(), self.bias.float(),
                            self.eps).to(self.weight.dtype)


STREAM_NORMS = {"RMSNorm": StreamRMSNorm, "LayerNorm": StreamLayerNorm}


class TorchNorm:
    """Same constructor as ``WrappedTorchNorm``; builds torch's norm for
    ``config.normalization``, its parameters marked ``sequence_parallel`` when the config
    is. Under ``fp32_residual_connection`` it normalises the fp32 residual stream in fp32
    and hands the next layer the weights' dtype, as apex's and TE's norms do."""

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5,
                persist_layer_norm: bool = False, zero_centered_gamma: bool = False,
                normalization: str = "LayerNorm"):
        if config.layernorm_zero_centered_gamma or config.memory_efficient_layer_norm:
            raise ValueError("torch's norms have no zero-centred gamma or memory-efficient "
                             "variant")
        norms = STREAM_NORMS if config.fp32_residual_connection else NORMS
        norm = norms[config.normalization](normalized_shape=hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm
