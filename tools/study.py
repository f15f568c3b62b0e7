"""Run a study: arms x seeds of one recipe, every checkpoint evaluated once, a report with
intervals across seeds and differences against the control.

    python tools/study.py run STUDY_DIR --study examples/cpu_study/study.toml
    python tools/study.py run STUDY_DIR --recipe R.args --arms learned,binary,gf2 \\
        --seeds 1,2,3 --eval-data-path data/valid_text_document [--launcher slurm ...]
    python tools/study.py eval STUDY_DIR      # evaluate new checkpoints (and probe), then report
    python tools/study.py report STUDY_DIR    # STUDY.md, study.json, figures

``run`` fixes the study's definition in STUDY_DIR/definition.json on first use. With
``--launcher local`` it trains the runs one after another on this machine (one process, or
``--nproc-per-node`` under torchrun), then evaluates and reports; a rerun skips finished
runs and resumes interrupted ones from their checkpoints. With ``--launcher slurm`` it
submits every run that is neither finished nor queued as a preemption-safe job
(tools/submit.py's), ``--dry-run`` printing the scripts instead; ``eval`` and ``report``
follow once checkpoints exist. See docs/studies.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from megatron_ext.study import spec  # noqa: E402
from tools import submit  # noqa: E402

PRETRAIN = REPO / "pretrain_fixedcode.py"


def parse_args(argv: Optional[Sequence[str]]) -> tuple[argparse.ArgumentParser,
                                                       argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train the missing runs (then evaluate and report "
                                          "with the local launcher)", allow_abbrev=False)
    run.add_argument("study_dir", type=Path, help="the study's folder")
    d = run.add_argument_group("the study (first run only; later runs reuse definition.json)")
    d.add_argument("--study", help="a TOML study file (keys: recipe, arms, seeds, control, "
                                   "[eval], [probes]); the flags below override its keys")
    d.add_argument("--recipe", help="file of pretrain_fixedcode.py flags shared by all runs")
    d.add_argument("--arms", help="comma-separated [NAME:]INTERFACE[@--flag=value...], e.g. "
                                  "learned,binary,small:binary@--code-scale=0.02")
    d.add_argument("--seeds", help="comma-separated --seed values, e.g. 1,2,3")
    d.add_argument("--control", help="the arm the others are compared with (default learned)")
    d.add_argument("--eval-data-path", help="indexed dataset prefix of the held-out set")
    d.add_argument("--eval-tokens", type=int,
                   help="held-out tokens per evaluation (default 65536)")
    d.add_argument("--tasks", help="downstream tasks (from hellaswag,piqa,lambada_openai)")
    d.add_argument("--data-dir", help="folder of <task>.jsonl files for --tasks")
    d.add_argument("--limit", type=int, help="only the first N documents per task")
    launch = run.add_argument_group("launching")
    launch.add_argument("--launcher", choices=["local", "slurm"], default="local",
                        help="local: one run after another here; slurm: one job per run")
    launch.add_argument("--nproc-per-node", type=int, default=1,
                        help="local: processes per run (torchrun when > 1)")
    launch.add_argument("--no-eval", action="store_true",
                        help="local: train only (evaluate later with `eval`)")
    launch.add_argument("--dry-run", action="store_true",
                        help="slurm: print the job scripts; write and submit nothing")
    submit.add_job_args(run.add_argument_group("slurm jobs (as tools/submit.py)"))
    for name, text in (("eval", "evaluate the checkpoints not evaluated yet, then report"),
                       ("report", "write STUDY.md, study.json and the figures")):
        sub = commands.add_parser(name, help=text, allow_abbrev=False)
        sub.add_argument("study_dir", type=Path, help="the study's folder")
    args = parser.parse_args(argv)
    args.study_dir = args.study_dir.resolve()
    return run if args.command == "run" else parser, args


def study_from_args(args: argparse.Namespace) -> Optional[spec.Study]:
    """The study the flags (and --study file) define, or None when they define none."""
    fields, base = {}, Path.cwd()
    if args.study:
        fields, base = spec.read_study_file(args.study), Path(args.study).resolve().parent
    split = lambda text: [x.strip() for x in text.split(",") if x.strip()]  # noqa: E731
    flags = {"recipe": args.recipe, "arms": args.arms and split(args.arms),
             "seeds": args.seeds and split(args.seeds), "control": args.control}
    fields.update({k: v for k, v in flags.items() if v})
    if args.recipe:  # a flag's path is relative to the working directory
        fields["recipe"] = str(Path(args.recipe).resolve())
    evaluation = dict(fields.get("eval", {}))
    for key, value in (("data_path", args.eval_data_path), ("tokens", args.eval_tokens),
                       ("tasks", args.tasks and split(args.tasks)), ("data_dir", args.data_dir),
                       ("limit", args.limit)):
        if value:
            evaluation[key] = str(Path(value).resolve()) if key in ("data_path",
                                                                     "data_dir") else value
    if evaluation:
        fields["eval"] = evaluation
    return spec.build_study(fields, base) if fields else None


def finished(run: Path) -> bool:
    """Whether the run's latest checkpoint is its last iteration."""
    from megatron_ext.checkpointing import latest_iteration, load_common
    ckpt = run / "checkpoints"
    if not ckpt.is_dir() or latest_iteration(str(ckpt)) is None:
        return False
    common = load_common(str(ckpt))[1]
    return common["iteration"] >= common["args"]["train_iters"]


def run_flags(study: spec.Study, arm: spec.Arm, seed: int, run: Path) -> list[str]:
    """A run's flags: the recipe, the arm's, the seed, where it saves (tools/submit.py's)."""
    return submit.run_flags(list(study.recipe), run,
                            [*arm.training_flags(), "--seed", str(seed)])


def train_locally(study: spec.Study, study_dir: Path, nproc: int) -> None:
    """Train the unfinished runs one after another; each resumes from its checkpoints. The
    training output is shown prefixed with the run and kept in RUN/train.log. Ctrl-C (or
    SIGTERM) lets the current run save and stop; rerunning continues."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C
    todo = [(a, s) for a, s in study.runs() if not finished(spec.run_dir(study_dir, a, s))]
    print(f"[study] {len(study.runs()) - len(todo)} of {len(study.runs())} runs finished; "
          f"training {len(todo)}", flush=True)
    launcher = ([sys.executable] if nproc == 1 else
                [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", str(nproc)])
    for i, (arm, seed) in enumerate(todo, 1):
        run = spec.run_dir(study_dir, arm, seed)
        run.mkdir(parents=True, exist_ok=True)
        flags = run_flags(study, arm, seed, run)
        tag = f"[{arm.name} seed {seed}]"
        print(f"[study] run {i}/{len(todo)}: {arm.name} seed {seed} -> {run}", flush=True)
        with open(run / "train.log", "a") as log:
            proc = subprocess.Popen([*launcher, str(PRETRAIN), *flags], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, cwd=REPO,
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


def submit_to_slurm(study: spec.Study, study_dir: Path, args: argparse.Namespace) -> None:
    """Submit each run that is neither finished nor queued (tools/submit.py's job script)."""
    for arm, seed in study.runs():
        run = spec.run_dir(study_dir, arm, seed)
        name = f"{study_dir.name}-{arm.name}-seed{seed}"
        if finished(run):
            print(f"{arm.name} seed {seed}: finished")
            continue
        job = queued_job(name)
        if job:
            print(f"{arm.name} seed {seed}: queued or running as job {job}")
            continue
        script = submit.job_script(args, name, run, run_flags(study, arm, seed, run), study_dir)
        if args.dry_run:
            print(f"# ===== {arm.name} seed {seed}: {run / 'job.sbatch'} =====\n{script}")
            continue
        job = submit.write_and_submit(run, script)
        print(f"{arm.name} seed {seed}: job {job}, log {run / f'slurm-{job}.log'}")


def export_hf(load: Path, iteration: int, output: str) -> None:
    from tools import convert_to_hf
    convert_to_hf.main(["--load", str(load), "--iteration", str(iteration), "--output", output])


def evaluate_and_report(study: spec.Study, study_dir: Path) -> dict:
    from megatron_ext.study.evaluation import evaluate_study
    progress = lambda msg: print(msg, flush=True)  # noqa: E731
    counts = evaluate_study(study, study_dir, export_hf, progress=progress)
    print(f"[study] evaluated {counts['evaluated']} checkpoints ({counts['cached']} cached)")
    if study.probes:
        from megatron_ext.study.probing import probe_study
        from megatron_ext.study.report import final_iteration
        counts = probe_study(study, study_dir, final_iteration(study, study_dir),
                             progress=progress)
        print(f"[study] probed {counts['probed']} final checkpoints ({counts['cached']} cached)")
    return report(study, study_dir)


def report(study: spec.Study, study_dir: Path) -> dict:
    from megatron_ext.study.report import write_report
    summary = write_report(study, study_dir)
    print((study_dir / "STUDY.md").read_text())
    print(f"[study] wrote {study_dir / 'STUDY.md'}, {study_dir / 'study.json'} and figures")
    return summary


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser, args = parse_args(argv)
    if args.command != "run":
        study = spec.settle(args.study_dir, None)
        return evaluate_and_report(study, args.study_dir) if args.command == "eval" \
            else report(study, args.study_dir)
    study = spec.settle(args.study_dir, study_from_args(args), save=not args.dry_run)
    if args.launcher == "slurm":
        submit.check_job_args(parser, args, args.study_dir)
        submit_to_slurm(study, args.study_dir, args)
        return {}
    if args.dry_run:
        parser.error("--dry-run applies to --launcher slurm")
    train_locally(study, args.study_dir, args.nproc_per_node)
    return {} if args.no_eval else evaluate_and_report(study, args.study_dir)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main(sys.argv[1:])
