"""Slurm jobs of training runs: the batch scripts filled from the templates in slurm/, and
their submission with sbatch (tools/submit.py's arms, tools/study.py's runs), and the jobs
already queued (:func:`queued_jobs`, one squeue call).

A job script is slurm/fixedcode.sbatch with the run's training flags (a recipe, the run's
own flags, and where it saves: :func:`run_flags`), the resources and the preemption
settings (:func:`add_job_args`); the optional cache job is slurm/build_data_cache.sbatch.
The templates and the entry script are read from the source checkout this package is
installed from (``make`` installs it editable).
"""

from __future__ import annotations

import dataclasses
import getpass
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

from ..config import recipes
from ..config.arguments import check_run_flags
from ..config.flag_fields import FlagConfig, add_flags, flag
from ..runtime.errors import FixedcodeError, FlagError, LaunchError

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "slurm" / "fixedcode.sbatch"
CACHE_TEMPLATE = REPO / "slurm" / "build_data_cache.sbatch"
CACHE_JOB = "data_cache"  # its folder in RUN_DIR, and its job name's suffix
# Set here per run (or always): a recipe that sets them is refused.
PER_ARM_FLAGS = ("--input-interface", "--save", "--load", "--tensorboard-dir",
                 "--exit-signal-handler")


LAYOUT_GROUP = "layout"


@dataclasses.dataclass(frozen=True)
class Layout(FlagConfig):
    """Nodes x GPUs per node of a run: a job's (:class:`Job`) and a plan's
    (:class:`~megatron_ext.launch.plan.Cluster`), declared once for every tool."""
    nodes: int = flag(1, "nodes per run (default 1)", group=LAYOUT_GROUP)
    gpus_per_node: int = flag(8, "GPUs per node (default 8); 0, a Slurm job only: CPU-only, no "
                                 "GPU request, then --ntasks-per-node is required", least=0,
                              group=LAYOUT_GROUP)


@dataclasses.dataclass(frozen=True)
class Job(Layout):
    """A job's layout, resources and preemption settings, each field declaring its flag
    (shared by tools/submit.py and tools/study.py: :func:`add_job_args`); :meth:`for_run_dir`
    checks them and resolves their defaults."""
    ntasks_per_node: Optional[int] = flag(
        None, "training ranks per node (default: --gpus-per-node, one rank per GPU)")
    cpus_per_task: Optional[int] = flag(None, "also sets OMP_NUM_THREADS")
    time: Optional[str] = flag(None, "sbatch --time limit of each run, e.g. 04:00:00")
    partition: Optional[str] = flag(None, "sbatch --partition of each run")
    account: Optional[str] = flag(None, "sbatch --account of each run")
    signal_secs: int = flag(300, "SIGUSR1 this many seconds before the time limit: the ranks "
                                 "save and exit, the job requeues itself (default 300; >= one "
                                 "step + one save)")
    max_restarts: int = flag(20, "requeue at most this many times (SLURM_RESTART_COUNT); 0: "
                                 "never", least=0)
    container_image: Optional[str] = flag(
        None, "pyxis/enroot image for srun; the repo and the run folder are mounted at their "
              "own paths")
    container_mounts: Optional[str] = flag(None, "extra pyxis mounts, SRC:DST[,SRC:DST...]")
    python: Optional[str] = flag(
        None, "interpreter on the nodes (default: this one; 'python' in a container)")

    def for_run_dir(self, run_dir: Path) -> "Job":
        """The job of the runs in ``run_dir``, its flags checked and its defaults resolved (a
        :class:`FlagError` naming the flag)."""
        if self.ntasks_per_node is None and self.gpus_per_node == 0:
            raise FlagError("--ntasks-per-node is required with --gpus-per-node 0")
        if self.container_mounts and not self.container_image:
            raise FlagError("--container-mounts needs --container-image")
        if any(c.isspace() for c in str(run_dir)):
            raise FlagError(f"{run_dir}: no whitespace allowed (it goes into #SBATCH lines)")
        return self.replace(
            ntasks_per_node=self.ntasks_per_node or self.gpus_per_node,
            python=self.python or ("python" if self.container_image else sys.executable))


CACHE_GROUP = "dataset index caches built ahead (--build-cache)"


@dataclasses.dataclass(frozen=True)
class Submission(FlagConfig):
    """What tools/submit.py queues besides the jobs' resources: the folder of the runs, the
    cache job ahead of them (its own partition, time limit and CPUs), or nothing
    (``dry_run``)."""
    run_dir: Optional[Path] = flag(
        None, "per arm: RUN_DIR/ARM/{checkpoints,tensorboard,slurm-ID.log,job.sbatch}")
    build_cache: bool = flag(
        False, "first queue a CPU job that builds the recipe's dataset index caches into its "
               "--data-cache-path (tools/build_data_cache.py); the arms' jobs start when it "
               "succeeds (--dependency=afterok) and load them with --require-data-cache, never "
               "build them", group=CACHE_GROUP)
    build_cache_partition: Optional[str] = flag(
        None, "partition of the cache job, e.g. a CPU one (default: --partition)",
        group=CACHE_GROUP)
    build_cache_time: Optional[str] = flag(
        None, "sbatch --time limit of the cache job (default: the partition's)",
        group=CACHE_GROUP)
    build_cache_cpus_per_task: Optional[int] = flag(
        None, "CPUs of the cache job's one task (default: Slurm's)", group=CACHE_GROUP)
    dry_run: bool = flag(False, "print the plan and the generated scripts; write and submit "
                                "nothing")


def add_job_args(group) -> None:
    """The job options (resources, preemption, container), shared with tools/study.py."""
    add_flags(group, Job)


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


# How long squeue may take to answer (a controller that is down makes it retry, then fail).
SQUEUE_TIMEOUT = 120


def queued_jobs() -> dict[str, str]:
    """``{job name: job id}`` of this user's jobs that Slurm holds (pending, running,
    completing...), asked with one ``squeue`` call; an empty dict when none is queued. A
    :class:`LaunchError` naming the command and its message when the queue cannot be asked
    (squeue not found, no controller reachable, no answer in :data:`SQUEUE_TIMEOUT` s):
    "could not ask" is never taken for "not queued", which would submit a queued run twice."""
    command = ["squeue", "--noheader", "--user", getpass.getuser(), "--format", "%i %j"]
    shown = shlex.join(command)
    if shutil.which("squeue") is None:
        raise LaunchError(f"{shown}: squeue not found: run on a Slurm login node, or use "
                          f"--dry-run")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=SQUEUE_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"{shown} did not answer in {SQUEUE_TIMEOUT} s: nothing was "
                          f"submitted; retry when the Slurm controller answers") from None
    if done.returncode != 0:
        raise LaunchError(f"{shown} failed (exit {done.returncode}): "
                          f"{(done.stderr or done.stdout).strip()}; nothing was submitted "
                          f"(which runs are queued is not known); retry when the Slurm "
                          f"controller answers")
    jobs = {}
    for line in done.stdout.splitlines():
        job_id, _, name = line.strip().partition(" ")
        if name:
            jobs.setdefault(name.strip(), job_id)
    return jobs


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
