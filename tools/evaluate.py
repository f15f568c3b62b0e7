"""Evaluate exported models with lm-eval on the paper's tasks, in a table comparing the arms.

    python tools/evaluate.py HF_DIR [HF_DIR ...] --tasks hellaswag,piqa,lambada_openai \\
        --data-dir DATA_DIR [--output-dir eval_results] [--device cpu] [--dtype fp32] \\
        [--batch-size 8] [--limit N] [--bootstrap-iters 100000]

``DATA_DIR`` holds ``hellaswag.jsonl``, ``piqa.jsonl`` and ``lambada_openai.jsonl`` in the
official field layouts (see megatron_ext/hf/eval_tasks.py); the task definitions are
lm-eval's own, zero-shot (its default for these tasks). Offline: ``HF_HUB_OFFLINE=1`` and
``HF_DATASETS_OFFLINE=1`` are set unless ``--online``, which also lets the tasks download the
official datasets when ``--data-dir`` is not given. Prints the table and writes
``results.md`` and ``results.json`` into ``--output-dir``; lm-eval's progress bars show how
far each model has got. A stock export (learned, or a fixed code exported ``--as-table``) is
loaded without ``trust_remote_code``. Each export's model card (its ``README.md``, written by
tools/convert_to_hf.py) gets the results: a table and the Hub's ``model-index``, the rows of
the tasks run replacing those of an earlier evaluation (not with ``--limit``, whose numbers are
not the task's, nor with ``--no-model-card``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Optional, Sequence

from megatron_ext.config.flag_fields import ShowDefaults, add_flags
from megatron_ext.hf.eval_settings import DTYPES, PAPER_TASKS, EvaluateSettings
from megatron_ext.runtime.errors import exits_on_error
from megatron_ext.study.spec import EvalSettings


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Evaluate exported models with lm-eval",
                                     allow_abbrev=False, formatter_class=ShowDefaults)
    parser.add_argument("hf_dirs", nargs="+", metavar="HF_DIR",
                        help="directories written by tools/convert_to_hf.py")
    add_flags(parser, EvaluateSettings, only=("tasks",),
              defaults={"tasks": ",".join(PAPER_TASKS)})
    add_flags(parser, EvalSettings, only=("data_dir",))
    add_flags(parser, EvaluateSettings, only=("online", "output_dir", "device", "dtype"))
    add_flags(parser, EvalSettings, only=("batch_size", "limit"))
    add_flags(parser, EvaluateSettings, only=("bootstrap_iters", "seed", "model_card"))
    args = parser.parse_args(argv)
    if args.data_dir is None and not args.online:
        parser.error("pass --data-dir DIR (local JSONL), or --online to read the official "
                     "datasets from the Hugging Face Hub")
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        parser.error(f"--data-dir {args.data_dir} is not a directory")
    for hf_dir in args.hf_dirs:
        if not os.path.isfile(os.path.join(hf_dir, "config.json")):
            parser.error(f"{hf_dir} has no config.json: not a Hugging Face model directory")
        if not os.path.isfile(os.path.join(hf_dir, "tokenizer_config.json")):
            parser.error(f"{hf_dir} has no tokenizer (exported from a NullTokenizer checkpoint?); "
                         f"lm-eval needs one to tokenize the task texts")
    return args


def main(argv: Optional[Sequence[str]] = None) -> dict:
    with exits_on_error():
        args = parse_args(argv)
        run = EvaluateSettings.from_flags(args)
        tasks = run.task_names
        shared = EvalSettings.from_flags(args, tasks=tuple(tasks))
        if not run.online:
            os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
        # Imported only now: datasets and transformers read the offline switches at import.
        import torch

        from megatron_ext.hf.eval_report import markdown, write_report
        from megatron_ext.hf.eval_tasks import evaluate_models
        from megatron_ext.hf.model_card import evaluation_rows, record_evaluation
        from megatron_ext.hf.parity import needs_remote_code

        logging.basicConfig(format="%(asctime)s %(name)s %(levelname)s: %(message)s")
        logging.getLogger("lm_eval").setLevel(logging.INFO)
        device = run.device or ("cuda" if torch.cuda.is_available() else "cpu")
        report = evaluate_models(
            args.hf_dirs, tasks, shared.data_dir,
            starting=lambda i, hf_dir, arm: print(
                f"[{i}/{len(args.hf_dirs)}] {hf_dir} ({arm} arm, "
                + ("custom code: trust_remote_code" if needs_remote_code(hf_dir)
                   else "stock Llama") + f"): {', '.join(tasks)} on "
                f"{device} in {run.dtype}", flush=True),
            device=device, dtype=DTYPES[run.dtype], batch_size=shared.batch_size,
            limit=shared.limit, bootstrap_iters=run.bootstrap_iters, seed=run.seed)
        md_path, json_path = write_report(report, run.output_dir)
        print(markdown(report))
        print(f"wrote {md_path} and {json_path}")
        for hf_dir in args.hf_dirs if run.model_card else []:
            if shared.limit:
                print(f"{hf_dir}: model card left as it is (a --limit run)")
                continue
            card = record_evaluation(hf_dir, evaluation_rows(report, hf_dir))
            print(f"{hf_dir}: " + (f"results recorded in its model card {card}" if card else
                                   "no model card of tools/convert_to_hf.py: results only in "
                                   f"{run.output_dir}"))
        return report


if __name__ == "__main__":
    main(sys.argv[1:])
