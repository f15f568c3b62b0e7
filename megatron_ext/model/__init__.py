"""The model: the provider users know from pretrain_gpt.py, its layer parts, and the parameter
count of each arm.

- ``provider``: the model provider (every arm) and its layer specs;
- ``input_tables``: the frozen and the factorised input tables;
- ``attention``: SDPA core attention of the local layers;
- ``norm_layers``: torch's norms for the local layers, sequence-parallel ready;
- ``residual``: the residual add that keeps an fp32 stream;
- ``row_linear``: the row-parallel linear that torch.compile traces without a break;
- ``param_count``: trainable parameters per part of each arm, from real modules;
- ``memory``: bytes per GPU of a run from its flags (Megatron-LM's theoretical memory).
"""
