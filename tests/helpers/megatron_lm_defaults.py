"""Megatron-LM's flag defaults, as its parser builds them, for the test that holds ours to them
(tests/unit/test_megatron_flags.py). megatron-core's wheel has no ``megatron.training``; this
reads it from a Megatron-LM checkout of the pinned release, with the installed megatron-core,
and writes ``{dest: default}`` as JSON (an enum as its name)::

    git clone -b core_v0.16.1 https://github.com/NVIDIA/Megatron-LM /tmp/Megatron-LM
    .venv/bin/python tests/helpers/megatron_lm_defaults.py /tmp/Megatron-LM \\
        > tests/data/megatron_lm_core_v0.16.1_defaults.json

``megatron.training``'s package imports the whole trainer; only its ``arguments`` module is
loaded, beside stand-ins for the few helpers that module imports.
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
import types
import warnings


def megatron_lm_defaults(checkout: str) -> dict:
    warnings.filterwarnings("ignore")
    import megatron  # noqa: F401  (megatron-core, the installed one)

    def unused(*args, **kwargs):
        return None

    training = types.ModuleType("megatron.training")
    training.__path__ = [f"{checkout}/megatron/training"]
    utils = types.ModuleType("megatron.training.utils")
    for module in (training, utils):
        for name in ("get_args", "get_timers", "get_adlr_autoresume", "get_tokenizer",
                     "get_wandb_writer", "get_tensorboard_writer", "print_rank_0",
                     "get_one_logger", "is_last_rank", "print_rank_last",
                     "get_device_arch_version", "update_use_dist_ckpt", "warn_rank_0"):
            setattr(module, name, unused)
    sys.modules.update({"megatron.training": training, "megatron.training.utils": utils})
    from megatron.training import arguments
    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    return {dest: value.name if isinstance(value, enum.Enum) else value
            for dest, value in sorted(vars(parser.parse_args([])).items())}


if __name__ == "__main__":
    json.dump(megatron_lm_defaults(sys.argv[1]), sys.stdout, indent=0, sort_keys=True,
              default=str)
    sys.stdout.write("\n")
