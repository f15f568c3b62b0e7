"""Model FLOPs and the GPUs' peaks: what the log line's TFLOP/s and MFU are computed from
(:class:`~megatron_ext.metrics.logger.MetricsLogger`), and what bench/ and the study's compute
axis count."""

from __future__ import annotations

from typing import Optional

from ..config.model_config import ModelConfig

# Dense (not 2:4-sparse) peak TFLOP/s per GPU, (bf16/fp16, FP8), from NVIDIA's data sheets, by
# a substring of torch.cuda.get_device_name() ("NVIDIA H100 80GB HBM3" is the SXM part). The
# first match wins: the PCIe and NVL parts come before the SXM figures of their family.
PEAK_TFLOPS = (
    ("H100 PCIe", 756.0, 1513.0),
    ("H100 NVL", 835.0, 1671.0),
    ("H200 NVL", 835.0, 1671.0),
    ("H100", 989.0, 1979.0),
    ("H200", 989.0, 1979.0),  # also GH200
    ("A100", 312.0, None),  # no FP8
)


def flops_per_token(model: ModelConfig, padded_vocab_size: int) -> float:
    """Model FLOPs per trained token, forward and backward, as Megatron-LM 0.16.1 counts a
    dense GPT (megatron/training/training.py, ``num_floating_point_operations``): each GEMM
    2 FLOPs per multiply-add, 3 times (forward, data and weight gradients), over the query,
    key, value and output projections, the MLP (3 GEMMs with SwiGLU), the output logits,
    and the attention scores and their product with the values at half the sequence
    (causal). The input embedding, table or code, counts nothing: all arms do the same.
    ``model``: the run's model flags."""
    kv_channels = model.hidden_size // model.num_attention_heads
    query = kv_channels * model.num_attention_heads
    key_value = 2 * kv_channels * (model.num_query_groups or model.num_attention_heads)
    mlp = model.ffn_hidden_size * (3 if model.swiglu else 2)
    per_layer = (model.hidden_size * (query + key_value) + query * model.hidden_size
                 + model.hidden_size * mlp + query * model.seq_length / 2 * 2)
    return 3 * 2 * (model.num_layers * per_layer + model.hidden_size * padded_vocab_size)


def peak_flops(device_name: str, fp8: bool) -> Optional[float]:
    """The dense peak FLOP/s of one ``device_name`` GPU in FP8 or bf16/fp16; None when not
    in :data:`PEAK_TFLOPS`."""
    for key, bf16, fp8_peak in PEAK_TFLOPS:
        if key in device_name:
            peak = fp8_peak if fp8 else bf16
            return None if peak is None else peak * 1e12
    return None
