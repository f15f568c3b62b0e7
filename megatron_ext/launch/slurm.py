"""Slurm jobs of training runs: the batch scripts filled from the templates in slurm/, and
their submission with sbatch (tools/submit.py's arms, tools/study.py's runs).

A job script is slurm/fixedcode.sbatch with the run's training flags (a recipe, the run's
own flags, and where it saves: :func:`run_flags`), the resources and the preemption
settings (:func:`add_job_args`); the optional cache job is slurm/build_data_cache.sbatch.
The templates and the entry script are read from the source checkout this package is
installed from (``make`` installs it editable).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

from ..config import recipes
from ..config.arguments import check_run_flags
from ..runtime.errors import FixedcodeError, LaunchError

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "slurm" / "fixedcode.sbatch"
CACHE_TEMPLATE = REPO / "slurm" / "build_data_cache.sbatch"
CACHE_JOB = "data_cache"  # its folder in RUN_DIR, and its job name's suffix
# Set here per run (or always): a recipe that sets them is refused.
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


@dataclasses.dataclass(frozen=True)
class Job:
    """A job's resources and preemption settings: the flags of :func:`add_job_args`, checked,
    with their defaults resolved (the parsed flags are left as given)."""
    nodes: int
    gpus_per_node: int
    ntasks_per_node: int
    cpus_per_task: Optional[int]
    time: Optional[str]
    partition: Optional[str]
    account: Optional[str]
    signal_secs: int
    max_restarts: int
    container_image: Optional[str]
    container_mounts: Optional[str]
    python: str


def job_options(p: argparse.ArgumentParser, args: argparse.Namespace, run_dir: Path) -> Job:
    """The :class:`Job` of the flags; a bad one is a parser error naming the flag."""
    for flag in ("nodes", "signal_secs"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1")
    for flag in ("gpus_per_node", "max_restarts"):
        if getattr(args, flag) < 0:
            p.error(f"--{flag.replace('_', '-')} must be >= 0")
    if args.ntasks_per_node is None and args.gpus_per_node == 0:
        p.error("--ntasks-per-node is required with --gpus-per-node 0")
    if args.container_mounts and not args.container_image:
        p.error("--container-mounts needs --container-image")
    if any(c.isspace() for c in str(run_dir)):
        p.error(f"{run_dir}: no whitespace allowed (it goes into #SBATCH lines)")
    python = args.python or ("python" if args.container_image else sys.executable)
    return Job(**{**{f.name: getattr(args, f.name) for f in dataclasses.fields(Job)},
                  "ntasks_per_node": args.ntasks_per_node or args.gpus_per_node,
                  "python": python})


def check_cache_recipe(recipe: List[str], path: Path) -> None:
    """--build-cache needs a recipe with --data-cache-path and indexed data: a build job that
    fails would leave the arms' jobs waiting on it for ever (DependencyNeverSatisfied)."""
    given = {token.split("=")[0] for token in recipe}
    if "--data-cache-path" not in given:
        raise LaunchError(f"--build-cache: recipe {path} sets no --data-cache-path, the "
                          f"directory (shared by every node) the caches are built into")
    if "--mock-data" in given:
        raise LaunchError(f"--build-cache: recipe {path} trains on --mock-data, which "
                          f"has no index caches to build")


def read_job_recipe(path: Path) -> List[str]:
    """The recipe's flags, refusing the ones submit.py sets per arm."""
    return recipes.read_recipe(path, PER_ARM_FLAGS, "tools/submit.py sets in every job script")


def run_flags(recipe: List[str], run_dir: Path, own: List[str]) -> List[str]:
    """A run's training flags: the recipe, the run's ``own`` flags, and where it saves."""
    ckpt = str(run_dir / "checkpoints")
    return recipe + own + ["--save", ckpt, "--load", ckpt,
                           "--tensorboard-dir", str(run_dir / "tensorboard"),
                           "--exit-signal-handler"]


def check_job_runs(runs: dict) -> None:
    """Refuse, naming the job and the flag, where a job's run (``{name: its flags}``, as
    :func:`run_flags` gives them) would refuse its flags when it starts: the checks that need
    only the flags (``RunConfig.validate``), before anything is queued."""
    for name, flags in runs.items():
        try:
            check_run_flags(flags)
        except FixedcodeError as e:
            raise LaunchError(f"{name}: {e}") from e
        except SystemExit as e:  # argparse's refusal of a value (it printed why)
            raise LaunchError(f"{name}: its flags do not parse: {e.code or 'see above'}") from e


def flag_lines(flags: List[str]) -> str:
    """One ``--flag [values]`` per line, shell-quoted, for the TRAIN_ARGS array."""
    lines: List[List[str]] = []
    for token in flags:
        if token.startswith("--") or not lines:
            lines.append([])
        lines[-1].append(shlex.quote(token))
    return "\n".join("    " + " ".join(line) for line in lines)


def sbatch_directives(job: Job, job_name: str) -> str:
    options = [("job-name", job_name), ("nodes", job.nodes),
               ("ntasks-per-node", job.ntasks_per_node)]
    if job.gpus_per_node:
        options.append(("gpus-per-node", job.gpus_per_node))
    return directive_lines(options + [(name, getattr(job, name)) for name in
                                      ("cpus_per_task", "time", "partition", "account")])


def directive_lines(options) -> str:
    """``#SBATCH --name=value`` per ``(name, value)``, skipping None values."""
    return "\n".join(f"#SBATCH --{name.replace('_', '-')}={value}" for name, value in options
                     if value is not None)


def container_args(job: Job, run_dir: Path) -> str:
    if not job.container_image:
        return ""
    dirs = [REPO] + ([] if run_dir.is_relative_to(REPO) else [run_dir])
    mounts = ",".join([f"{d}:{d}" for d in dirs]
                      + ([job.container_mounts] if job.container_mounts else []))
    return " ".join(shlex.quote(a) for a in (f"--container-image={job.container_image}",
                                             f"--container-mounts={mounts}",
                                             f"--container-workdir={REPO}"))


def render(path: Path, fields: dict) -> str:
    """Fill every ``{{NAME}}`` of the template at ``path``; a missing or an unused field is an
    error."""
    template = path.read_text()
    names = set(re.findall(r"\{\{(\w+)\}\}", template))
    if names != set(fields):
        raise LaunchError(f"{path} fields {sorted(names)} do not match "
                          f"megatron_ext/launch/slurm.py's {sorted(fields)}")
    return re.sub(r"\{\{(\w+)\}\}", lambda m: str(fields[m.group(1)]), template)


def job_script(job: Job, job_name: str, run_dir: Path, flags: List[str],
               mount_dir: Path) -> str:
    """The batch script of one run (training ``flags``, log in ``run_dir``); ``mount_dir``
    is mounted into a container."""
    return render(TEMPLATE, {
        "SBATCH_DIRECTIVES": sbatch_directives(job, job_name),
        "LOG": run_dir / "slurm-%j.log",
        "RUN_DIR": shlex.quote(str(run_dir)),
        "SIGNAL_SECS": job.signal_secs,
        "MAX_RESTARTS": job.max_restarts,
        "CONTAINER_ARGS": container_args(job, mount_dir),
        "TRAIN_ARGS": flag_lines(flags),
        "REPO": shlex.quote(str(REPO)),
        "PYTHON": shlex.quote(job.python),
    })


def cache_job_script(job: Job, recipe: List[str], run_dir: Path, mount_dir: Path,
                     resources: dict) -> str:
    """The batch script of the job that builds the recipe's dataset index caches into
    ``run_dir``: one task on one node, no GPU, sized by ``resources`` (``cpus-per-task``,
    ``time``, ``partition``: the --build-cache-* options; default the partition of ``job``);
    the builder is told the training job's world size (the default global batch depends on
    it)."""
    world = job.nodes * job.ntasks_per_node
    return render(CACHE_TEMPLATE, {
        "SBATCH_DIRECTIVES": directive_lines([
            ("job-name", f"{mount_dir.name}-{CACHE_JOB}"), ("nodes", 1), ("ntasks", 1),
            ("cpus-per-task", resources.get("cpus-per-task")), ("time", resources.get("time")),
            ("partition", resources.get("partition") or job.partition),
            ("account", job.account)]),
        "LOG": run_dir / "slurm-%j.log",
        "CONTAINER_ARGS": container_args(job, mount_dir),
        "BUILD_ARGS": flag_lines(recipe + ["--world-size", str(world)]),
        "REPO": shlex.quote(str(REPO)),
        "PYTHON": shlex.quote(job.python),
    })


def submit(script: Path, after: Optional[str] = None) -> str:
    """Submit ``script`` (to start once job ``after`` has succeeded); the job id. The
    dependency is given to sbatch, not written in the script, so the script can be
    resubmitted by hand later."""
    if shutil.which("sbatch") is None:
        raise LaunchError("sbatch not found: run on a Slurm login node, or use --dry-run")
    dependency = [f"--dependency=afterok:{after}"] if after else []
    done = subprocess.run(["sbatch", "--parsable", *dependency, str(script)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise LaunchError(f"sbatch {script} failed: {done.stderr.strip()}")
    return done.stdout.strip().split(";")[0]


def write_and_submit(run_dir: Path, script: str, after: Optional[str] = None) -> str:
    """Write ``run_dir/job.sbatch`` and submit it (after job ``after``); the job id."""
    run_dir.mkdir(parents=True, exist_ok=True)   # Slurm does not create the log's folder
    (run_dir / "job.sbatch").write_text(script)
    return submit(run_dir / "job.sbatch", after)
