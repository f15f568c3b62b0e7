"""Launching a study's runs: one after another on this machine (each resuming from its
checkpoints; Ctrl-C lets the current run save and stop), or as one preemption-safe Slurm job
per run (:mod:`megatron_ext.slurm`'s job script); then every checkpoint evaluated (and,
with ``[probes]``, the final ones probed). tools/study.py is the command line.

A run is ``STUDY_DIR/ARM/seedN`` (:func:`.spec.run_dir`); it is finished when its latest
checkpoint is its last iteration, so a rerun skips it.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

from megatron_ext import slurm

from . import spec

PRETRAIN = slurm.REPO / "pretrain_fixedcode.py"
Progress = Callable[[str], None]


def _print(message: str) -> None:
    print(message, flush=True)


def finished(run: Path) -> bool:
    """Whether the run's latest checkpoint is its last iteration."""
    from megatron_ext.checkpointing import latest_iteration, load_common
    ckpt = run / "checkpoints"
    if not ckpt.is_dir() or latest_iteration(str(ckpt)) is None:
        return False
    common = load_common(str(ckpt))[1]
    return common["iteration"] >= common["args"]["train_iters"]


def run_flags(study: spec.Study, arm: spec.Arm, seed: int, run: Path) -> list[str]:
    """A run's flags: the recipe, the arm's, the seed, where it saves (a Slurm job's too)."""
    return slurm.run_flags(list(study.recipe), run, [*arm.training_flags(), "--seed", str(seed)])


def train_locally(study: spec.Study, study_dir: Path, nproc: int,
                  progress: Progress = _print) -> None:
    """Train the unfinished runs one after another; each resumes from its checkpoints. The
    training output is shown prefixed with the run and kept in RUN/train.log. Ctrl-C (or
    SIGTERM) lets the current run save and stop; rerunning continues."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C
    todo = [(a, s) for a, s in study.runs() if not finished(spec.run_dir(study_dir, a, s))]
    progress(f"[study] {len(study.runs()) - len(todo)} of {len(study.runs())} runs finished; "
             f"training {len(todo)}")
    launcher = ([sys.executable] if nproc == 1 else
                [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", str(nproc)])
    for i, (arm, seed) in enumerate(todo, 1):
        run = spec.run_dir(study_dir, arm, seed)
        run.mkdir(parents=True, exist_ok=True)
        flags = run_flags(study, arm, seed, run)
        tag = f"[{arm.name} seed {seed}]"
        progress(f"[study] run {i}/{len(todo)}: {arm.name} seed {seed} -> {run}")
        with open(run / "train.log", "a") as log:
            proc = subprocess.Popen([*launcher, str(PRETRAIN), *flags], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, cwd=slurm.REPO,
                                    start_new_session=True)
            try:
                rc = _relay(proc, log, tag)
            except KeyboardInterrupt:
                proc.send_signal(signal.SIGTERM)  # --exit-signal-handler: save, then exit
                _relay(proc, log, tag)
                raise SystemExit(f"[study] interrupted: {arm.name} seed {seed} saved its "
                                 f"checkpoint; rerun the same command to continue")
        if rc != 0:
            raise SystemExit(f"error: run {arm.name} seed {seed} failed (exit {rc}); see "
                             f"{run / 'train.log'}")


def _relay(proc: subprocess.Popen, log, tag: str) -> int:
    """Copy a run's output to its log and, prefixed, to stdout until it exits; its code."""
    for line in proc.stdout:
        log.write(line)
        print(f"{tag} {line}", end="", flush=True)
    return proc.wait()


def queued_job(name: str) -> Optional[str]:
    """The id of a pending or running Slurm job of this name, or None."""
    if shutil.which("squeue") is None:
        return None
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True,
                         text=True).stdout.split()
    return out[0] if out else None


def submit_to_slurm(study: spec.Study, study_dir: Path, job: argparse.Namespace,
                    dry_run: bool, progress: Progress = _print) -> None:
    """Submit each run that is neither finished nor queued; ``job``: the job options
    (:func:`megatron_ext.slurm.add_job_args`, checked). ``dry_run`` prints the scripts."""
    for arm, seed in study.runs():
        run = spec.run_dir(study_dir, arm, seed)
        name = f"{study_dir.name}-{arm.name}-seed{seed}"
        if finished(run):
            progress(f"{arm.name} seed {seed}: finished")
            continue
        queued = queued_job(name)
        if queued:
            progress(f"{arm.name} seed {seed}: queued or running as job {queued}")
            continue
        script = slurm.job_script(job, name, run, run_flags(study, arm, seed, run), study_dir)
        if dry_run:
            progress(f"# ===== {arm.name} seed {seed}: {run / 'job.sbatch'} =====\n{script}")
            continue
        job_id = slurm.write_and_submit(run, script)
        progress(f"{arm.name} seed {seed}: job {job_id}, log {run / f'slurm-{job_id}.log'}")


def export_hf(load: Path, iteration: int, output: str) -> None:
    """A checkpoint as a Hugging Face model in ``output`` (for the downstream tasks)."""
    from megatron_ext.hf.export import export_checkpoint
    export_checkpoint(str(load), output, iteration)


def evaluate(study: spec.Study, study_dir: Path, progress: Progress = _print) -> None:
    """Evaluate the checkpoints not evaluated yet and, with ``[probes]``, probe the final
    ones not probed yet."""
    from .evaluation import evaluate_study
    counts = evaluate_study(study, study_dir, export_hf, progress=progress)
    progress(f"[study] evaluated {counts['evaluated']} checkpoints ({counts['cached']} cached)")
    if study.probes:
        from .probing import probe_study
        from .report import final_iteration
        counts = probe_study(study, study_dir, final_iteration(study, study_dir),
                             progress=progress)
        progress(f"[study] probed {counts['probed']} final checkpoints "
                 f"({counts['cached']} cached)")
