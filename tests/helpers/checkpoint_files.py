"""Stand-in saves: the files of a ``--save`` folder without a training (a save's two files and
its manifest, the marker), for the tests of manifests, retention and layout."""

from __future__ import annotations

import os

from megatron_ext.checkpoint import layout, manifest


def write_save(save_dir, iteration: int, marker: bool = True) -> str:
    """A stand-in save: two files and a manifest, optionally named by the marker."""
    path = layout.checkpoint_path(str(save_dir), iteration)
    os.makedirs(path)
    for name, size in (("__0_0.distcp", 3000), ("common.pt", 100)):
        with open(os.path.join(path, name), "wb") as f:
            f.write(os.urandom(size))
    manifest.write_manifest(path, {}, written_by="0.16.1")
    if marker:
        (save_dir / layout.MARKER).write_text(str(iteration))
    return path
