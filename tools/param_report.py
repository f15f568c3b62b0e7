"""Trainable parameters per part (input, backbone, head, total) for each arm, the input's
RMS at initialisation, and the rows of a fixed code.

Counted by megatron_ext/model/param_count.py from real instantiated Megatron-Core modules (on the
meta device: no memory is allocated), never from a formula. The table also gives each arm's
input RMS at step 0: the
learned table starts at N(0, --init-method-std), RMS ≈ that std; a fixed code's RMS is
computed over the whole vocabulary, with the --code-scale that would match the learned one.
Usage::

    python tools/param_report.py --preset smollm2-1.7b
    python tools/param_report.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 \\
        --seq-length 128 --vocab-size 1000 --arms binary learned
    python tools/param_report.py --preset smollm2-1.7b --arms learned frozen binary \
        map:binary@--code-projection r16:factorized@--input-table-rank=16
    python tools/param_report.py --preset smollm2-1.7b --input-interface random \\
        --code-tiling recode --show-code 4      # the first 4 rows of that code
"""

from __future__ import annotations

import json
import sys
from typing import Optional, Sequence

from megatron_ext.config.arguments import parse_model_config
from megatron_ext.config.run_config import RunConfig
from megatron_ext.codes.limits import ARMS
from megatron_ext.model.param_count import (ARMS_WITHOUT_FLAGS, code_rows, count_arms,
                                           format_table, input_rms)
from megatron_ext.runtime.errors import exits_on_error


def main(argv: Optional[Sequence[str]] = None) -> dict:
    with exits_on_error():
        def extra(parser):
            parser.add_argument("--arms", nargs="+", default=list(ARMS_WITHOUT_FLAGS),
                                metavar="[NAME:]ARM[@--flag=value...]",
                                help="the arms to count, as a study names them: one of "
                                     f"{', '.join(ARMS)}, with model flags of its own "
                                     "(default: every arm that needs none, i.e. all but "
                                     "factorized)")
            parser.add_argument("--json", action="store_true",
                                help="print the parameter counts as JSON instead of a table")
            parser.add_argument("--show-code", type=int, metavar="ROWS",
                                help="print the first ROWS rows of the code of --input-interface "
                                     "(here default binary) with the --code-* flags, and exit")
            parser.set_defaults(input_interface="binary")
        config, args = parse_model_config(argv, "Trainable parameters per arm", extra)
        if args.show_code is not None:
            print(code_rows(config, args.show_code))
            return {}
        given = RunConfig.from_flags(args)  # each arm fills its own dependent defaults
        counts = count_arms(given, args.arms)
        print(json.dumps(counts, indent=2) if args.json
              else format_table(counts, input_rms(given, args.arms),
                                config.model.init_method_std))
        return counts


if __name__ == "__main__":
    main(sys.argv[1:])
