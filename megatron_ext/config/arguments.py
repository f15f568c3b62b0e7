"""pretrain_fixedcode.py's flags, parsed: the parser made from the configs' fields (one
declaration per flag, ``flag_fields.py``), in the ``--help`` groups below, with the
Megatron-LM flags fixedcode refuses or takes as no-ops, ``--preset``'s shapes as defaults,
and the parsed flags turned into the run's config once (:func:`parse_run_config`).

One parser serves the training entry point and the tools (parameter report, planner, cache
builder), so a flag means the same thing everywhere: the model groups (:data:`MODEL_GROUPS`,
:func:`build_parser`) and the training ones (:data:`TRAINING_GROUPS`,
:func:`add_training_args`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional, Sequence

from ..runtime.errors import FlagError
from .checkpoint_config import CheckpointConfig
from .data_config import TOKENIZER_GROUP, DataConfig
from .flag_fields import ShowDefaults, add_flags
from .logging_config import PROFILING_GROUP, LoggingConfig
from .model_config import INPUT_GROUP, PRESETS, RECOMPUTE_GROUP, ModelConfig
from .parallel_config import ParallelConfig
from .run_config import CONCERNS, RunConfig
from .training_config import TrainingConfig

# Megatron-LM flags a recipe may carry that fixedcode does not take, with why; each is
# refused by name (not argparse's "unrecognized arguments"). docs/training.md lists them.
REFUSED_FLAGS = {
    "--context-parallel-size": "context parallelism is not implemented (TP, PP, DP only)",
    "--num-experts": "the backbone is dense: mixture-of-experts layers are not built",
    "--start-weight-decay": "the weight decay is constant: give --weight-decay",
    "--end-weight-decay": "the weight decay is constant: give --weight-decay",
    "--weight-decay-incr-style": "the weight decay is constant: give --weight-decay",
    "--check-for-nan-in-loss-and-grad": "non-finite steps are always checked and skipped on "
                                        "every rank; --max-nonfinite-steps bounds them",
    "--rerun-mode": "the rerun state machine is not part of fixedcode",
    "--legacy-tokenizer": "the tokenizers have megatron.core's semantics (docs/data.md)",
    "--vocab-extra-ids": "no tokens are added to the tokenizer's vocabulary",
    "--use-flash-attn": "give --attention-backend flash",
    "--dataloader-type": "the loader is fixedcode's resumable sampler (Megatron-LM's single)",
    "--rotary-percent": "RoPE rotates the whole head: partial rotary embeddings are not built",
}
# Of those, the values that ask for what fixedcode does anyway: taken, so that a Megatron-LM
# script passing them runs unchanged.
NO_OP_VALUES = {"--context-parallel-size": ("1",), "--dataloader-type": ("single",),
                "--rotary-percent": ("1", "1.0")}
# Megatron-LM switches that ask for what fixedcode always does, taken and ignored.
NO_OP_SWITCHES = {
    "--log-throughput": "throughput is always logged",
    "--use-mcore-models": "the models are always Megatron-Core's (deprecated in Megatron-LM)",
    "--no-create-attention-mask-in-dataloader": "no mask is built unless "
                                                "--reset-attention-mask",
}


class Refused(argparse.Action):
    """A Megatron-LM flag fixedcode does not take: an error naming it and why (taken at its
    :data:`NO_OP_VALUES`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        taken = NO_OP_VALUES.get(option_string, ())
        if list(values) and all(v in taken for v in values):
            return
        raise FlagError(f"{option_string} (Megatron-LM's) is not supported: "
                        f"{REFUSED_FLAGS[option_string]}"
                        + (f" (it is taken as {taken[0]} only)" if taken else ""))


class Ignored(argparse.Action):
    """A Megatron-LM switch that asks for what fixedcode always does: taken, nothing set."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        pass


REFUSED_GROUP = "Megatron-LM flags refused (each says why)"
# The --help groups, in their order: the model's (every tool that builds or counts a model),
# then training's.
MODEL_GROUPS = (ModelConfig.FLAG_GROUP, INPUT_GROUP, ParallelConfig.FLAG_GROUP,
                RECOMPUTE_GROUP, TOKENIZER_GROUP)
TRAINING_GROUPS = (TrainingConfig.FLAG_GROUP, DataConfig.FLAG_GROUP, LoggingConfig.FLAG_GROUP,
                   PROFILING_GROUP, REFUSED_GROUP, CheckpointConfig.FLAG_GROUP)


def add_groups(parser: argparse.ArgumentParser, titles: Sequence[str]) -> None:
    """The flags of the configs' fields in the ``--help`` groups ``titles``."""
    for title in titles:
        if title == REFUSED_GROUP:
            add_refused_args(parser)
            continue
        group = parser.add_argument_group(title)
        for concern in CONCERNS:
            add_flags(group, concern, title)


def add_refused_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(REFUSED_GROUP)
    for flag, why in REFUSED_FLAGS.items():
        taken = NO_OP_VALUES.get(flag)
        g.add_argument(flag, action=Refused, nargs="*", default=argparse.SUPPRESS,
                       help=f"refused: {why}" + (f" (taken: {taken[0]})" if taken else ""))
    g = parser.add_argument_group("Megatron-LM switches taken as they ask for what is done "
                                  "anyway")
    for flag, why in NO_OP_SWITCHES.items():
        g.add_argument(flag, action=Ignored, help=why)


def build_parser(description: str) -> argparse.ArgumentParser:
    """The parser of the model flags (:data:`MODEL_GROUPS`)."""
    parser = argparse.ArgumentParser(description=description, allow_abbrev=False,
                                     formatter_class=ShowDefaults)
    add_groups(parser, MODEL_GROUPS)
    return parser


def add_training_args(parser: argparse.ArgumentParser) -> None:
    """The flags of the training entry point besides the model's (:data:`TRAINING_GROUPS`)."""
    add_groups(parser, TRAINING_GROUPS)


def parse_flags(argv: Optional[Sequence[str]], description: str,
                extra: Optional[Callable] = None) -> argparse.Namespace:
    """Parse ``argv`` with the model flags (and ``extra(parser)`` groups); ``--preset``'s
    shape fills the flags the command line leaves (its values are the defaults)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(description)
    if extra is not None:
        extra(parser)
    chosen = parser.parse_known_args(argv)[0].preset
    if chosen:
        parser.set_defaults(**PRESETS[chosen])
    return parser.parse_args(argv)


def parse_model_config(argv: Optional[Sequence[str]], description: str,
                       extra: Optional[Callable] = None
                       ) -> tuple[RunConfig, argparse.Namespace]:
    """The config of a tool that builds or counts a model (its flags beside, for the tool's
    own), the model flags refused as training refuses them (:meth:`ModelConfig.validate`)."""
    flags = parse_flags(argv, description, extra)
    config = RunConfig.from_flags(flags).with_dependent_defaults()
    config.model.validate()
    return config, flags


def parse_run_config(argv: Optional[Sequence[str]], description: str,
                     fill: Optional[Callable[[RunConfig], RunConfig]] = None) -> RunConfig:
    """pretrain_fixedcode.py's flags as the run's config, built once, with ``fill``'s flags
    (taken from elsewhere: the entry point's ``--use-checkpoint-args``) and the defaults that
    depend on other flags; refused by every check the flags alone allow
    (:meth:`RunConfig.validate`) before anything starts."""
    config = RunConfig.from_flags(parse_flags(argv, description, add_training_args))
    if fill is not None:
        config = fill(config)
    config = config.with_dependent_defaults()
    config.validate()
    return config


def read_training_flags(flags: Sequence[str]) -> RunConfig:
    """pretrain_fixedcode.py's flags ``flags`` as its parser reads them, neither validated nor
    filled (flags it does not know are left out): what the study tools read off a recipe."""
    parser = build_parser("")
    add_training_args(parser)
    return RunConfig.from_flags(parser.parse_known_args(list(flags))[0])


def check_run_flags(flags: Sequence[str]) -> RunConfig:
    """The config of a run that will start with ``flags`` (a study's run, a job to submit),
    refused now as the run would refuse them when it starts (``--use-checkpoint-args`` left
    out: there is no checkpoint to read yet)."""
    return parse_run_config(flags, "")
