"""Where the training metrics go, besides stdout: TensorBoard (``--tensorboard-dir``), the
run's metrics file (``metrics.jsonl``) and Weights & Biases (``--wandb-project``).

:class:`megatron_ext.metrics.logger.MetricsLogger` computes one dict of scalars per log interval
and per validation, and hands the same dict to every sink, so the three records hold the
same values; ``where`` (iteration, consumed samples, tokens, time) goes to the metrics
file. TensorBoard and wandb (``per_iteration``) also take a ``"step"`` record every
``--tensorboard-log-interval`` iterations, as Megatron-LM writes them: the iteration's own
loss, learning rate, batch size and grad norm, which their log-interval record then leaves
out. Only the logging rank builds sinks.

``metrics.jsonl``: one JSON object per line, ``{"kind": "train" | "valid", "iteration",
"consumed_samples", "tokens", "time" (Unix seconds), <scalar>: <value>, ...}`` with the
scalars under their TensorBoard names (``"lm loss"``, ``"learning-rate"``, ...) at full
precision. The file describes the run being continued: on resume, lines after the resumed
iteration (logged by the interrupted run after its last checkpoint) are dropped, so each
iteration appears once.
"""

from __future__ import annotations

import json
import os
from typing import Optional

from ..config.run_config import LoggingConfig
from ..runtime.errors import DataError, DeviceError
from ..runtime.files import write_text


class TensorBoardSink:
    """Scalars by iteration; each iteration's and each validation's also by consumed samples
    (``"lm loss vs samples"``, ...), as Megatron-LM's."""

    per_iteration = True  # takes the "step" records

    def __init__(self, logdir: str):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(log_dir=logdir, max_queue=100)

    def write(self, kind: str, iteration: int, scalars: dict, where: dict) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, iteration)
            if kind in ("step", "valid"):
                self.writer.add_scalar(f"{tag} vs samples", value, where["consumed_samples"])

    def close(self) -> None:
        self.writer.close()


def read_metrics(path: str) -> list[dict]:
    """The records of a metrics file, or of ``PATH/metrics.jsonl`` for a directory; a
    malformed line is an error naming the file and line."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    if not os.path.isfile(path):
        raise DataError(f"{path} does not exist (no metrics file: was the run started "
                        f"with --save or --metrics-file?)")
    records = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{number}: not a JSON record ({e})") from e
    return records


def summarise_run(path: str) -> Optional[dict]:
    """What the reports over runs read from a metrics file (or a ``--save`` directory's):
    ``iteration`` and ``train_loss`` of the last training record, ``skipped`` (steps skipped
    so far), ``tokens_per_iteration``, ``valid_curve``, ``[(iteration, loss)]`` with the
    last record of an iteration winning (a validation redone after an interruption), and
    ``test_loss``, the end of training's test evaluation (None without one); None when the
    file holds no training record."""
    records = read_metrics(path)
    train = [r for r in records if r["kind"] == "train"]
    if not train:
        return None
    return {"iteration": train[-1]["iteration"], "train_loss": train[-1]["lm loss"],
            "skipped": train[-1].get("skipped-iterations", 0),
            "tokens_per_iteration": train[0]["tokens"] // train[0]["iteration"],
            "valid_curve": sorted({r["iteration"]: r["lm loss validation"] for r in records
                                   if r["kind"] == "valid"}.items()),
            "test_loss": next((r["lm loss test"] for r in reversed(records)
                               if r["kind"] == "test"), None)}


class JsonlSink:
    """Appends to ``path``, one flushed line per record, after dropping the records of
    iterations beyond ``resumed_iteration`` (rewritten atomically)."""

    per_iteration = False  # a line per log interval, not per iteration

    def __init__(self, path: str, resumed_iteration: int):
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        if os.path.exists(path):
            kept = [r for r in read_metrics(path) if r["iteration"] <= resumed_iteration]
            write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
        self.file = open(path, "a")

    def write(self, kind: str, iteration: int, scalars: dict, where: dict) -> None:
        self.file.write(json.dumps({"kind": kind, **where, **scalars}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def agree_wandb_run_id(config: LoggingConfig, saved: Optional[str]) -> Optional[str]:
    """The wandb run id of this training run, the same on every rank (rank 0's; the id is
    saved in each checkpoint, so ranks other than the logging rank must know it): the one
    ``saved`` in the run's own checkpoint, else a new one. None without ``--wandb-project``."""
    if not config.wandb_project:
        return None
    import torch
    chosen = [saved or f"fixedcode-{os.urandom(6).hex()}"]
    torch.distributed.broadcast_object_list(chosen, src=0)
    return chosen[0]


class WandbSink:
    """One wandb run per training run: a resumed run (the same ``--save`` directory)
    continues the run id stored in its checkpoint. Offline clusters: ``WANDB_MODE=offline``,
    then ``wandb sync`` the run directory."""

    per_iteration = True  # takes the "step" records

    def __init__(self, config: LoggingConfig, save: Optional[str], record: dict, run_id: str):
        """``save``: the run's ``--save`` (its ``wandb`` folder is the default
        ``--wandb-save-dir``); ``record``: the run's arguments with the derived values
        (derived.run_record)."""
        try:
            import wandb
        except ImportError as e:
            raise DeviceError("--wandb-project needs wandb: pip install "
                              "'fixedcode[wandb]' (or pip install wandb)") from e
        save_dir = config.wandb_save_dir or (os.path.join(save, "wandb") if save else None)
        if save_dir:
            os.makedirs(save_dir, exist_ok=True)
        self.run = wandb.init(
            project=config.wandb_project, entity=config.wandb_entity,
            name=config.wandb_exp_name,
            dir=save_dir, id=run_id, resume="allow",
            config=record)

    def write(self, kind: str, iteration: int, scalars: dict, where: dict) -> None:
        self.run.log(scalars, step=iteration)

    def close(self) -> None:
        self.run.finish()
