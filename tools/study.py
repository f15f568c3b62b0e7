"""Run a study: arms x seeds of one recipe (optionally x the levels of named factors, e.g.
model sizes, and token budgets as WSD cooldown branches), every checkpoint evaluated once, a
report with intervals across seeds, differences against the control and, across levels,
loss against training FLOPs with a power-law fit.

    python tools/study.py run STUDY_DIR --study examples/cpu_study/study.toml
    python tools/study.py run STUDY_DIR --study examples/cpu_scaling/study.toml
    python tools/study.py run STUDY_DIR --recipe R.args --arms learned,binary,gf2 \\
        --seeds 1,2,3 --eval-data-path data/valid_text_document [--launcher slurm ...]
    python tools/study.py eval STUDY_DIR      # evaluate new checkpoints (and probe), then report
    python tools/study.py report STUDY_DIR    # STUDY.md, study.json, figures

``run`` checks every run's flags as the run will start with them, then fixes the study's
definition in STUDY_DIR/definition.json on first use. With ``--launcher local`` it trains the
runs one after another on this machine (one process, or ``--nproc-per-node`` under
torchrun), then evaluates and reports; a rerun skips finished runs and resumes interrupted
ones from their checkpoints. With ``--launcher slurm`` it submits every run that is neither
finished nor queued as a preemption-safe job (megatron_ext/study/launch.py), ``--dry-run``
printing the scripts instead; first it prints the study's plan (memory per GPU, time,
GPU-hours per run and in all: megatron_ext/launch/plan.py) and refuses a run that does not
fit ``--gpu-memory``; ``eval`` and ``report`` follow once checkpoints exist. See
docs/studies.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from megatron_ext.config.flag_fields import add_flags
from megatron_ext.config.recipes import RecipeFile
from megatron_ext.hf.eval_settings import EvaluateSettings
from megatron_ext.launch import plan, slurm
from megatron_ext.study import launch, spec
from megatron_ext.runtime.errors import exits_on_error


def parse_args(argv: Optional[Sequence[str]]) -> tuple[argparse.ArgumentParser,
                                                       argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train the missing runs (then evaluate and report "
                                          "with the local launcher)", allow_abbrev=False)
    run.add_argument("study_dir", type=Path, help="the study's folder")
    d = run.add_argument_group("the study (first run only; later runs reuse definition.json)")
    add_flags(d, spec.StudyFlags, only=("study",), helps={
        "study": "a TOML study file (keys: recipe, overrides, arms, seeds, control, [eval], "
                 "[probes], [factors.NAME], gap_of_interest, margin, [comparisons.\"B - A\"]); "
                 "the flags below override its keys"})
    add_flags(d, RecipeFile)
    add_flags(d, spec.StudyFlags, only=("arms",), defaults={"arms": None}, helps={
        "arms": "comma-separated [NAME:]INTERFACE[@--flag=value...], e.g. "
                "learned,binary,small:binary@--code-scale=0.02"})
    d.add_argument("--seeds", help="comma-separated --seed values, e.g. 1,2,3")
    d.add_argument("--control", help="the arm the others are compared with (default learned)")
    d.add_argument("--gap-of-interest",
                   help="the held-out loss gap a fresh study should detect, fixed before the "
                        "results: nats (0.0325) or %% perplexity (3.3%%); the tables print "
                        "its expected power and the seeds for 80%% per comparison (study "
                        "file: gap_of_interest, per comparison [comparisons.\"B - A\"])")
    d.add_argument("--margin",
                   help="the equivalence / non-inferiority margin of the held-out loss, "
                        "nats or %% perplexity: each comparison's verdict \"within ±m\" or "
                        "\"not shown\" (TOST at 5%%) (study file: margin)")
    # None where not given: the study file's [eval] keys, or their defaults, stand.
    add_flags(d, spec.EvalSettings, only=("data_path", "tokens"),
              defaults={"tokens": None})
    add_flags(d, EvaluateSettings, only=("tasks",))
    add_flags(d, spec.EvalSettings, only=("data_dir", "limit"))
    d.add_argument(spec.ALLOW_UNREPORTED, action="store_true",
                   help=f"define a tuned study (tune = ...) of fewer than "
                        f"{spec.seeds_for_reported(spec.REPORTED_SEEDS)} seeds, whose tuned "
                        f"gaps then rest on fewer than {spec.REPORTED_SEEDS} reported seeds: "
                        f"no interval, or one of 1 degree of freedom (refused otherwise)")
    launch = run.add_argument_group("launching")
    launch.add_argument("--launcher", choices=["local", "slurm"], default="local",
                        help="local: one run after another here; slurm: one job per run")
    launch.add_argument("--nproc-per-node", type=int, default=1,
                        help="local: processes per run (torchrun when > 1)")
    launch.add_argument("--no-eval", action="store_true",
                        help="local: train only (evaluate later with `eval`)")
    add_flags(launch, slurm.Submission, only=("dry_run",), helps={
        "dry_run": "slurm: print the job scripts; write and submit nothing"})
    slurm.add_job_args(run.add_argument_group("slurm jobs (as tools/submit.py)"))
    plan.add_plan_args(run)
    for name, text in (("eval", "evaluate the checkpoints not evaluated yet, then report"),
                       ("report", "write STUDY.md, study.json and the figures")):
        sub = commands.add_parser(name, help=text, allow_abbrev=False)
        sub.add_argument("study_dir", type=Path, help="the study's folder")
    args = parser.parse_args(argv)
    args.study_dir = args.study_dir.resolve()
    return run if args.command == "run" else parser, args


def main(argv: Optional[Sequence[str]] = None) -> dict:
    with exits_on_error():
        parser, args = parse_args(argv)
        if args.command == "run":
            given = spec.study_from_flags(
                args.study, {"recipe": args.recipe, "arms": args.arms, "seeds": args.seeds,
                             "control": args.control, "gap_of_interest": args.gap_of_interest,
                             "margin": args.margin},
                {"data_path": args.data_path, "tokens": args.tokens,
                 "tasks": args.tasks, "data_dir": args.data_dir, "limit": args.limit},
                args.allow_unreported_intervals)
            study = spec.settle(args.study_dir, given, save=False)
            launch.check_runs(study, args.study_dir)  # before anything is saved or started
            spec.settle(args.study_dir, study, save=not args.dry_run)
            if args.launcher == "slurm":
                job = slurm.Job.from_flags(args).for_run_dir(args.study_dir)
                cluster = (plan.Cluster.from_flags(args, nodes=job.nodes,
                                                   gpus_per_node=job.ntasks_per_node)
                           if job.gpus_per_node else None)
                launch.submit_to_slurm(study, args.study_dir, job, args.dry_run,
                                       cluster=cluster)
                return {}
            if args.dry_run:
                parser.error("--dry-run applies to --launcher slurm")
            launch.train_locally(study, args.study_dir, args.nproc_per_node)
            if args.no_eval:
                return {}
        else:
            study = spec.settle(args.study_dir, None)
        if args.command != "report":
            launch.evaluate_checkpoints(study, args.study_dir)
        from megatron_ext.study.report import write_report
        summary = write_report(study, args.study_dir)
        print((args.study_dir / "STUDY.md").read_text())
        print(f"[study] wrote {args.study_dir / 'STUDY.md'}, {args.study_dir / 'study.json'} and "
              f"figures")
        return summary


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main(sys.argv[1:])
