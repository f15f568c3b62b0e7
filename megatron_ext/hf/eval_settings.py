"""tools/evaluate.py's flags (lm-eval on exported models) besides those it shares with a
study's evaluation (``megatron_ext.study.spec.EvalSettings``: ``--data-dir``, ``--batch-size``,
``--limit``); ``--tasks`` is a study's too. Imports nothing heavy: datasets and transformers
read the offline switches at import, after the flags are parsed."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..config.flag_fields import FlagConfig, flag

PAPER_TASKS = ("hellaswag", "piqa", "lambada_openai")
# --dtype: the torch dtype each name loads the weights in.
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclasses.dataclass(frozen=True)
class EvaluateSettings(FlagConfig):
    """How exports are evaluated: the tasks (comma-separated), network access, where the
    results go, the device and dtype, lm-eval's bootstrap and seed, and whether the exports'
    model cards get the results."""
    tasks: Optional[str] = flag(
        None, "comma-separated downstream tasks, from " + ",".join(PAPER_TASKS))
    online: bool = flag(False, "allow network access (without --data-dir: the Hub datasets)")
    output_dir: str = flag("eval_results", "where results.md and results.json go")
    device: Optional[str] = flag(None, "default: cuda if visible, else cpu")
    dtype: str = flag("fp32", "dtype the models are loaded in", choices=sorted(DTYPES))
    bootstrap_iters: int = flag(100000, "bootstrap resamples for the standard errors (0: none)",
                                least=0)
    seed: int = flag(1234, "lm-eval's random seed", least=0)
    model_card: bool = flag(True, "leave the exports' model cards (README.md) as they are")

    @property
    def task_names(self) -> list[str]:
        return [t.strip() for t in (self.tasks or "").split(",") if t.strip()]
