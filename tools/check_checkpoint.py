"""Verify a save of a ``--save`` directory against its manifest, without loading a model:
every file present, of its size and CRC-32 (megatron_ext/checkpoint/manifest.py). Exit status 0 when
the save is intact; 1 when it is damaged (the first bad or missing file is named), missing, or was
written before manifests. ``--iteration`` was ``--ckpt-step`` (still accepted, with a notice, until
the next release).

    python tools/check_checkpoint.py runs/binary                  # the latest save
    python tools/check_checkpoint.py runs/binary --iteration 2000
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from megatron_ext.checkpoint.loading import check_save
from megatron_ext.checkpoint.manifest import DamagedCheckpoint
from megatron_ext.config.checkpoint_config import SavedIteration
from megatron_ext.config.flag_fields import add_flags
from megatron_ext.runtime.errors import exits_on_error


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", help="a --save directory")
    add_flags(parser, SavedIteration, renamed={"iteration": ("--ckpt-step",)})
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> None:
    with exits_on_error():
        args = parse_args(argv)
        try:
            print(check_save(args.dir, SavedIteration.from_flags(args).iteration))
        except DamagedCheckpoint as e:
            sys.exit(f"error: damaged checkpoint: {e}")


if __name__ == "__main__":
    main()
