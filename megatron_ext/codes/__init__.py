"""The fixed codes of token ids: the science of the project, and the input layer that applies
them. Imports only ``runtime``.

- ``limits``: the arms' and codes' names, the rules a code's flags and vocabulary follow (no torch);
- ``schemes``: the code schemes as pure tensor functions (the reference);
- ``kernels``: the fast forward: PyTorch path or the fused CUDA kernel;
- ``cuda_extension``: JIT build and load of the kernel in ``csrc``;
- ``embedding``: FixedCodeEmbedding, the drop-in for GPTModel's embedding;
- ``csrc``: the CUDA kernel's source (not a Python package).
"""
