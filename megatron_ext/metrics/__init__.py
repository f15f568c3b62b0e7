"""What a run reports: the training log line and metrics file, FLOPs and MFU, the sinks, parameter
and gradient norms, and the shared pieces of every report.

- ``logger``: the training log line's values and scalars, throughput, MFU (MetricsLogger);
- ``log_line``: the training and validation lines' text, as Megatron-LM prints them;
- ``flops``: model FLOPs per token and the GPUs' peak FLOP/s;
- ``sinks``: TensorBoard, W&B and the metrics JSONL;
- ``norms``: parameter and gradient norms for diagnostics;
- ``training_report``: the arms' runs compared from their metrics files;
- ``reporting``: table cells and figures shared by every report;
- ``intervals``: the Student-t interval of a mean (probe seeds, training seeds).
"""
