"""Submit the fixedcode arms to Slurm from one recipe, with one command.

The recipe is a file of pretrain_fixedcode.py flags (model shape, data, schedule; ``#``
comments allowed) shared by every arm. For each arm this fills slurm/fixedcode.sbatch
(job name, log, ``--input-interface``, ``--save``/``--load``, ``--tensorboard-dir``), writes
it to RUN_DIR/ARM/job.sbatch and submits it with sbatch; ``--dry-run`` prints the scripts
and touches nothing. ``--build-cache`` first queues a CPU job (slurm/build_data_cache.sbatch,
RUN_DIR/data_cache/) that builds the recipe's dataset index caches into its
``--data-cache-path``; the arms' jobs wait for it (``--dependency=afterok``) and load the
caches with ``--require-data-cache``. Usage::

    python tools/submit.py --recipe RECIPE --run-dir RUN_DIR [--nodes 4 --gpus-per-node 8]
    python tools/submit.py --recipe slurm/recipes/tiny_cpu.args --run-dir runs/tiny \\
        --gpus-per-node 0 --ntasks-per-node 2 --dry-run
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from megatron_ext import recipes

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "slurm" / "fixedcode.sbatch"
CACHE_TEMPLATE = REPO / "slurm" / "build_data_cache.sbatch"
CACHE_JOB = "data_cache"  # its folder in RUN_DIR, and its job name's suffix
ARMS = ("learned", "binary", "gf2", "permuted", "random")  # --input-interface choices
DEFAULT_ARMS = ("learned", "binary", "gf2")  # the paper's comparison
# Set here per arm (or always): a recipe that sets them is refused.
PER_ARM_FLAGS = ("--input-interface", "--save", "--load", "--tensorboard-dir",
                 "--exit-signal-handler")


def add_job_args(p: argparse.ArgumentParser) -> None:
    """The job options (resources, preemption, container), shared with tools/study.py."""
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=8,
                   help="0: CPU-only job (no GPU request; then --ntasks-per-node is required)")
    p.add_argument("--ntasks-per-node", type=int,
                   help="training ranks per node (default: --gpus-per-node, one rank per GPU)")
    p.add_argument("--cpus-per-task", type=int, help="also sets OMP_NUM_THREADS")
    p.add_argument("--time", help="sbatch --time limit of each run, e.g. 04:00:00")
    p.add_argument("--partition")
    p.add_argument("--account")
    p.add_argument("--signal-secs", type=int, default=300,
                   help="SIGUSR1 this many seconds before the time limit: the ranks save and "
                        "exit, the job requeues itself (default 300; >= one step + one save)")
    p.add_argument("--max-restarts", type=int, default=20,
                   help="requeue at most this many times (SLURM_RESTART_COUNT); 0: never")
    p.add_argument("--container-image",
                   help="pyxis/enroot image for srun; the repo and the run folder are mounted "
                        "at their own paths")
    p.add_argument("--container-mounts", help="extra pyxis mounts, SRC:DST[,SRC:DST...]")
    p.add_argument("--python",
                   help="interpreter on the nodes (default: this one; 'python' in a container)")


def check_job_args(p: argparse.ArgumentParser, args: argparse.Namespace,
                   run_dir: Path) -> None:
    """Validate the job options (errors name the flag) and fill their defaults."""
    for flag in ("nodes", "signal_secs"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1")
    for flag in ("gpus_per_node", "max_restarts"):
        if getattr(args, flag) < 0:
            p.error(f"--{flag.replace('_', '-')} must be >= 0")
    if args.ntasks_per_node is None:
        if args.gpus_per_node == 0:
            p.error("--ntasks-per-node is required with --gpus-per-node 0")
        args.ntasks_per_node = args.gpus_per_node
    if args.container_mounts and not args.container_image:
        p.error("--container-mounts needs --container-image")
    if args.python is None:
        args.python = "python" if args.container_image else sys.executable
    if any(c.isspace() for c in str(run_dir)):
        p.error(f"{run_dir}: no whitespace allowed (it goes into #SBATCH lines)")


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--recipe", required=True, type=Path,
                   help="file of pretrain_fixedcode.py flags shared by the arms")
    p.add_argument("--run-dir", required=True, type=Path,
                   help="per arm: RUN_DIR/ARM/{checkpoints,tensorboard,slurm-ID.log,job.sbatch}")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                   help="comma-separated subset of %s (default: %s)" % (",".join(ARMS),
                                                                      ",".join(DEFAULT_ARMS)))
    add_job_args(p)
    c = p.add_argument_group("dataset index caches built ahead (--build-cache)")
    c.add_argument("--build-cache", action="store_true",
                   help="first queue a CPU job that builds the recipe's dataset index caches "
                        "into its --data-cache-path (tools/build_data_cache.py); the arms' jobs "
                        "start when it succeeds (--dependency=afterok) and load them with "
                        "--require-data-cache, never build them")
    c.add_argument("--build-cache-partition",
                   help="partition of the cache job, e.g. a CPU one (default: --partition)")
    c.add_argument("--build-cache-time",
                   help="sbatch --time limit of the cache job (default: the partition's)")
    c.add_argument("--build-cache-cpus-per-task", type=int,
                   help="CPUs of the cache job's one task (default: Slurm's)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the generated scripts; write and submit nothing")
    args = p.parse_args(argv)

    args.arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(args.arms) - set(ARMS))
    if unknown or not args.arms:
        p.error(f"--arms: unknown arm(s) {unknown or args.arms}; choose from {', '.join(ARMS)}")
    args.run_dir = args.run_dir.resolve()
    check_job_args(p, args, args.run_dir)
    if args.build_cache_partition is None:
        args.build_cache_partition = args.partition
    return args


def check_cache_recipe(recipe: List[str], path: Path) -> None:
    """--build-cache needs a recipe with --data-cache-path and indexed data: a build job that
    fails would leave the arms' jobs waiting on it for ever (DependencyNeverSatisfied)."""
    given = {token.split("=")[0] for token in recipe}
    if "--data-cache-path" not in given:
        raise SystemExit(f"error: --build-cache: recipe {path} sets no --data-cache-path, the "
                         f"directory (shared by every node) the caches are built into")
    if "--mock-data" in given:
        raise SystemExit(f"error: --build-cache: recipe {path} trains on --mock-data, which "
                         f"has no index caches to build")


def read_recipe(path: Path) -> List[str]:
    """The recipe's flags, refusing the ones submit.py sets per arm."""
    return recipes.read_recipe(path, PER_ARM_FLAGS, "tools/submit.py sets in every job script")


def run_flags(recipe: List[str], run_dir: Path, own: List[str]) -> List[str]:
    """A run's training flags: the recipe, the run's ``own`` flags, and where it saves."""
    ckpt = str(run_dir / "checkpoints")
    return recipe + own + ["--save", ckpt, "--load", ckpt,
                           "--tensorboard-dir", str(run_dir / "tensorboard"),
                           "--exit-signal-handler"]


def flag_lines(flags: List[str]) -> str:
    """One ``--flag [values]`` per line, shell-quoted, for the TRAIN_ARGS array."""
    lines: List[List[str]] = []
    for token in flags:
        if token.startswith("--") or not lines:
            lines.append([])
        lines[-1].append(shlex.quote(token))
    return "\n".join("    " + " ".join(line) for line in lines)


def sbatch_directives(args: argparse.Namespace, job_name: str) -> str:
    options = [("job-name", job_name), ("nodes", args.nodes),
               ("ntasks-per-node", args.ntasks_per_node)]
    if args.gpus_per_node:
        options.append(("gpus-per-node", args.gpus_per_node))
    return directive_lines(options + [(name, getattr(args, name)) for name in
                                      ("cpus_per_task", "time", "partition", "account")])


def directive_lines(options) -> str:
    """``#SBATCH --name=value`` per ``(name, value)``, skipping None values."""
    return "\n".join(f"#SBATCH --{name.replace('_', '-')}={value}" for name, value in options
                     if value is not None)


def container_args(args: argparse.Namespace, run_dir: Path) -> str:
    if not args.container_image:
        return ""
    dirs = [REPO] + ([] if run_dir.is_relative_to(REPO) else [run_dir])
    mounts = ",".join([f"{d}:{d}" for d in dirs]
                      + ([args.container_mounts] if args.container_mounts else []))
    return " ".join(shlex.quote(a) for a in (f"--container-image={args.container_image}",
                                             f"--container-mounts={mounts}",
                                             f"--container-workdir={REPO}"))


def render(path: Path, fields: dict) -> str:
    """Fill every ``{{NAME}}`` of the template at ``path``; a missing or an unused field is an
    error."""
    template = path.read_text()
    names = set(re.findall(r"\{\{(\w+)\}\}", template))
    if names != set(fields):
        raise SystemExit(f"error: {path} fields {sorted(names)} do not match "
                         f"tools/submit.py's {sorted(fields)}")
    return re.sub(r"\{\{(\w+)\}\}", lambda m: str(fields[m.group(1)]), template)


def job_script(args: argparse.Namespace, job_name: str, run_dir: Path, flags: List[str],
               mount_dir: Path) -> str:
    """The batch script of one run (training ``flags``, log in ``run_dir``); ``mount_dir``
    is mounted into a container."""
    return render(TEMPLATE, {
        "SBATCH_DIRECTIVES": sbatch_directives(args, job_name),
        "LOG": run_dir / "slurm-%j.log",
        "SIGNAL_SECS": args.signal_secs,
        "MAX_RESTARTS": args.max_restarts,
        "CONTAINER_ARGS": container_args(args, mount_dir),
        "TRAIN_ARGS": flag_lines(flags),
        "REPO": shlex.quote(str(REPO)),
        "PYTHON": shlex.quote(args.python),
    })


def cache_job_script(args: argparse.Namespace, recipe: List[str], run_dir: Path) -> str:
    """The batch script of the job that builds the recipe's dataset index caches: one task
    on one node, no GPU, sized by the --build-cache-* options; the builder is told the
    training job's world size (the default global batch depends on it)."""
    world = args.nodes * args.ntasks_per_node
    return render(CACHE_TEMPLATE, {
        "SBATCH_DIRECTIVES": directive_lines([
            ("job-name", f"{args.run_dir.name}-{CACHE_JOB}"), ("nodes", 1), ("ntasks", 1),
            ("cpus-per-task", args.build_cache_cpus_per_task),
            ("time", args.build_cache_time), ("partition", args.build_cache_partition),
            ("account", args.account)]),
        "LOG": run_dir / "slurm-%j.log",
        "CONTAINER_ARGS": container_args(args, args.run_dir),
        "BUILD_ARGS": flag_lines(recipe + ["--world-size", str(world)]),
        "REPO": shlex.quote(str(REPO)),
        "PYTHON": shlex.quote(args.python),
    })


def submit(script: Path, after: Optional[str] = None) -> str:
    """Submit ``script`` (to start once job ``after`` has succeeded); the job id. The
    dependency is given to sbatch, not written in the script, so the script can be
    resubmitted by hand later."""
    if shutil.which("sbatch") is None:
        raise SystemExit("error: sbatch not found: run on a Slurm login node, or use --dry-run")
    dependency = [f"--dependency=afterok:{after}"] if after else []
    done = subprocess.run(["sbatch", "--parsable", *dependency, str(script)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: sbatch {script} failed: {done.stderr.strip()}")
    return done.stdout.strip().split(";")[0]


def write_and_submit(run_dir: Path, script: str, after: Optional[str] = None) -> str:
    """Write ``run_dir/job.sbatch`` and submit it (after job ``after``); the job id."""
    run_dir.mkdir(parents=True, exist_ok=True)   # Slurm does not create the log's folder
    (run_dir / "job.sbatch").write_text(script)
    return submit(run_dir / "job.sbatch", after)


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    recipe = read_recipe(args.recipe)
    cache_job = own = None
    if args.build_cache:
        check_cache_recipe(recipe, args.recipe)
        cache_dir = args.run_dir / CACHE_JOB
        script = cache_job_script(args, recipe, cache_dir)
        own = [] if "--require-data-cache" in recipe else ["--require-data-cache"]
        if args.dry_run:
            print(f"# ===== {CACHE_JOB}: {cache_dir / 'job.sbatch'} =====\n{script}")
            cache_job = "CACHE_JOB_ID"
        else:
            cache_job = write_and_submit(cache_dir, script)
            print(f"{CACHE_JOB}: job {cache_job}, log {cache_dir / f'slurm-{cache_job}.log'}")
    for arm in args.arms:
        arm_dir = args.run_dir / arm
        script = job_script(args, f"{args.run_dir.name}-{arm}", arm_dir,
                            run_flags(recipe, arm_dir, ["--input-interface", arm] + (own or [])),
                            args.run_dir)
        if args.dry_run:
            after = (f"# submitted with: sbatch --dependency=afterok:{cache_job} "
                     f"{arm_dir / 'job.sbatch'}\n" if cache_job else "")
            print(f"# ===== {arm}: {arm_dir / 'job.sbatch'} =====\n{after}{script}")
            continue
        job_id = write_and_submit(arm_dir, script, cache_job)
        print(f"{arm}: job {job_id}" + (f" (after job {cache_job})" if cache_job else "")
              + f", log {arm_dir / f'slurm-{job_id}.log'}")


if __name__ == "__main__":
    main()
