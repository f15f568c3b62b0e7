"""JIT build and load of the fused fixed-code CUDA kernel (``megatron_ext/codes/csrc``).

Built once per torch/CUDA/Python version with ``torch.utils.cpp_extension.load`` into
``$TORCH_EXTENSIONS_DIR`` when set, else ``~/.cache/fixedcode``; later processes reuse the
build; a build directory that is read-only (an image with the module prebuilt) is imported
as it is, provided the build record next to it (``sources.json``) names the current sources'
hash: an image older than the checkout it runs on must not run a stale kernel. Architectures
come from ``TORCH_CUDA_ARCH_LIST``, else from the visible GPUs. :mod:`megatron_ext.codes.kernels`
decides when to use it. ``python -m megatron_ext.codes.cuda_extension`` builds it ahead of time
(the Dockerfile does).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

import torch

from ..runtime.errors import DeviceError
from ..runtime.files import write_text

NAME = "fixedcode_cuda"
CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = (CSRC / "binding.cpp", CSRC / "fixed_code.cu")
RECORD = "sources.json"  # {"sources_sha256": ..., "file": the module's file name}


def build_directory() -> Path:
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "fixedcode"
    tag = (f"py{sys.version_info.major}{sys.version_info.minor}"
           f"_torch{torch.__version__}_cu{torch.version.cuda}")
    return Path(root) / tag / NAME


def sources_hash() -> str:
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()


def _load_prebuilt(directory: Path):
    """``(module, None)`` from a read-only build directory whose record names the current
    sources, else ``(None, reason)``. torch's loader would need to write its lock file
    there, so the module is imported directly."""
    record_path = directory / RECORD
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    if record.get("sources_sha256") != sources_hash():
        found = "a build of other sources" if record else f"no build record ({RECORD})"
        return None, (f"{directory} is read-only and holds {found}, not a build of "
                      f"{CSRC} as it is now; rebuild the image, or set TORCH_EXTENSIONS_DIR to "
                      f"a writable directory (built there on first use)")
    path = directory / record["file"]
    spec = importlib.util.spec_from_file_location(path.name.split(".")[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, None


@functools.lru_cache(maxsize=None)
def _build():
    """``(module, None)``, or ``(None, reason)``: built (or failed) once per process."""
    if torch.version.cuda is None:
        return None, f"torch {torch.__version__} is a CPU-only build"
    from torch.utils.cpp_extension import load as jit_load
    directory = build_directory()
    try:
        if directory.is_dir() and not os.access(directory, os.W_OK):
            # A read-only image (the Docker image under enroot) with the module built in.
            return _load_prebuilt(directory)
        directory.mkdir(parents=True, exist_ok=True)
        module = jit_load(name=NAME, sources=[str(s) for s in SOURCES],
                          build_directory=str(directory), verbose=False)
        # torch rebuilds when the sources change (as NAME_v1.so, ...): record which file
        # holds the build of which sources, for the read-only case. Ranks sharing the
        # directory write the same record; each replaces it whole.
        write_text(directory / RECORD, json.dumps({"sources_sha256": sources_hash(),
                                                   "file": Path(module.__file__).name}))
        return module, None
    except Exception as e:  # no compiler, a compile error, an ABI mismatch: all mean "none"
        return None, f"building or loading it in {directory} failed: {e}"


def load():
    """The compiled module (``.tiled_code``); a ``DeviceError`` saying why there is none."""
    module, reason = _build()
    if module is None:
        raise DeviceError(f"the fixed-code CUDA extension is unavailable: {reason}")
    return module


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether :func:`load` succeeds; warns once when it does not."""
    try:
        load()
    except DeviceError as e:
        warnings.warn(f"{e}; using the PyTorch implementation")
        return False
    return True


if __name__ == "__main__":
    print(load().__file__)
