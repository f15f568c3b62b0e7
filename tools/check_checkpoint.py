"""Verify a save of a ``--save`` directory against its manifest, without loading a model:
every file present, of its size and CRC-32 (megatron_ext/checkpoint/manifest.py). Exit status 0 when
the save is intact; 1 when it is damaged (the first bad or missing file is named), missing, or was
written before manifests.

    python tools/check_checkpoint.py runs/binary                  # the latest save
    python tools/check_checkpoint.py runs/binary --ckpt-step 2000
"""

from __future__ import annotations

import argparse
import sys

from megatron_ext.checkpoint.loading import check_save
from megatron_ext.checkpoint.manifest import DamagedCheckpoint
from megatron_ext.runtime.errors import exits_on_error


def main(argv=None) -> None:
    with exits_on_error():
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("dir", help="a --save directory")
        parser.add_argument("--ckpt-step", type=int, default=None,
                            help="verify this iteration, not the latest (the marker's)")
        args = parser.parse_args(argv)
        try:
            print(check_save(args.dir, args.ckpt_step))
        except DamagedCheckpoint as e:
            sys.exit(f"error: damaged checkpoint: {e}")


if __name__ == "__main__":
    main()
