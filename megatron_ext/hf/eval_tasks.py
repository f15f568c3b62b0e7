"""The paper's evaluations as lm-eval's own task definitions, reading local JSONL files.

Each task is the YAML that lm-eval registers under its name (HellaSwag: ``process_docs``
preprocessing, acc and acc_norm; PIQA: acc and acc_norm; LAMBADA-OpenAI: acc and
perplexity), loaded unchanged except for where its documents come from:
``dataset_path: json`` with ``DATA_DIR/<task>.jsonl`` as the split that the official task
evaluates (no training split: zero-shot). Every row is checked against the official field
layout first, so that a wrong file fails with its name and line instead of scoring 0.
:func:`evaluate_models` evaluates several exports on the same tasks into eval_report's
comparison (tools/evaluate.py). A stock export (a Llama) is loaded without
``trust_remote_code``; only the custom-code export of a fixed code needs it.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Callable, Optional

import lm_eval.tasks
from lm_eval.tasks import TaskManager
from lm_eval.tasks._yaml_loader import load_yaml

from ..runtime.errors import DataError, FlagError
from .eval_report import arm_of, build_report
from .parity import needs_remote_code

# task -> its folder among lm-eval's tasks
SUPPORTED = {"hellaswag": "hellaswag", "piqa": "piqa", "lambada_openai": "lambada"}


def _is_str(v) -> bool:
    return isinstance(v, str)


def _is_index(v, n: int) -> bool:
    return not isinstance(v, bool) and isinstance(v, int) and 0 <= v < n


# field -> (check, what the official layout holds there)
LAYOUTS = {
    "hellaswag": {
        "activity_label": (_is_str, "a string"),
        "ctx_a": (_is_str, "a string"),
        "ctx_b": (_is_str, "a string"),
        "endings": (lambda v: isinstance(v, list) and len(v) == 4 and all(map(_is_str, v)),
                    "a list of 4 strings"),
        "label": (lambda v: _is_index(v, 4) or v in ("0", "1", "2", "3"),
                  "0-3 (an int or a digit string)"),
    },
    "piqa": {
        "goal": (_is_str, "a string"),
        "sol1": (_is_str, "a string"),
        "sol2": (_is_str, "a string"),
        "label": (lambda v: _is_index(v, 2), "the int 0 or 1"),
    },
    "lambada_openai": {
        "text": (lambda v: _is_str(v) and v.strip() != "", "a non-empty string"),
    },
}


def data_file(data_dir: str, task: str) -> str:
    return os.path.abspath(os.path.join(data_dir, f"{task}.jsonl"))


def check_rows(task: str, path: str) -> int:
    """Check every row of ``path`` against ``task``'s official layout; the number of rows."""
    if not os.path.isfile(path):
        raise DataError(f"--data-dir: no {path} for task {task}")
    rows = 0
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{line_no}: not JSON ({e})") from e
            for field, (ok, expected) in LAYOUTS[task].items():
                if field not in row:
                    raise DataError(f"{path}:{line_no}: no field {field!r} ({task} rows "
                                    f"have {sorted(LAYOUTS[task])})")
                if not ok(row[field]):
                    raise DataError(f"{path}:{line_no}: {field} must be {expected}, "
                                    f"got {row[field]!r}")
            rows += 1
    if not rows:
        raise DataError(f"{path} holds no rows")
    return rows


def official_tasks() -> TaskManager:
    """lm-eval's index of the supported tasks' own folders only (indexing all its tasks takes
    seconds)."""
    root = os.path.dirname(lm_eval.tasks.__file__)
    folders = [os.path.join(root, d) for d in sorted(set(SUPPORTED.values()))]
    return TaskManager(include_defaults=False, include_path=folders)


def _official_config(task: str, task_manager: TaskManager) -> dict:
    if task not in SUPPORTED:
        raise FlagError(f"--tasks: {task!r} is not one of {', '.join(SUPPORTED)}")
    return load_yaml(task_manager.task_index[task].yaml_path, resolve_func=True)


def _evaluated_split(config: dict) -> str:
    return config.get("test_split") or config["validation_split"]


def official_dataset(task: str, task_manager: TaskManager) -> dict:
    """``{"path", "split"}``: the Hub dataset and split the official ``task`` evaluates (what
    a model card's ``model-index`` names)."""
    config = _official_config(task, task_manager)
    return {"path": config["dataset_path"], "split": _evaluated_split(config)}


def task_config(task: str, task_manager: TaskManager, data_dir: str | None) -> dict:
    """lm-eval's official config of ``task``; reading ``data_dir`` when given, else the Hub."""
    config = _official_config(task, task_manager)
    if data_dir is None:
        return config
    split = _evaluated_split(config)
    path = data_file(data_dir, task)
    check_rows(task, path)
    return {**config, "dataset_path": "json", "dataset_name": None, "training_split": None,
            "dataset_kwargs": {"data_files": {split: path}}}


def evaluate_model(hf_dir: str, configs: list[dict], task_manager: TaskManager, *,
                   device: str = "cpu", dtype: str = "float32", batch_size: int = 8,
                   limit: Optional[int] = None, bootstrap_iters: int = 0, seed: int = 0,
                   log_samples: bool = False) -> dict:
    """lm-eval's output for the Hugging Face model in ``hf_dir`` on the tasks ``configs``
    (:func:`task_config`), zero-shot, every random seed of lm-eval set to ``seed``;
    ``log_samples`` keeps the per-document results (``out["samples"]``). The model runs code
    from its folder only where it is the custom-code export (:func:`.parity.needs_remote_code`)."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    lm = HFLM(pretrained=hf_dir, trust_remote_code=needs_remote_code(hf_dir), device=device,
              dtype=dtype, batch_size=batch_size)
    return simple_evaluate(model=lm, tasks=configs, task_manager=task_manager, limit=limit,
                           bootstrap_iters=bootstrap_iters, log_samples=log_samples,
                           random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                           fewshot_random_seed=seed)


def evaluate_models(hf_dirs: list[str], tasks: list[str], data_dir: Optional[str], *,
                    starting: Callable[[int, str, str], None], **settings) -> dict:
    """eval_report's report of the Hugging Face models in ``hf_dirs`` on ``tasks`` (their
    documents from ``data_dir``, or the Hub's without it), each evaluated by
    :func:`evaluate_model` with ``settings``; ``starting(i, hf_dir, arm)`` is called before
    the ``i``-th (from 1)."""
    from lm_eval import __version__ as lm_eval_version
    task_manager = official_tasks()
    configs = [task_config(task, task_manager, data_dir) for task in tasks]
    models = []
    for i, hf_dir in enumerate(hf_dirs, 1):
        arm = arm_of(hf_dir)
        starting(i, hf_dir, arm)
        out = evaluate_model(hf_dir, configs, task_manager, **settings)
        models.append({"path": hf_dir, "arm": arm, "results": out["results"],
                       "versions": out["versions"], "n_shot": out["n-shot"],
                       "n_samples": out["n-samples"],
                       "trust_remote_code": needs_remote_code(hf_dir)})
    return {**build_report(models, tasks),
            "tasks": {task: {**official_dataset(task, task_manager),
                             "file": data_file(data_dir, task) if data_dir else None}
                      for task in tasks},
            "lm_eval_version": lm_eval_version,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "settings": {k: str(v) if k in ("device", "dtype") else v
                         for k, v in settings.items()}}
