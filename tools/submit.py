"""Submit the fixedcode arms to Slurm from one recipe, with one command.

The recipe is a file of pretrain_fixedcode.py flags (model shape, data, schedule; ``#``
comments allowed) shared by every arm. For each arm megatron_ext/launch/slurm.py fills
slurm/fixedcode.sbatch (job name, log, ``--input-interface``, ``--save``/``--load``,
``--tensorboard-dir``); this writes it to RUN_DIR/ARM/job.sbatch and submits it with sbatch;
``--dry-run`` prints the scripts and touches nothing. First it checks each arm's flags as its
job will start with them (what a run refuses before it starts), then prints the plan of each arm
(memory per GPU, time, GPU-hours: megatron_ext/launch/plan.py) and refuses to submit an arm
that does not fit ``--gpu-memory``. ``--build-cache`` first queues a CPU job
(slurm/build_data_cache.sbatch, RUN_DIR/data_cache/) that builds the recipe's dataset index caches
into its ``--data-cache-path``; the arms' jobs wait for it (``--dependency=afterok``) and load the
caches with ``--require-data-cache``. Usage::

    python tools/submit.py --recipe RECIPE --run-dir RUN_DIR [--nodes 4 --gpus-per-node 8]
    python tools/submit.py --recipe slurm/recipes/tiny_cpu.args --run-dir runs/tiny \\
        --gpus-per-node 0 --ntasks-per-node 2 --dry-run
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from megatron_ext.codes.limits import ARMS
from megatron_ext.config.flag_fields import add_flags
from megatron_ext.config.recipes import RecipeFile
from megatron_ext.study.spec import StudyFlags, parse_arm
from megatron_ext.launch.plan import (Cluster, add_plan_args, check_fits, plan_arms,
                                      plan_submission)
from megatron_ext.launch.slurm import (CACHE_GROUP, CACHE_JOB, Job, Submission, add_job_args,
                                       cache_job_script, check_cache_recipe, check_job_runs,
                                       job_script, read_job_recipe, run_flags, write_and_submit)
from megatron_ext.runtime.errors import StudyError, exits_on_error



def parse_args(argv: Optional[Sequence[str]]) -> tuple[argparse.Namespace, Job, list]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    add_flags(p, RecipeFile, required=("recipe",))
    add_flags(p, Submission, only=("run_dir",), required=("run_dir",))
    add_flags(p, StudyFlags, only=("arms",))
    add_job_args(p)
    add_flags(p.add_argument_group(CACHE_GROUP), Submission, title=CACHE_GROUP)
    add_plan_args(p)
    add_flags(p, Submission, only=("dry_run",))
    args = p.parse_args(argv)
    try:
        arms = [parse_arm(spec, ARMS) for spec in args.arms.split(",") if spec]
    except StudyError as error:
        p.error(f"--arms: {error}")
    if not arms:
        p.error(f"--arms: give one arm or more of {', '.join(ARMS)}")
    return args, Job.from_flags(args).for_run_dir(args.run_dir.resolve()), arms


def main(argv: Optional[Sequence[str]] = None) -> None:
    with exits_on_error():
        args, job, arms = parse_args(argv)
        run_dir = args.run_dir.resolve()
        recipe = read_job_recipe(args.recipe)
        if args.build_cache:
            check_cache_recipe(recipe, args.recipe)
        own = ["--require-data-cache"] if (args.build_cache and
                                           "--require-data-cache" not in recipe) else []
        runs = {arm.name: run_flags(recipe, run_dir / arm.name, arm.training_flags() + own)
                for arm in arms}
        check_job_runs(runs)  # each arm's flags, as its job will start, before anything is queued
        if job.gpus_per_node:  # the plan, checked before anything is queued
            cluster = Cluster.from_flags(args, nodes=job.nodes,
                                         gpus_per_node=job.ntasks_per_node)
            plans, table = plan_submission(recipe, lambda vocab: plan_arms(
                recipe, [(arm.name, arm.training_flags()) for arm in arms], cluster, vocab),
                cluster)
            print(table)
            check_fits(plans, cluster)
        cache_job = None
        if args.build_cache:
            cache_dir = run_dir / CACHE_JOB
            script = cache_job_script(job, recipe, cache_dir, run_dir, {
                "cpus-per-task": args.build_cache_cpus_per_task, "time": args.build_cache_time,
                "partition": args.build_cache_partition})
            if args.dry_run:
                print(f"# ===== {CACHE_JOB}: {cache_dir / 'job.sbatch'} =====\n{script}")
                cache_job = "CACHE_JOB_ID"
            else:
                cache_job = write_and_submit(cache_dir, script)
                print(f"{CACHE_JOB}: job {cache_job}, log {cache_dir / f'slurm-{cache_job}.log'}")
        for arm in arms:
            arm_dir = run_dir / arm.name
            script = job_script(job, f"{run_dir.name}-{arm.name}", arm_dir, runs[arm.name],
                                run_dir)
            if args.dry_run:
                after = (f"# submitted with: sbatch --dependency=afterok:{cache_job} "
                         f"{arm_dir / 'job.sbatch'}\n" if cache_job else "")
                print(f"# ===== {arm.name}: {arm_dir / 'job.sbatch'} =====\n{after}{script}")
                continue
            job_id = write_and_submit(arm_dir, script, cache_job)
            print(f"{arm.name}: job {job_id}" + (f" (after job {cache_job})" if cache_job else "")
                  + f", log {arm_dir / f'slurm-{job_id}.log'}")


if __name__ == "__main__":
    main()
