"""The paper-shape recipe (examples/smollm2_1p7b) is valid for every arm, read the way
tools/submit.py reads recipes."""

from __future__ import annotations

import subprocess

import pytest

from conftest import REPO
from tools.submit import read_recipe

RECIPE = REPO / "examples" / "smollm2_1p7b" / "recipe.args"


@pytest.mark.parametrize("arm", ["learned", "binary", "gf2"])
def test_recipe_parses_to_the_reference_shape(arm):
    from pretrain_fixedcode import parse_args
    args = parse_args(read_recipe(RECIPE) + ["--input-interface", arm])
    assert (args.num_layers, args.hidden_size, args.ffn_hidden_size, args.num_attention_heads,
            args.seq_length) == (24, 2048, 8192, 32, 2048)
    assert args.untie_embeddings_and_output_weights and args.swiglu
    assert args.normalization == "RMSNorm" and args.disable_bias_linear
    assert args.train_samples * args.seq_length >= 100e9


def test_train_script_refuses_an_unknown_arm():
    proc = subprocess.run(["bash", str(RECIPE.with_name("train.sh")), "hamming"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown arm 'hamming'" in proc.stderr


def test_train_script_passes_the_recipe_and_the_arm(tmp_path):
    """train.sh hands torchrun exactly the recipe's flags plus the arm's own, with
    CUDA_DEVICE_MAX_CONNECTIONS=1 in its environment."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "torchrun").write_text('#!/bin/sh\necho "$CUDA_DEVICE_MAX_CONNECTIONS"\n'
                                   'for a in "$@"; do echo "$a"; done\n')
    (fake / "torchrun").chmod(0o755)
    run_dir = tmp_path / "runs"
    proc = subprocess.run(["bash", str(RECIPE.with_name("train.sh")), "gf2", str(run_dir)],
                          capture_output=True, text=True, check=True,
                          env={"PATH": f"{fake}:/usr/bin:/bin", "GPUS_PER_NODE": "4"})
    connections, *argv = proc.stdout.split("\n")[:-1]
    assert connections == "1"
    assert argv[:3] == ["--nproc-per-node", "4", str(REPO / "pretrain_fixedcode.py")]
    ckpt = str(run_dir / "gf2" / "checkpoints")
    assert argv[3:] == read_recipe(RECIPE) + [
        "--input-interface", "gf2", "--save", ckpt, "--load", ckpt,
        "--tensorboard-dir", str(run_dir / "gf2" / "tensorboard"), "--exit-signal-handler"]


@pytest.mark.parametrize("name, seeds, samples", [("study_100b.toml", (1234,), 48828125),
                                                   ("study_seeds_10b.toml", (1, 2, 3), 4882813)])
def test_paper_study_files_define_the_three_arms(name, seeds, samples):
    from megatron_ext.study import spec
    from pretrain_fixedcode import parse_args
    path = RECIPE.with_name(name)
    study = spec.build_study(spec.read_study_file(str(path)), path.parent)
    assert [a.name for a in study.arms] == ["learned", "binary", "gf2"]
    assert study.seeds == seeds and study.control == "learned"
    assert study.eval.tasks == ("hellaswag", "piqa", "lambada_openai")
    args = parse_args([*study.recipe, *study.arm("gf2").training_flags(), "--seed", "1"])
    assert args.train_samples == samples and args.hidden_size == 2048
