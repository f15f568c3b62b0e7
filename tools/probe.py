"""Probe what each layer of one or more models represents, with controls (docs/probes.md).

    python tools/probe.py learned=demo/checkpoints/learned binary=demo/checkpoints/binary \\
        gf2=demo/checkpoints/gf2 --data-path demo/data/valid_text_document --output probes

A model is ``[NAME=]PATH``: a Hugging Face export (tools/convert_to_hf.py) or a training
checkpoint's ``--save`` folder (its latest save, converted on the fly). The held-out text is
an indexed dataset (``--data-path``, its first ``--tokens`` tokens, as a study's held-out
set) or a JSONL file (``--jsonl``) encoded with ``--tokenizer-type``/``--tokenizer-model``,
each document followed by the end-of-document token. Writes ``probes.json``, ``probes.md``
and ``probes.png`` into ``--output`` and prints the tables.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from megatron_ext.config.data_config import add_tokenizer_flags
from megatron_ext.probes.settings import ProbeSettings
from megatron_ext.runtime.errors import exits_on_error

DEFAULTS = ProbeSettings()


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("models", nargs="+", metavar="[NAME=]PATH",
                        help="a Hugging Face export or a training checkpoint folder; NAME "
                             "defaults to the folder's name")
    data = parser.add_argument_group("held-out text (one of)")
    data.add_argument("--data-path", help="indexed dataset prefix (PREFIX.bin/.idx)")
    data.add_argument("--jsonl", help="JSONL file (.gz/.zst too), one document per line")
    data.add_argument("--json-key", default="text", help="the JSONL text key (default text)")
    add_tokenizer_flags(data, default="SentencePieceTokenizer")  # --jsonl's: the models' own
    probe = parser.add_argument_group("probes")
    probe.add_argument("--tokens", type=int, default=DEFAULTS.tokens,
                       help=f"held-out tokens read (default {DEFAULTS.tokens})")
    probe.add_argument("--seq-length", type=int,
                       help="window length (default: the shortest training sequence length "
                            "of the models)")
    probe.add_argument("--sample", type=int, default=DEFAULTS.sample,
                       help=f"token positions whose hidden states are kept (default "
                            f"{DEFAULTS.sample}); memory grows with it")
    probe.add_argument("--top-k", type=int, default=DEFAULTS.top_k,
                       help=f"classes of the token classifiers (default {DEFAULTS.top_k})")
    probe.add_argument("--ridge", type=float, default=DEFAULTS.ridge,
                       help="a fixed ridge penalty relative to the mean feature variance "
                            "(default: chosen per layer by cross-validation over the "
                            "training documents)")
    probe.add_argument("--seed", type=int, default=DEFAULTS.seed,
                       help="the sample, the probe seeds (split, control task) and the random "
                            "initialisations (default 0)")
    probe.add_argument("--probe-seeds", type=int, default=DEFAULTS.probe_seeds,
                       help=f"probe seeds: the split into training and scoring documents, the "
                            f"control pairing and the folds are drawn anew for each, and every "
                            f"number is their mean with a 95%% interval over them (default "
                            f"{DEFAULTS.probe_seeds}); the hidden states are collected once")
    probe.add_argument("--unigram-counts", metavar="PATH",
                       help="the training corpus's unigram counts that pair the control tasks "
                            "and feed the frequency-only baseline: an indexed dataset prefix "
                            "(counted, cached beside it) or a .npy of counts per id (default: "
                            "counted from the checkpoints' training data; needed for Hugging "
                            "Face exports and --mock-data runs)")
    probe.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size,
                       help=f"windows per forward pass (default {DEFAULTS.batch_size})")
    probe.add_argument("--no-cka", action="store_true",
                       help="skip CKA across models (needed for models whose vocabularies "
                            "or tokenizers differ)")
    probe.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    probe.add_argument("--allow-train-text", action="store_true",
                       help="probe a --data-path that a checkpoint trained on (refused "
                            "otherwise; the report then says so)")
    parser.add_argument("--output", type=Path, default=Path("probes"),
                        help="output folder (default probes/)")
    args = parser.parse_args(argv)
    if (args.data_path is None) == (args.jsonl is None):
        parser.error("give the held-out text as one of --data-path or --jsonl")
    if args.jsonl and not (args.tokenizer_model or args.vocab_file):
        parser.error("--jsonl needs the models' tokenizer that encodes the text: "
                     "--tokenizer-model (GPT2BPETokenizer: --vocab-file, --merge-file)")
    return args


def main(argv: Optional[Sequence[str]] = None) -> dict:
    with exits_on_error():
        args = parse_args(argv)
        from megatron_ext.probes import report
        from megatron_ext.probes.frequency import training_unigrams
        from megatron_ext.probes.models import describe
        from megatron_ext.probes.run import run_probes
        from megatron_ext.probes.text import held_out
        infos = []
        for spec in args.models:
            name, sep, path = spec.partition("=")
            infos.append(describe(path, name) if sep else describe(spec))
        tokenizer = tokenizer_name = None
        if args.data_path:
            from megatron_ext.probes.models import check_held_out
            check_held_out(infos, args.data_path, args.allow_train_text)
        else:
            from megatron_ext.datasets.tokenizer import tokenizer_from_args
            from megatron_ext.probes.models import check_text_tokenizer
            tokenizer = tokenizer_from_args(args)
            tokenizer_name = f"{args.tokenizer_type} {args.tokenizer_model or args.vocab_file}"
            check_text_tokenizer(infos, tokenizer, tokenizer_name)
        seq_length = args.seq_length or min(i.context for i in infos)
        windows, documents, source = held_out(args.tokens, seq_length, args.data_path, args.jsonl,
                                              args.json_key, tokenizer, tokenizer_name)
        settings = ProbeSettings(data_path=args.data_path, tokens=args.tokens, sample=args.sample,
                                 top_k=args.top_k, ridge=args.ridge, seed=args.seed,
                                 probe_seeds=args.probe_seeds,
                                 unigram_counts=args.unigram_counts,
                                 batch_size=args.batch_size,
                                 allow_train_text=args.allow_train_text)
        settings.check()
        unigrams = training_unigrams(infos, args.unigram_counts)
        result = run_probes(infos, windows, documents, settings, source, unigrams,
                            device=args.device, cka=not args.no_cka,
                            progress=lambda m: print(m, flush=True))
        text = report.write(result, args.output)
        print(text)
        print(f"[probes] {result['seconds']:.1f} s; wrote {args.output / 'probes.json'}, "
              f"probes.md and probes.png")
        return result


if __name__ == "__main__":
    main(sys.argv[1:])
