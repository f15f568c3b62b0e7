"""Build Megatron-Core's dataset index caches ahead of time, in one CPU process.

Give it the training flags (pretrain_fixedcode.py's, or a recipe file of them with
``--recipe``, the flags after it adding to or overriding the recipe's): it derives the
datasets exactly as training does (same seed, sequence length, blend and split, and the train
and valid sample counts of --train-iters or --train-samples x the global batch and
--eval-iters) with training's own functions, builds their document, sample and shuffle indices
(and a blend's) into ``--data-cache-path``, and prints each cache with its samples and files.
Training with the same flags then loads them (``--require-data-cache``: and never builds).
A second run finds them and builds nothing. Usage::

    python tools/build_data_cache.py --recipe examples/smollm2_1p7b/recipe.args --world-size 32
    python tools/build_data_cache.py --num-layers 2 ... --data-path data/x_text_document \\
        --data-cache-path /shared/cache --global-batch-size 64 --train-iters 1000

The global batch defaults to micro batch x data-parallel size in training: without
``--global-batch-size`` give the training job's ``--world-size``. No GPU and no
torch.distributed job are needed (Megatron-Core's blend code asks for a rank: it gets a
one-process group in memory).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Optional, Sequence

import megatron_ext  # noqa: F401  (its warning filters first)
from megatron_ext.config import recipes  # noqa: E402
from megatron_ext.config.arguments import add_training_args, parse_model_config  # noqa: E402
from megatron_ext.config.derived import derive  # noqa: E402
from megatron_ext.config.flag_fields import add_flags  # noqa: E402
from megatron_ext.config.run_config import RunConfig  # noqa: E402
from megatron_ext.datasets.cache import CacheBuild  # noqa: E402
from megatron_ext.datasets.gpt_datasets import build_caches, samples_per_split  # noqa: E402
from megatron_ext.datasets.tokenizer import tokenizer_from_args  # noqa: E402
from megatron_ext.runtime.errors import FlagError, exits_on_error  # noqa: E402

DESCRIPTION = __doc__.splitlines()[0]
RECIPE_HELP = ("file of pretrain_fixedcode.py flags (tools/submit.py's --recipe); flags given "
               "after it add to or override it")


def parse_args(argv: Optional[Sequence[str]] = None) -> tuple[RunConfig, int]:
    """The training run's config and the world size its caches are built for."""
    def add_builder_args(parser: argparse.ArgumentParser) -> None:
        add_training_args(parser)
        g = parser.add_argument_group(CacheBuild.FLAG_GROUP)
        add_flags(g, recipes.RecipeFile, helps={"recipe": RECIPE_HELP})
        add_flags(g, CacheBuild)

    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_flags(pre, recipes.RecipeFile)
    known, rest = pre.parse_known_args(argv)
    recipe = recipes.RecipeFile.from_flags(known).recipe
    flags = recipes.read_recipe(recipe, (), "") if recipe else []
    config, args = parse_model_config(flags + rest, DESCRIPTION, add_builder_args)
    world_size = CacheBuild.from_flags(args).world_size
    config.training.validate()  # the schedule and data flags, as training refuses them
    config.data.validate()
    if not config.data.data_cache_path:
        raise FlagError("give --data-cache-path: the directory the training job loads the "
                        "caches from (shared by all its nodes)")
    if config.data.mock_data:
        raise FlagError("--mock-data: nothing to build ahead (its tokens are drawn when "
                        "training starts)")
    if world_size is None:
        if config.training.global_batch_size is None:
            raise FlagError("give --global-batch-size, or the training job's --world-size: "
                            "the default global batch is --micro-batch-size x the "
                            "data-parallel size")
        return config, config.parallel.model_parallel_size  # the data-parallel size is moot
    config.parallel.check_world(world_size, f"--world-size {world_size}")
    return config, world_size


def main(argv: Optional[Sequence[str]] = None) -> list:
    """Build (or find) the caches; returns the data_cache.CacheRecord of each."""
    with exits_on_error():
        config, world_size = parse_args(argv)
        # Megatron-Core's dataset messages are the progress: "Build and save ..." or "Load ...".
        logging.basicConfig(format="%(message)s")
        logging.getLogger("megatron.core.datasets").setLevel(logging.INFO)
        started = time.monotonic()
        tokenizer = tokenizer_from_args(config.data)
        derived = derive(config, world_size, tokenizer.vocab_size)
        num_samples = samples_per_split(config, derived)
        print(f"[build_data_cache] --data-cache-path {config.data.data_cache_path}: train "
              f"{num_samples[0]:,} samples ({derived.train_iters:,} iterations x global batch "
              f"{derived.global_batch_size:,}), valid {num_samples[1]:,} (--eval-iters "
              f"{config.logging.eval_iters}); --seq-length {config.model.seq_length}, --seed "
              f"{config.training.seed}", flush=True)
        records = build_caches(config, tokenizer, num_samples)
        for r in records:
            print(f"[build_data_cache] {'built' if r.built else 'found'} {r.split} {r.kind} of "
                  f"{r.source}: {r.samples:,} samples")
            for path in r.files:
                size = os.path.getsize(path)
                print(f"    {path} ("
                      + (f"{size / 2**20:,.1f} MiB" if size >= 2**20 else f"{size:,} B") + ")")
        built = sum(r.built for r in records)
        print(f"[build_data_cache] done in {time.monotonic() - started:.1f} s: "
              + (f"built {built} of {len(records)} caches" if built else
                 f"all {len(records)} caches were already there, nothing built"), flush=True)
        return records


if __name__ == "__main__":
    main()
