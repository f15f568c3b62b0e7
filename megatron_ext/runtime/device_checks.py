"""Start-up checks of what a GPU run needs, made before any model is built, as Megatron-LM
makes them (megatron/training/arguments.py, megatron/core/fp8_utils.py): called by
:func:`megatron_ext.train.setup.resolve_layers` on a GPU; and the image build's check that its
Transformer Engine is the pinned one (``python -m megatron_ext.runtime.device_checks``, in the
Dockerfile). Each takes what it checks as plain values (environment, compute capability,
versions), so the CPU tests run them all.
"""

from __future__ import annotations

from typing import Mapping, Optional

from packaging.version import Version

from .errors import DeviceError, exits_on_error

# FP8 recipe -> (lowest compute capability, lowest Transformer Engine version) that runs it;
# the versions are megatron-core 0.16.1's (fp8_utils.get_fp8_recipe), the devices NVIDIA's
# (FP8 tensor cores from Ada/Hopper, sm 8.9; MXFP8 on Blackwell, sm 10.0).
FP8_NEEDS = {
    "delayed": ((8, 9), "1.0"),
    "tensorwise": ((8, 9), "2.2.0.dev0"),
    "blockwise": ((9, 0), "2.3.0.dev0"),
    "mxfp8": ((10, 0), "2.1.0.dev0"),
}
# Transformer Engine's block-scaled FP8 GEMMs are Hopper's only.
HOPPER_ONLY = {"blockwise"}


def transformer_engine_imports() -> bool:
    return transformer_engine_version() is not None


def transformer_engine_version() -> Optional[str]:
    """The version of Transformer Engine that imports here, else ``None``."""
    try:
        import transformer_engine
    except ImportError:
        return None
    return transformer_engine.__version__


def check_cuda_connections(tensor_parallel: int, sequence_parallel: bool,
                           capability: tuple[int, int], environ: Mapping[str, str]) -> None:
    """Tensor (and sequence) parallelism before Blackwell overlaps its communication with
    compute only when kernels are issued in order: ``CUDA_DEVICE_MAX_CONNECTIONS=1``,
    which must be set before CUDA starts, so it is an error here, not something set late."""
    if (tensor_parallel > 1 or sequence_parallel) and capability < (10, 0) \
            and environ.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
        raise DeviceError("--tensor-model-parallel-size > 1 (and --sequence-parallel) on "
                          "GPUs before Blackwell needs CUDA_DEVICE_MAX_CONNECTIONS=1 in the "
                          "environment (export it before launching), as in Megatron-LM")


def fp8_refusal(recipe: str, capability: tuple[int, int],
                te_version: Optional[str]) -> Optional[str]:
    """Why ``--fp8-recipe recipe`` cannot run on a device of this compute capability with
    this Transformer Engine version (``None``: not installed), or ``None`` when it can."""
    device, version = FP8_NEEDS[recipe]
    shown = f"sm {capability[0]}.{capability[1]}"
    if capability < device or (recipe in HOPPER_ONLY and capability[0] != 9):
        where = "Hopper (sm 9.0)" if recipe in HOPPER_ONLY else \
            f"sm {device[0]}.{device[1]} or newer"
        return f"--fp8-recipe {recipe} needs a GPU of {where}; this one is {shown}"
    if te_version is None or Version(te_version) < Version(version):
        return (f"--fp8-recipe {recipe} needs Transformer Engine >= {version}; "
                f"{'none imports' if te_version is None else 'found ' + te_version}")
    return None


def te_pin_refusal(te_version: Optional[str], requirements: list[str]) -> Optional[str]:
    """Why this Transformer Engine (``None``: none imports) is not the one the installed
    package's ``[gpu]`` extra pins (``requirements``: ``importlib.metadata.requires``), or
    ``None`` when it is."""
    from packaging.requirements import Requirement
    pins = [r for r in map(Requirement, requirements) if r.name == "transformer-engine"]
    if not pins:
        return "the installed fixedcode declares no transformer-engine pin"
    spec = pins[0].specifier
    if te_version is None:
        return f"Transformer Engine does not import; the [gpu] extra pins {spec}"
    if not spec.contains(Version(te_version).base_version, prereleases=True):
        return f"Transformer Engine {te_version} is outside the [gpu] extra's pin {spec}"
    return None


if __name__ == "__main__":  # the Dockerfile's build check
    import importlib.metadata

    from .megatron_compat import installed_release

    with exits_on_error():
        version = transformer_engine_version()
        refusal = te_pin_refusal(version, importlib.metadata.requires("fixedcode") or [])
        release = installed_release()
        if refusal:
            raise DeviceError(f"{refusal} (megatron-core {release}): use a base image whose TE "
                              f"is in the pin, or change the pin in pyproject.toml after "
                              f"testing that TE with megatron-core {release}")
        print(f"Transformer Engine {version}: within the [gpu] extra's pin (megatron-core "
              f"{release})")
