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
from typing import Optional, Sequence

from megatron_ext.config.data_config import TOKENIZER_FLAGS, DataConfig
from megatron_ext.config.flag_fields import ShowDefaults, add_flags
from megatron_ext.probes.settings import HELD_OUT_GROUP, ProbeRun, ProbeSettings
from megatron_ext.runtime.errors import exits_on_error


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False,
                                     formatter_class=ShowDefaults)
    parser.add_argument("models", nargs="+", metavar="[NAME=]PATH",
                        help="a Hugging Face export or a training checkpoint folder; NAME "
                             "defaults to the folder's name")
    data = parser.add_argument_group(HELD_OUT_GROUP)
    add_flags(data, ProbeSettings, title=HELD_OUT_GROUP)
    add_flags(data, ProbeRun, title=HELD_OUT_GROUP)
    add_flags(data, DataConfig, only=TOKENIZER_FLAGS,  # --jsonl's: the models' own
              defaults={"tokenizer_type": "SentencePieceTokenizer"})
    probe = parser.add_argument_group(ProbeSettings.FLAG_GROUP)
    add_flags(probe, ProbeSettings, title=ProbeSettings.FLAG_GROUP)
    add_flags(probe, ProbeRun, title=ProbeRun.FLAG_GROUP)
    add_flags(parser, ProbeRun, only=("output",))
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
        settings, run = ProbeSettings.from_flags(args), ProbeRun.from_flags(args)
        settings.check()
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
        if settings.data_path:
            from megatron_ext.probes.models import check_held_out
            check_held_out(infos, settings.data_path, settings.allow_train_text)
        else:
            from megatron_ext.datasets.tokenizer import tokenizer_from_args
            from megatron_ext.probes.models import check_text_tokenizer
            data = DataConfig.from_record({k: getattr(args, k) for k in TOKENIZER_FLAGS})
            tokenizer = tokenizer_from_args(data)
            tokenizer_name = f"{data.tokenizer_type} {data.tokenizer_model or data.vocab_file}"
            check_text_tokenizer(infos, tokenizer, tokenizer_name)
        seq_length = run.seq_length or min(i.context for i in infos)
        windows, documents, source = held_out(settings.tokens, seq_length, settings.data_path,
                                              run.jsonl, run.json_key, tokenizer, tokenizer_name)
        unigrams = training_unigrams(infos, settings.unigram_counts)
        result = run_probes(infos, windows, documents, settings, source, unigrams,
                            device=run.device, cka=run.cka,
                            progress=lambda m: print(m, flush=True))
        text = report.write(result, run.output)
        print(text)
        print(f"[probes] {result['seconds']:.1f} s; wrote {run.output / 'probes.json'}, "
              f"probes.md and probes.png")
        return result


if __name__ == "__main__":
    main(sys.argv[1:])
