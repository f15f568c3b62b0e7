# fixedcode on NVIDIA's NGC PyTorch image. The image's torch, CUDA toolkit and Transformer
# Engine are used as they are (never reinstalled: the install is constrained to the image's
# torch, on top of NGC's own /etc/pip/constraint.txt), and the build stops when the image's TE
# is outside the [gpu] extra's pin, naming the TE and the megatron-core release; the project is
# installed editable and the fused fixed-code CUDA kernel is built into the image.
#
# Base: NGC PyTorch 26.02 (Python 3.12, torch 2.11, CUDA 13), so pip takes megatron-core
# 0.19.x (the current release, Python 3.12 only). Transformer Engine: the image's, which must
# lie in the [gpu] extra's range for megatron-core 0.19.x, >=2.9,<2.15 (pyproject.toml); the
# check below prints both versions, or stops naming both. (Which TE 26.02 ships was not
# checked from here: the first build says.)
#
#   docker build -t fixedcode:latest .
#   enroot import -o fixedcode.sqsh dockerd://fixedcode:latest
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:26.02-py3
FROM ${BASE_IMAGE}

# Ampere, Hopper (H100/H200), Blackwell. Kept at run time: a JIT load with other flags would
# rebuild the kernel.
ENV TORCH_CUDA_ARCH_LIST="8.0;9.0;10.0" \
    TORCH_EXTENSIONS_DIR=/opt/fixedcode/torch_extensions

WORKDIR /workspace/fixedcode
COPY . .
RUN python -c "import torch; print(f'torch=={torch.__version__}')" > /tmp/keep-torch.txt \
 && pip install --no-cache-dir -c /tmp/keep-torch.txt -e ".[dev]" \
 && python -m megatron_ext.runtime.device_checks \
 && python -m megatron_ext.codes.cuda_extension \
 && chmod -R a+rX /opt/fixedcode \
 && python -c "import torch, megatron.core, transformer_engine as te; \
print('torch', torch.__version__, '| megatron-core', megatron.core.__version__, \
'| transformer-engine', te.__version__)"
