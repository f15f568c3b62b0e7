"""The paper recipe's data: fetch the SmolLM2 tokenizer and corpus (network), then build the blend
that recipe.args points at (offline). See DATA.md.

    python examples/smollm2_1p7b/prepare_data.py fetch --download-dir downloads
    python examples/smollm2_1p7b/prepare_data.py build --download-dir downloads --workers 32
    python examples/smollm2_1p7b/prepare_data.py heldout

``fetch`` downloads, with huggingface_hub, the tokenizer of ``HuggingFaceTB/SmolLM2-1.7B``
(49,152 tokens) into the recipe's ``--tokenizer-model`` folder and the Parquet shards of each
component of ``HuggingFaceTB/smollm-corpus`` into ``DOWNLOAD_DIR/COMPONENT/``, and records the
exact commit of each repository in ``DOWNLOAD_DIR/fetched.json`` (``--revision`` pins them).
Interrupted, it resumes (huggingface_hub skips complete files).

``build`` runs tools/preprocess_data.py on each component (``--append-eod``; resumable: rerun
the same command) into the prefixes of the recipe's ``--data-path``, then writes
``blend.json`` next to them: documents and tokens per component, the blend weights, and the
epochs of each component's train split that the recipe's ``--train-samples`` take (above 1 it
stops: the recipe sets ``--max-data-epochs 1``).

``heldout`` writes the studies' held-out set (``--heldout-prefix``, default
``data/heldout_text_document``, the ``[eval] data_path`` of study_100b.toml and
study_seeds_10b.toml) from documents the training blend never reads: those of the first
component (``--component``) after its train split under the recipe's ``--split`` (Megatron's
split gives a dataset's first documents to training), in order, until ``--heldout-tokens``
tokens. ``PREFIX.json`` beside it records the source prefix, the document range and the
tokens.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Optional

from megatron_ext.datasets.indexed import read_index
from megatron_ext.datasets.split_checks import split_ranges, train_epochs
from megatron_ext.runtime.errors import exits_on_error
from megatron_ext.runtime.files import write_json

REPO = Path(__file__).resolve().parents[2]

RECIPE = Path(__file__).resolve().parent / "recipe.args"
TOKENIZER_REPO = "HuggingFaceTB/SmolLM2-1.7B"
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
CORPUS_REPO = "HuggingFaceTB/smollm-corpus"
COMPONENTS = ("fineweb-edu-dedup", "cosmopedia-v2")  # folders of CORPUS_REPO, text column "text"
SUFFIX = "_text_document"


def recipe_flags(path: Path) -> dict[str, list[str]]:
    """``{flag: [values]}`` of a recipe file."""
    flags: dict[str, list[str]] = {}
    for token in shlex.split(path.read_text(), comments=True):
        if token.startswith("--"):
            current = flags.setdefault(token, [])
        else:
            current.append(token)
    return flags


def recipe_blend(flags: dict[str, list[str]], recipe: Path) -> list[tuple[str, float, str]]:
    """``(component, weight, prefix)`` of each ``--data-path`` pair of the recipe."""
    values = flags.get("--data-path", [])
    pairs = list(zip(values[::2], values[1::2]))
    blend = []
    for weight, prefix in pairs:
        name = os.path.basename(prefix)[:-len(SUFFIX)] if prefix.endswith(SUFFIX) else None
        if name not in COMPONENTS:
            raise SystemExit(f"error: {recipe}: --data-path {prefix} is not one of "
                             f"{', '.join(c + SUFFIX for c in COMPONENTS)}")
        blend.append((name, float(weight), prefix))
    if not blend or len(values) != 2 * len(pairs):
        raise SystemExit(f"error: {recipe}: --data-path must be weight/prefix pairs")
    return blend


def fetch(args: argparse.Namespace, flags: dict[str, list[str]]) -> None:
    from huggingface_hub import HfApi, snapshot_download

    api = HfApi()
    tokenizer_sha = api.model_info(TOKENIZER_REPO, revision=args.tokenizer_revision).sha
    corpus_sha = api.dataset_info(CORPUS_REPO, revision=args.revision).sha
    snapshot_download(TOKENIZER_REPO, revision=tokenizer_sha, allow_patterns=TOKENIZER_FILES,
                      local_dir=flags["--tokenizer-model"][0])
    components = [name for name, _, _ in recipe_blend(flags, args.recipe)]
    snapshot_download(CORPUS_REPO, repo_type="dataset", revision=corpus_sha,
                      allow_patterns=[f"{name}/*.parquet" for name in components],
                      local_dir=args.download_dir, max_workers=args.workers)
    write_json(os.path.join(args.download_dir, "fetched.json"),
               {"tokenizer": [TOKENIZER_REPO, tokenizer_sha],
                "corpus": [CORPUS_REPO, corpus_sha], "components": components})
    print(f"fetched {TOKENIZER_REPO}@{tokenizer_sha} and {CORPUS_REPO}@{corpus_sha}")


def build(args: argparse.Namespace, flags: dict[str, list[str]]) -> dict:
    blend = recipe_blend(flags, args.recipe)
    tokenizer = flags["--tokenizer-model"][0]
    report = {"tokenizer": tokenizer, "components": {}}
    for name, weight, prefix in blend:
        output_prefix = prefix[:-len(SUFFIX)]
        if not os.path.exists(f"{prefix}.idx"):
            folder = os.path.join(args.download_dir, name)
            if not os.path.isdir(folder):
                raise SystemExit(f"error: {folder} does not exist: run the fetch step first")
            os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
            resume = os.path.isdir(f"{output_prefix}.work")
            done = subprocess.run([sys.executable, str(REPO / "tools/preprocess_data.py"),
                                   "--input", folder, "--output-prefix", output_prefix,
                                   "--tokenizer-type", flags["--tokenizer-type"][0],
                                   "--tokenizer-model", tokenizer, "--append-eod",
                                   "--workers", str(args.workers)] + ["--resume"] * resume)
            if done.returncode != 0:
                raise SystemExit(f"error: tools/preprocess_data.py failed on {folder} (exit "
                                 f"{done.returncode}); rerun to resume")
        index = read_index(prefix)
        report["components"][name] = {"prefix": prefix, "documents": index.documents,
                                      "tokens": index.tokens(), "weight": weight}
    train_samples, seq_length = int(flags["--train-samples"][0]), int(flags["--seq-length"][0])
    split = flags.get("--split", ["969,30,1"])[0]
    total = sum(weight for _, weight, _ in blend)
    epochs = dict(train_epochs(([p for _, _, p in blend], [w for _, w, _ in blend]), None, split,
                               seq_length, train_samples))
    for name, weight, prefix in blend:
        report["components"][name].update(share=weight / total, train_epochs=epochs[prefix])
    report.update(train_samples=train_samples, seq_length=seq_length, split=split,
                  tokens=sum(c["tokens"] for c in report["components"].values()))
    out = os.path.join(os.path.dirname(os.path.abspath(blend[0][2])), "blend.json")
    write_json(out, report)
    for name, entry in report["components"].items():
        print(f"{name}: {entry['tokens']:,} tokens, weight {entry['weight']:g} "
              f"({entry['share']:.1%}), {entry['train_epochs']:.2f} epochs of its train split")
    print(f"wrote {out}")
    worst = max(epochs.values())
    limit = float(flags.get("--max-data-epochs", ["inf"])[0])
    if worst > limit:
        raise SystemExit(f"error: a component would be read {worst:.2f} times, more than the "
                         f"recipe's --max-data-epochs {limit:g}: fetch more data or lower its "
                         "weight")
    return report


def heldout(args: argparse.Namespace, flags: dict[str, list[str]]) -> dict:
    """Write the held-out set from the documents after a component's train split."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    blend = {name: prefix for name, _, prefix in recipe_blend(flags, args.recipe)}
    name = args.component or next(iter(blend))
    if name not in blend:
        raise SystemExit(f"error: --component {name} is not in the recipe's --data-path "
                         f"({', '.join(blend)})")
    prefix, split = blend[name], flags.get("--split", ["969,30,1"])[0]
    if not os.path.exists(f"{prefix}.idx"):
        raise SystemExit(f"error: {prefix}.idx does not exist: run the build step first")
    index = read_index(prefix)
    begin = (split_ranges(split, index.sequences)[0] or (0, 0))[1]
    if index.sequences != index.documents:
        raise SystemExit(f"error: {prefix} splits sentences: its split ranges are not "
                         f"document ranges")
    dataset = IndexedDataset(prefix)
    out = Path(args.heldout_prefix)
    out.parent.mkdir(parents=True, exist_ok=True)
    builder = IndexedDatasetBuilder(f"{out}.bin", dtype=dataset.index.dtype)
    end, tokens = begin, 0
    while tokens < args.heldout_tokens and end < len(dataset):
        document = np.array(dataset[end])  # a writable copy of the memory-mapped document
        builder.add_document(torch.from_numpy(document), [len(document)])
        tokens, end = tokens + len(document), end + 1
    if tokens < args.heldout_tokens:
        raise SystemExit(f"error: {prefix} holds {tokens:,} tokens after its train split "
                         f"(documents {begin:,}..{len(dataset):,} under --split {split}); "
                         f"--heldout-tokens asks for {args.heldout_tokens:,}: lower it or "
                         f"give the valid split more weight")
    builder.finalize(f"{out}.idx")
    report = {"source": prefix, "split": split, "documents": [begin, end], "tokens": tokens,
              "train_documents": [0, begin]}
    write_json(f"{out}.json", report)
    print(f"wrote {out} from documents {begin:,}..{end:,} of {prefix} ({tokens:,} tokens; "
          f"its train split is documents 0..{begin:,})")
    return report


def main(argv: Optional[list[str]] = None) -> Optional[dict]:
    with exits_on_error():
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument("step", choices=("fetch", "build", "heldout"),
                            help="fetch: download (network); build: preprocess (offline); "
                                 "heldout: write the studies' held-out set from documents "
                                 "after the train split (offline)")
        parser.add_argument("--recipe", type=Path, default=RECIPE,
                            help="recipe whose --data-path, --tokenizer-model, --train-samples, "
                                 "--seq-length and --split are used (default: recipe.args)")
        parser.add_argument("--download-dir",
                            help="where the corpus Parquet shards go (fetch) or are (build)")
        parser.add_argument("--workers", type=int, default=os.cpu_count(),
                            help="download threads (fetch) or tokenizer processes (build)")
        parser.add_argument("--revision", default="main",
                            help=f"commit or branch of {CORPUS_REPO} (fetch; default: main)")
        parser.add_argument("--tokenizer-revision", default="main",
                            help=f"commit or branch of {TOKENIZER_REPO} (fetch; default: main)")
        parser.add_argument("--component", help="heldout: the component whose documents after "
                                                "its train split are read (default: the first)")
        parser.add_argument("--heldout-prefix", default=str(REPO / "data/heldout_text_document"),
                            help="heldout: the output prefix (default data/heldout_text_document)")
        parser.add_argument("--heldout-tokens", type=int, default=2 * 1048576,
                            help="heldout: tokens to write (default 2,097,152: twice the "
                                 "studies' 1,048,576 eval tokens)")
        args = parser.parse_args(argv)
        if args.step != "heldout" and not args.download_dir:
            parser.error(f"{args.step} needs --download-dir")
        if not args.recipe.is_file():
            raise SystemExit(f"error: --recipe {args.recipe}: no such file")
        flags = recipe_flags(args.recipe)
        if args.step == "fetch":
            return fetch(args, flags)
        return build(args, flags) if args.step == "build" else heldout(args, flags)


if __name__ == "__main__":
    main()
