"""Older and newer saves made from a current one: its common objects read through the project's
loader (``checkpoint.loading.load_common``), changed, and written back as the one form every
supported megatron-core release reads (the ``common.pt`` of releases before 0.19.0, which 0.19
still prefers when a save has one), with the manifest redone so that the save stays intact."""

from __future__ import annotations

from typing import Callable

import torch

from megatron_ext.checkpoint import loading, manifest
from megatron_ext.runtime.megatron_compat import COMMON_FILE


def rewrite_common(save_dir: str, iteration: int, change: Callable[[dict], dict]) -> str:
    """Replace the common objects of ``save_dir``'s save of ``iteration`` by
    ``change(common)``; returns the save's path."""
    path, common = loading.load_common(str(save_dir), iteration)
    torch.save(change(dict(common)), f"{path}/{COMMON_FILE}")
    manifest.write_manifest(path, {}, written_by=manifest.written_by(path))
    return path


class Opaque:
    """An object outside the types torch loads with ``weights_only=True``: what a save written
    by other code may hold."""
