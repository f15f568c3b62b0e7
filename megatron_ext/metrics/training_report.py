"""The arms' training runs compared from their metrics files (tools/training_report.py): the
final train, validation and test loss (and perplexity) of each, as a Markdown table and a figure of
the validation-loss curves. A run is read by :func:`megatron_ext.metrics.sinks.summarise_run`.
"""

from __future__ import annotations

import math

from ..runtime.errors import DataError
from .reporting import number, pyplot, save_figure
from .sinks import summarise_run


def summarise(runs: dict[str, str]) -> dict[str, dict]:
    """Final values per arm: iteration, train loss, validation loss and perplexity, test
    loss (None where the run evaluated no test split)."""
    table = {}
    for arm, path in runs.items():
        run = summarise_run(path)
        if run is None:
            raise DataError(f"{path} holds no training losses: is it a training run?")
        valid = run["valid_curve"]
        table[arm] = {
            "iteration": run["iteration"],
            "train_loss": run["train_loss"],
            "valid_loss": valid[-1][1] if valid else None,
            "valid_ppl": math.exp(valid[-1][1]) if valid else None,
            "valid_curve": valid,
            "test_loss": run["test_loss"],
        }
    return table


def markdown(table: dict[str, dict]) -> str:
    lines = ["| arm | iteration | train loss (last log interval) | validation loss | "
             "validation ppl | test loss |", "|---|---:|---:|---:|---:|---:|"]
    for arm, r in table.items():
        lines.append(f"| {arm} | {r['iteration']} | {number(r['train_loss'], '.4f')} | "
                     f"{number(r['valid_loss'], '.4f')} | {number(r['valid_ppl'], '.2f')} | "
                     f"{number(r['test_loss'], '.4f')} |")
    return "\n".join(lines)


def plot(table: dict[str, dict], path: str) -> None:
    fig, ax = pyplot().subplots(figsize=(6, 4), dpi=120)
    for arm, r in table.items():
        if r["valid_curve"]:
            steps, values = zip(*r["valid_curve"])
            ax.plot(steps, values, marker="o", markersize=3, label=arm)
    ax.set_xlabel("iteration")
    ax.set_ylabel("validation loss")
    ax.set_title("Validation loss per input interface")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)
