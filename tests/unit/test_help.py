"""``pretrain_fixedcode.py --help`` is the one before issue 48 made the parser from the configs'
fields (tests/data/pretrain_fixedcode_help.txt, captured from that parser at 100 columns): the
same groups in the same order, each with the same flags and help texts; only the order of the
flags within a group may differ, and the wording fixes listed here, each of which must apply."""

from __future__ import annotations

import re

import pytest

from conftest import REPO
from pretrain_fixedcode import parse_args

GOLDEN = REPO / "tests" / "data" / "pretrain_fixedcode_help.txt"

# flag: (its help's text before, after): each a default said twice, in the help and by
# --help's "(default: ...)", or a --no- switch's "(default: True)", which read as if the switch
# were on by default.
WORDING_FIXES = {
    "--fp8-amax-history-len": ("(default 1, as in Megatron-LM) (default: 1)",
                               "(as in Megatron-LM) (default: 1)"),
    "--fp8-amax-compute-algo": ("(default most_recent, as in Megatron-LM) (default: "
                                "most_recent)", "(as in Megatron-LM) (default: most_recent)"),
    "--no-bias-swiglu-fusion": ("(default: fused on GPUs) (default: True)",
                                "(default: fused on GPUs)"),
    "--no-rope-fusion": ("local layers) (default: True)", "local layers)"),
    "--no-masked-softmax-fusion": ("kernels import) (default: True)", "kernels import)"),
    "--no-gradient-accumulation-fusion": ("imports) (default: True)", "imports)"),
    "--no-manual-gc-eval": ("validation (default: True)", "validation"),
    "--code-values": ("{-1,+1} (default), 01", "{-1,+1}, 01"),
    "--tokenizer-type": ("; default: NullTokenizer (default: NullTokenizer)",
                         " (default: NullTokenizer)"),
    "--lr-wsd-decay-style": ("(default exponential, as in Megatron-LM) (default: exponential)",
                             "(as in Megatron-LM) (default: exponential)"),
    "--tensorboard-log-interval": ("(default 1, as in Megatron-LM)", "(as in Megatron-LM)"),
}


def sections(text: str) -> list[tuple[str, dict]]:
    """``[(group title, {first flag: (invocation, help)})]`` of an argparse ``--help``, the
    text unwrapped (a word split at its hyphen joined again)."""
    out = []
    for block in text.split("\n\n"):
        lines = block.splitlines()
        if not lines or not lines[0].endswith(":") or lines[0].startswith(" "):
            continue
        entries, current = {}, None
        for line in lines[1:]:
            if line.startswith("  -"):
                invocation, _, help_text = line.strip().partition("  ")
                current = [invocation, help_text]
                entries[invocation.split(",")[0].split(" ")[0]] = current
            else:
                current[1] += " " + line.strip()
        out.append((lines[0][:-1], {flag: (inv, re.sub(r"(\w)- (\w)", r"\1-\2",
                                                        " ".join(h.split())))
                                    for flag, (inv, h) in entries.items()}))
    return out


def test_help_is_todays_but_for_the_listed_wording_fixes(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    now = sections(capsys.readouterr().out)
    before = sections(GOLDEN.read_text(encoding="utf-8"))
    assert [title for title, _ in now] == [title for title, _ in before]
    for (title, entries), (_, old) in zip(now, before):
        assert sorted(entries) == sorted(old), title
        for flag, (invocation, help_text) in old.items():
            if flag in WORDING_FIXES:
                was, fixed = WORDING_FIXES[flag]
                assert was in help_text and fixed in entries[flag][1], flag
                help_text = help_text.replace(was, fixed)
            assert entries[flag] == (invocation, help_text), flag
