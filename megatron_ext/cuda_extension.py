"""JIT build and load of the fused fixed-code CUDA kernel (``megatron_ext/csrc``).

Built once per torch/CUDA/Python version with ``torch.utils.cpp_extension.load`` into
``$TORCH_EXTENSIONS_DIR`` when set, else ``~/.cache/fixedcode``; later processes reuse the
build; a build directory that is read-only (an image with the module prebuilt) is imported
as it is. Architectures come from ``TORCH_CUDA_ARCH_LIST``, else from the visible GPUs.
:mod:`megatron_ext.kernels` decides when to use it. ``python -m megatron_ext.cuda_extension``
builds it ahead of time (the Dockerfile does).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import warnings
from pathlib import Path

import torch

NAME = "fixedcode_cuda"
CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = (CSRC / "binding.cpp", CSRC / "fixed_code.cu")


def build_directory() -> Path:
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "fixedcode"
    tag = (f"py{sys.version_info.major}{sys.version_info.minor}"
           f"_torch{torch.__version__}_cu{torch.version.cuda}")
    return Path(root) / tag / NAME


@functools.lru_cache(maxsize=None)
def _build():
    """``(module, None)``, or ``(None, reason)``: built (or failed) once per process."""
    if torch.version.cuda is None:
        return None, f"torch {torch.__version__} is a CPU-only build"
    from torch.utils.cpp_extension import load as jit_load
    directory = build_directory()
    prebuilt = directory / f"{NAME}.so"
    try:
        if prebuilt.exists() and not os.access(directory, os.W_OK):
            # A read-only image (the Docker image under enroot) with the module built in:
            # torch's loader would need to write its lock file, so import the module directly.
            spec = importlib.util.spec_from_file_location(NAME, prebuilt)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module, None
        directory.mkdir(parents=True, exist_ok=True)
        return jit_load(name=NAME, sources=[str(s) for s in SOURCES],
                        build_directory=str(directory), verbose=False), None
    except Exception as e:  # no compiler, a compile error, an ABI mismatch: all mean "none"
        return None, f"building or loading it in {directory} failed: {e}"


def load():
    """The compiled module (``.tiled_code``); ``RuntimeError`` saying why there is none."""
    module, reason = _build()
    if module is None:
        raise RuntimeError(f"the fixed-code CUDA extension is unavailable: {reason}")
    return module


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether :func:`load` succeeds; warns once when it does not."""
    try:
        load()
    except RuntimeError as e:
        warnings.warn(f"{e}; using the PyTorch implementation")
        return False
    return True


if __name__ == "__main__":
    print(load().__file__)
