"""The paper-shape recipe (examples/smollm2_1p7b) is valid for every arm."""

from __future__ import annotations

import subprocess

import pytest

from conftest import REPO

RECIPE = REPO / "examples" / "smollm2_1p7b" / "recipe.args"


def recipe_flags() -> list[str]:
    return " ".join(line.split("#")[0] for line in RECIPE.read_text().splitlines()).split()


@pytest.mark.parametrize("arm", ["learned", "binary", "gf2"])
def test_recipe_parses_to_the_reference_shape(arm):
    from pretrain_fixedcode import parse_args
    args = parse_args(recipe_flags() + ["--input-interface", arm])
    assert (args.num_layers, args.hidden_size, args.ffn_hidden_size, args.num_attention_heads,
            args.seq_length) == (24, 2048, 8192, 32, 2048)
    assert args.untie_embeddings_and_output_weights and args.swiglu
    assert args.normalization == "RMSNorm" and args.disable_bias_linear
    assert args.train_samples * args.seq_length >= 100e9


def test_train_script_refuses_an_unknown_arm():
    proc = subprocess.run(["bash", str(RECIPE.with_name("train.sh")), "hamming"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown arm 'hamming'" in proc.stderr
