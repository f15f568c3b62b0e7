"""Plan a recipe's runs before they are queued: memory per GPU, time and GPU-hours.

From the recipe's flags and the cluster alone (no GPU, no data): per arm, the bytes per GPU
of weights, gradients, optimizer state and activations on the most loaded pipeline stage
(with Megatron-LM's start-up line, ``Theoretical memory footprints: weight and
optimizer=... MB, activation=... MB, total=... MB``), FLOPs per iteration, and the days and
GPU-hours to the last iteration at the measured MFU (bench/RESULTS.md) and at
``--assume-mfu``; with ``--study``, every run of a study and their total
(megatron_ext/launch/plan.py). A run that does not fit ``--gpu-memory`` is an error::

    python tools/plan.py --recipe examples/smollm2_1p7b/recipe.args --nodes 8 \\
        --gpus-per-node 8 --gpu-memory 80 --vocab-size 49152 [--arms learned,binary,gf2]
    python tools/plan.py --study examples/smollm2_1p7b/study_100b.toml --nodes 8 \\
        --gpus-per-node 8 --gpu-memory 80 --vocab-size 49152 --assume-mfu 0.4
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from megatron_ext.codes.limits import ARMS
from megatron_ext.config.data_config import DataConfig
from megatron_ext.config.flag_fields import add_flags
from megatron_ext.config.recipes import RecipeFile
from megatron_ext.launch.plan import Cluster, add_plan_args, check_fits, plan_arms, plan_table
from megatron_ext.launch.slurm import Layout, read_job_recipe
from megatron_ext.runtime.errors import exits_on_error
from megatron_ext.study import launch, spec


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    what = p.add_mutually_exclusive_group(required=True)
    add_flags(what, RecipeFile)
    add_flags(what, spec.StudyFlags, only=("study",))
    add_flags(p, spec.StudyFlags, only=("arms",))
    add_flags(p, Layout)
    add_flags(p, DataConfig, only=("vocab_size",), helps={
        "vocab_size": "the tokenizer's vocabulary size, where the recipe's tokenizer is not "
                      "readable here (default: read from it)"})
    add_plan_args(p)
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> list:
    with exits_on_error():
        args = parse_args(argv)
        cluster = Cluster.from_flags(args)
        recipe = RecipeFile.from_flags(args).recipe
        vocab_size = DataConfig.from_flags(args).vocab_size
        named = spec.StudyFlags.from_flags(args)
        if recipe:
            arms = [spec.parse_arm(a, ARMS) for a in named.arms.split(",") if a]
            plans = plan_arms(read_job_recipe(recipe),
                              [(arm.name, arm.training_flags()) for arm in arms], cluster,
                              vocab_size)
        else:
            study = spec.study_from_flags(named.study, dict.fromkeys(
                ("recipe", "arms", "seeds", "control")), {})
            plans = launch.plan_study(study, cluster, vocab_size)
        print(plan_table(plans, cluster))
        check_fits(plans, cluster)
        return plans


if __name__ == "__main__":
    main(sys.argv[1:])
