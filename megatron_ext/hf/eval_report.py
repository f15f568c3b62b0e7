"""The comparison table of evaluated models, beside the paper's published numbers.

Accuracies are percentages (as the paper prints them), perplexity is as lm-eval gives it;
``±`` is lm-eval's bootstrap standard error (absent when it was not computed).
"""

from __future__ import annotations

import json
import os
from typing import Optional

from ..metrics.reporting import MISSING
from ..runtime.files import write_text
from .convert import RECORD_KEY

# (task, metric) rows of the table, in order.
METRICS = (("hellaswag", "acc_norm"), ("piqa", "acc"), ("lambada_openai", "acc"),
           ("lambada_openai", "perplexity"))
PERCENT = {"acc", "acc_norm"}
# The paper's binary arm (the only arm it publishes numbers for).
PAPER = {"binary": {("hellaswag", "acc_norm"): 52.40, ("piqa", "acc"): 70.51,
                    ("lambada_openai", "acc"): 42.75}}


def arm_of(hf_dir: str) -> str:
    """The arm of an export (``learned``, ``binary``, ...) from its ``config.json``: the
    custom code's scheme, or what a stock Llama's record says (a Llama without one: learned)."""
    with open(os.path.join(hf_dir, "config.json")) as f:
        config = json.load(f)
    if config.get("model_type") == "fixedcode_llama":
        return config["fixed_code"]["scheme"]
    if isinstance(config.get(RECORD_KEY), dict) and "arm" in config[RECORD_KEY]:
        return config[RECORD_KEY]["arm"]
    return "learned" if config.get("model_type") == "llama" else config.get("model_type", "?")


def metric_values(results: dict, task: str, metric: str) -> Optional[dict]:
    """``{"value", "stderr"}`` from lm-eval's ``results[task]`` (stderr None if not computed)."""
    task_results = results.get(task, {})
    if f"{metric},none" not in task_results:
        return None
    scale = 100.0 if metric in PERCENT else 1.0
    stderr = task_results.get(f"{metric}_stderr,none")
    return {"value": task_results[f"{metric},none"] * scale,
            "stderr": stderr * scale if isinstance(stderr, (int, float)) else None}


def build_report(models: list[dict], tasks: list[str]) -> dict:
    """``models``: ``[{"path", "arm", "results"}]`` (lm-eval's ``results`` dict; lm-eval's
    ``versions``, ``n_shot`` and ``n_samples`` and ``trust_remote_code``, where given, are
    kept) -> the report."""
    rows = []
    for task, metric in METRICS:
        if task not in tasks:
            continue
        row = {"task": task, "metric": metric, "models": {}}
        for m in models:
            row["models"][m["path"]] = metric_values(m["results"], task, metric)
        row["paper"] = {arm: nums[(task, metric)] for arm, nums in PAPER.items()
                        if (task, metric) in nums}
        rows.append(row)
    return {"models": [{"path": m["path"], "arm": m["arm"], "lm_eval_results": m["results"],
                        **{k: m[k] for k in ("versions", "n_shot", "n_samples",
                                             "trust_remote_code") if k in m}}
                       for m in models], "rows": rows}


def _cell(values: Optional[dict]) -> str:
    if values is None:
        return MISSING
    if values["stderr"] is None:
        return f"{values['value']:.2f}"
    return f"{values['value']:.2f} ± {values['stderr']:.2f}"


def markdown(report: dict) -> str:
    paper_arms = sorted(PAPER)
    header = (["task", "metric"] + [f"{m['arm']} ({m['path']})" for m in report["models"]]
              + [f"paper ({arm})" for arm in paper_arms])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in report["rows"]:
        cells = [row["task"], row["metric"] + (" (%)" if row["metric"] in PERCENT else "")]
        cells += [_cell(row["models"][m["path"]]) for m in report["models"]]
        cells += [f"{row['paper'][arm]:.2f}" if arm in row["paper"] else MISSING
                  for arm in paper_arms]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "± is lm-eval's bootstrap standard error (one standard error, not a 95% "
              "interval); the paper's numbers are single runs."]
    limit = report.get("settings", {}).get("limit")
    if limit:
        lines.append(f"Run with --limit {limit}: the first {limit} documents of each task, "
                     f"not comparable with the paper's full-split numbers.")
    return "\n".join(lines)


def write_report(report: dict, output_dir: str) -> tuple[str, str]:
    """Write ``results.md`` and ``results.json`` into ``output_dir``; their paths."""
    os.makedirs(output_dir, exist_ok=True)
    md_path = os.path.join(output_dir, "results.md")
    json_path = os.path.join(output_dir, "results.json")
    write_text(md_path, markdown(report) + "\n")
    write_text(json_path, json.dumps(report, indent=2))
    return md_path, json_path
