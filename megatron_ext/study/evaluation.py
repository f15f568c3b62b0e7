"""Evaluate every saved checkpoint of a study's runs once: the loss on one fixed held-out
token set (the same tokens for every run and checkpoint) and, optionally, the downstream
tasks of tools/evaluate.py with lm-eval's per-item results kept (for item-paired
comparisons between arms).

Each record also carries the checkpoint's training compute: ``flops``, the FLOPs of its
iterations as the training log's MFU counts them (:func:`megatron_ext.metrics.flops.flops_per_token`
times the tokens trained), and ``parameters`` (``total`` trainable, ``non_embedding``: all
but the input table, which a fixed code does not have); a record cached before it had
them gets them added, without evaluating again.

Results are cached per checkpoint in ``RUN/eval/iter_NNNNNNN.json`` with the settings they
were computed under: evaluation is incremental while training continues, and a cache made
under other settings is recomputed. Runs in one CPU process (checkpoints of any TP/PP are
resharded to one model).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np

from ..checkpoint.layout import completed_iterations, iteration_name
from ..checkpoint.retention import SaveDeleted, reading
from ..datasets.held_out import held_out_tokens, tokens_sha256
from ..runtime.errors import DataError, StudyError
from ..runtime.files import write_json

from .spec import EvalSettings, Study, run_dir

# The downstream metric a study compares, per task (tools/evaluate.py's table's first).
TASK_METRIC = {"hellaswag": "acc_norm", "piqa": "acc", "lambada_openai": "acc"}


def metric_value(record: dict, name: str) -> Optional[float]:
    """Metric ``name`` (``valid_loss`` or a task) of one cached evaluation, or None."""
    if name == "valid_loss":
        return record.get("valid_loss")
    task = record.get("tasks", {}).get(name)
    return None if task is None else task["value"]


def metric_names(study: Study) -> list[str]:
    """The metrics a study compares: the held-out loss (with a held-out set), then its tasks'."""
    return (["valid_loss"] if study.eval.data_path else []) + list(study.eval.tasks)


def label(name: str) -> str:
    """A metric's name in tables and figures: ``validation loss`` or ``piqa acc``."""
    return "validation loss" if name == "valid_loss" else f"{name} {TASK_METRIC[name]}"


def cache_path(run: Path, iteration: int) -> Path:
    return run / "eval" / f"{iteration_name(iteration)}.json"


def held_out_loss(model, windows: np.ndarray, batch_size: int) -> float:
    """Mean next-token loss of ``model`` over every position of ``windows``."""
    import torch
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(windows), batch_size):
            batch = torch.from_numpy(windows[start:start + batch_size])
            tokens, labels = batch[:, :-1], batch[:, 1:]
            positions = torch.arange(tokens.shape[1]).expand_as(tokens)
            losses = model(tokens, positions, None, labels=labels)
            total += float(losses.double().sum())
            count += losses.numel()
    return total / count


def downstream(load: Path, iteration: int, settings: EvalSettings) -> dict:
    """``{task: {"metric", "value", "items"}}``: the checkpoint exported to Hugging Face
    (temporarily, :func:`megatron_ext.hf.export.export_checkpoint`) and scored by lm-eval on the
    study's tasks; ``items`` is the per-document score (0/1) in document order."""
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    from ..hf.eval_tasks import evaluate_model, official_tasks, task_config
    from ..hf.export import export_checkpoint
    with tempfile.TemporaryDirectory() as hf_dir:
        export_checkpoint(str(load), hf_dir, iteration)
        manager = official_tasks()
        configs = [task_config(t, manager, settings.data_dir) for t in settings.tasks]
        out = evaluate_model(hf_dir, configs, manager, batch_size=settings.batch_size,
                             limit=settings.limit, log_samples=True)
    result = {}
    for task in settings.tasks:
        metric = TASK_METRIC[task]
        samples = sorted(out["samples"][task], key=lambda s: s["doc_id"])
        items = [float(s[metric]) for s in samples]
        result[task] = {"metric": metric, "value": float(np.mean(items)), "items": items}
    return result


def evaluate_checkpoint(run: Path, iteration: int, settings: EvalSettings) -> dict:
    from ..hf.megatron_checkpoint import load_model, read_checkpoint
    ckpt = run / "checkpoints"
    path, trained, fixed_code, _ = read_checkpoint(str(ckpt), iteration)
    model = load_model(path, trained, fixed_code)
    seq_length = trained.config.model.seq_length
    record = {"iteration": iteration, "settings": _settings_json(settings),
              **training_compute(trained, iteration, model)}
    if settings.data_path:
        windows = held_out_tokens(settings.data_path, settings.tokens, seq_length)
        loss = held_out_loss(model, windows, settings.batch_size)
        if not math.isfinite(loss):
            raise StudyError(f"{path}: the held-out loss is {loss} (non-finite weights?): "
                             f"a study's means and intervals cannot take it")
        record.update(valid_loss=loss, valid_ppl=math.exp(min(loss, 50.0)),
                      valid_tokens=int(windows.shape[0] * seq_length),
                      valid_tokens_sha256=tokens_sha256(windows))
    if settings.tasks:
        record["tasks"] = downstream(ckpt, iteration, settings)
    return record


def training_compute(trained, iteration: int, model) -> dict:
    """``{"flops", "parameters"}`` of a checkpoint at ``iteration`` (its ``trained`` run,
    ``hf.megatron_checkpoint.SavedRun``: its saved flags hold the derived batch, and its
    padded vocabulary; and its model)."""
    from ..metrics.flops import flops_per_token
    from ..model.param_count import count_parameters
    config = trained.config
    tokens = iteration * config.training.global_batch_size * config.model.seq_length
    counts = count_parameters(model)
    return {"flops": tokens * flops_per_token(trained.config.model, trained.padded_vocab_size),
            "parameters": {"total": counts["total"],
                           "non_embedding": counts["total"] - counts["input"]}}


def read_cached(run: Path, iteration: int, settings: EvalSettings) -> Optional[dict]:
    """The cached record, unless made under other settings."""
    path = cache_path(run, iteration)
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return record if record.get("settings") == _settings_json(settings) else None


def _settings_json(settings: EvalSettings) -> dict:
    """The settings that change a result, as their cache file holds them (tuples become
    lists): ``allow_train_text`` changes none, so caches made before it existed still
    hold."""
    fields = dataclasses.asdict(settings)
    del fields["allow_train_text"]
    return json.loads(json.dumps(fields))


def check_held_out_content(study: Study, progress=print) -> None:
    """Refuse a held-out set (``[eval]``, ``[probes]`` ``data_path``) whose documents are,
    token for token, documents of a dataset the runs train on (a copy or a rebuild of the
    training prefix passes the study's check of paths), naming both and the count, unless
    its section sets ``allow_train_text``. Training datasets not built yet are skipped."""
    from ..config import recipes
    from ..datasets.held_out import indexed_documents, shared_documents
    from ..launch.slurm import REPO as RUNS_START_IN
    checked = [(what, settings) for what, settings in (("eval", study.eval),
                                                       ("probes", study.probes))
               if settings is not None and settings.data_path and not settings.allow_train_text]
    if not checked:
        return
    trained = sorted({str((RUNS_START_IN / p).resolve()) for _, cell in study.cells()
                      for arm in cell.arms
                      for p in recipes.training_prefixes([*cell.recipe, *arm.flags])})
    for what, settings in checked:
        for prefix in trained:
            if not Path(prefix + ".idx").exists() or not Path(settings.data_path + ".idx"
                                                             ).exists():
                continue
            found = shared_documents(indexed_documents(settings.data_path), settings.tokens,
                                     indexed_documents(prefix))
            scope = ("all of it" if found["complete"] else
                     f"its first {found['scanned_tokens']:,} tokens")
            if found["shared"]:
                raise DataError(
                    f"[{what}] data_path {settings.data_path}: {found['shared']} of its "
                    f"{found['held_out']} held-out documents are training documents of "
                    f"{prefix} (the same tokens; compared with {scope}): it would score "
                    f"training text. Build the held-out set from documents the training "
                    f"blend never reads, or set allow_train_text = true in [{what}]")
            progress(f"[held-out] [{what}] {found['held_out']} documents: none among the "
                     f"training documents of {prefix} ({scope})")


def evaluate_study(study: Study, study_dir: Path, progress=print) -> dict:
    """Evaluate what is not cached yet; ``{"evaluated": n, "cached": m}``. A cached record
    made before records carried the training compute gets it added (the model is loaded,
    nothing is evaluated again). The held-out sets are first checked against the training
    data by content (:func:`check_held_out_content`)."""
    from ..hf.megatron_checkpoint import load_model, read_checkpoint
    from ..runtime.initialize import initialize_distributed
    counts = {"evaluated": 0, "cached": 0}
    check_held_out_content(study, progress)
    todo, older = [], []
    for arm, seed in study.runs():
        run = run_dir(study_dir, arm, seed)
        for iteration in completed_iterations(run / "checkpoints"):
            record = read_cached(run, iteration, study.eval)
            if record is None:
                todo.append((run, iteration))
                continue
            counts["cached"] += 1
            if "flops" not in record:
                older.append((run, iteration, record))
    if todo or older:
        initialize_distributed("cpu", 1, 1)
    for run, iteration, record in older:
        path, trained, fixed_code, _ = read_checkpoint(str(run / "checkpoints"), iteration)
        record.update(training_compute(trained, iteration,
                                       load_model(path, trained, fixed_code)))
        write_json(str(cache_path(run, iteration)), record)
    for i, (run, iteration) in enumerate(todo, 1):
        progress(f"[eval {i}/{len(todo)}] {run} iteration {iteration}")
        try:
            # held against the training run's retention (--keep-last-checkpoints) while read
            with reading(str(run / "checkpoints"), iteration):
                record = evaluate_checkpoint(run, iteration, study.eval)
        except SaveDeleted as e:
            progress(f"[eval {i}/{len(todo)}] skipped: {e}")
            continue
        path = cache_path(run, iteration)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(str(path), record)
        counts["evaluated"] += 1
    return counts
