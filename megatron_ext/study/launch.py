"""Launching a study's runs: one after another on this machine (each resuming from its
checkpoints; Ctrl-C lets the current run save and stop), or as one preemption-safe Slurm job
per run (:mod:`megatron_ext.launch.slurm`'s job script); then every checkpoint evaluated (and,
with ``[probes]``, the final ones probed). tools/study.py is the command line.

A run is ``STUDY_DIR/[LEVEL/...]ARM/seedN`` (:func:`.spec.all_runs`); it is finished when
its latest checkpoint is its last iteration, so a rerun skips it. Before any run is started
or submitted, every run's flags, as it will start with them, pass the checks a run makes
before it starts (:func:`check_runs`). Each cell of a study's factors is evaluated as a study
of its own.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

from ..config.arguments import check_run_flags
from ..launch import slurm
from ..runtime.errors import FixedcodeError, Interrupted, StudyError

from . import spec

PRETRAIN = slurm.REPO / "pretrain_fixedcode.py"
Progress = Callable[[str], None]


def _print(message: str) -> None:
    print(message, flush=True)


def finished(run: Path) -> bool:
    """Whether the run's latest checkpoint is its last iteration (a run with no checkpoint
    folder is not, and asks for no import of torch or megatron-core)."""
    ckpt = run / "checkpoints"
    if not ckpt.is_dir():
        return False
    from ..checkpoint.layout import latest_iteration
    from ..checkpoint.loading import load_common
    if latest_iteration(str(ckpt)) is None:
        return False
    common = load_common(str(ckpt))[1]
    return common["iteration"] >= common["args"]["train_iters"]


def run_flags(study: spec.Study, arm: spec.Arm, seed: int, run: Path,
              branched_from: Optional[Path] = None) -> list[str]:
    """A run's flags: the recipe, the arm's, the seed, where it saves (a Slurm job's too);
    a budget's branch loads the run it branches from (its own ``--save`` is resumed first
    once it holds a checkpoint)."""
    flags = slurm.run_flags(list(study.recipe), run, [*arm.training_flags(), "--seed", str(seed)])
    if branched_from is not None:
        flags[flags.index("--load") + 1] = str(branched_from / "checkpoints")
    return flags


def _flags(study_dir: Path, folder: str, cell: spec.Study, arm: spec.Arm, seed: int,
           run: Path) -> list[str]:
    main = spec.branched_from(study_dir, folder, arm, seed) if cell.branch else None
    return run_flags(cell, arm, seed, run, main)


def check_runs(study: spec.Study, study_dir: Path) -> None:
    """Refuse the study, naming the run and the flag, where a run's flags (every arm x level
    x seed, the budget branches too, as each will start) would be refused when it starts:
    the checks that need only the flags (``RunConfig.validate``, which the run makes again
    when it starts). A check of its own per call, before anything is started or
    submitted."""
    for folder, cell, arm, seed, run in spec.all_runs(study, study_dir):
        try:
            check_run_flags(_flags(study_dir, folder, cell, arm, seed, run))
        except FixedcodeError as e:
            where = f"{folder} " if folder else ""
            raise StudyError(f"run {where}{arm.name} seed {seed} ({run}): {e}") from e


def train_locally(study: spec.Study, study_dir: Path, nproc: int,
                  progress: Progress = _print) -> None:
    """Train the unfinished runs one after another; each resumes from its checkpoints. The
    training output is shown prefixed with the run and kept in RUN/train.log. Ctrl-C (or
    SIGTERM) lets the current run save and stop; rerunning continues."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C
    runs = spec.all_runs(study, study_dir)
    todo = [r for r in runs if not finished(r[-1])]
    progress(f"[study] {len(runs) - len(todo)} of {len(runs)} runs finished; "
             f"training {len(todo)}")
    launcher = ([sys.executable] if nproc == 1 else
                [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", str(nproc)])
    for i, (folder, cell, arm, seed, run) in enumerate(todo, 1):
        run.mkdir(parents=True, exist_ok=True)
        flags = _flags(study_dir, folder, cell, arm, seed, run)
        where = f"{folder} " if folder else ""
        tag = f"[{where}{arm.name} seed {seed}]"
        progress(f"[study] run {i}/{len(todo)}: {where}{arm.name} seed {seed} -> {run}")
        with open(run / "train.log", "a") as log:
            proc = subprocess.Popen([*launcher, str(PRETRAIN), *flags], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, cwd=slurm.REPO,
                                    start_new_session=True)
            try:
                rc = _relay(proc, log, tag)
            except KeyboardInterrupt:
                proc.send_signal(signal.SIGTERM)  # --exit-signal-handler: save, then exit
                _relay(proc, log, tag)
                raise Interrupted(f"[study] interrupted: {where}{arm.name} seed {seed} saved "
                                  f"its checkpoint; rerun the same command to continue")
        if rc != 0:
            raise StudyError(f"run {where}{arm.name} seed {seed} failed (exit {rc}); "
                             f"see {run / 'train.log'}")


def _relay(proc: subprocess.Popen, log, tag: str) -> int:
    """Copy a run's output to its log and, prefixed, to stdout until it exits; its code."""
    for line in proc.stdout:
        log.write(line)
        print(f"{tag} {line}", end="", flush=True)
    return proc.wait()


def submit_to_slurm(study: spec.Study, study_dir: Path, job: slurm.Job, dry_run: bool,
                    progress: Progress = _print, cluster=None) -> None:
    """Submit each run that is neither finished nor queued as a ``job``: the queue is asked
    once, before anything is submitted (:func:`~megatron_ext.launch.slurm.queued_jobs`; a
    queue that cannot be asked stops the submission with its error). A budget's branch is a
    job that starts once its run's job has succeeded (none when that run is finished).
    ``dry_run`` prints the scripts and dependencies of the unfinished runs and asks no
    queue. With ``cluster`` (a :class:`~megatron_ext.launch.plan.Cluster`), the study's plan
    is printed first and a run that does not fit its GPU memory refuses the submission."""
    if cluster is not None:
        from ..launch.plan import check_fits, plan_submission
        plans, table = plan_submission(
            study.recipe, lambda vocab: plan_study(study, cluster, vocab), cluster)
        progress(table)
        check_fits(plans, cluster)
    if dry_run:
        queue = {}
        progress("# dry run: the queue is not asked (squeue); a submission skips the runs "
                 "queued or running then")
    else:
        queue = slurm.queued_jobs()
    jobs = {}  # run folder -> its job id (submitted or queued), or "dry-run"
    for folder, cell, arm, seed, run in spec.all_runs(study, study_dir):
        what = f"{folder + ' ' if folder else ''}{arm.name} seed {seed}"
        name = "-".join([study_dir.name, *filter(None, folder.split("/")), arm.name,
                         f"seed{seed}"])
        if finished(run):
            progress(f"{what}: finished")
            continue
        queued = queue.get(name)
        if queued:
            jobs[run] = queued
            progress(f"{what}: queued or running as job {queued}")
            continue
        after = (jobs.get(spec.branched_from(study_dir, folder, arm, seed))
                 if cell.branch else None)
        script = slurm.job_script(job, name, run, _flags(study_dir, folder, cell, arm, seed,
                                                         run), study_dir)
        if dry_run:
            jobs[run] = f"<{name}>"
            needs = f" (after {after} succeeds)" if after else ""
            progress(f"# ===== {what}: {run / 'job.sbatch'}{needs} =====\n{script}")
            continue
        jobs[run] = slurm.write_and_submit(run, script, after)
        progress(f"{what}: job {jobs[run]}" + (f" after {after}" if after else "")
                 + f", log {run / f'slurm-{jobs[run]}.log'}")


def plan_study(study: spec.Study, cluster, vocab_size: Optional[int] = None) -> list:
    """The plan (:mod:`megatron_ext.launch.plan`) of every arm of every cell, its seeds
    alike; a budget's branch trains from its branch point only."""
    from ..launch.plan import plan_run
    plans = []
    for folder, cell in study.cells():
        iterations = cell.branch.iterations - cell.branch.start if cell.branch else None
        for arm in cell.arms:
            plans.append(plan_run("/".join(filter(None, [folder, arm.name])),
                                  [*cell.recipe, *arm.training_flags()], cluster, vocab_size,
                                  iterations, len(cell.seeds)))
    return plans


def evaluate_checkpoints(study: spec.Study, study_dir: Path, progress: Progress = _print) -> None:
    """Evaluate the checkpoints not evaluated yet and, with ``[probes]``, probe the final
    ones not probed yet."""
    from .evaluation import evaluate_study
    from .probing import probe_study
    from .report import final_iteration
    evaluated = {"evaluated": 0, "cached": 0}
    probed = {"probed": 0, "cached": 0}
    for folder, cell in study.cells():
        counts = evaluate_study(cell, study_dir / folder, progress=progress)
        evaluated = {k: evaluated[k] + counts[k] for k in evaluated}
        if study.probes:
            counts = probe_study(cell, study_dir / folder,
                                 final_iteration(cell, study_dir / folder), progress=progress)
            probed = {k: probed[k] + counts[k] for k in probed}
    progress(f"[study] evaluated {evaluated['evaluated']} checkpoints "
             f"({evaluated['cached']} cached)")
    if study.probes:
        progress(f"[study] probed {probed['probed']} final checkpoints "
                 f"({probed['cached']} cached)")
