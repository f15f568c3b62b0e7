"""The arms of issue 31 trained end to end (in this process): the frozen random table, the
factorised table and a fixed code with its trainable map each train, resume exactly, keep what
is fixed bit for bit, refuse another arm on resume and export with logit parity; the input
table's learning-rate multiplier at 0 freezes the table and at 1 is the recipe."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from conftest import TINY_RUN, run_pretrain, step_losses
from megatron_ext.hf.megatron_checkpoint import load_model, read_checkpoint
from megatron_ext.codes.schemes import build_code
from megatron_ext.model.provider import model_provider
from megatron_ext.runtime.errors import CheckpointError
from megatron_ext.runtime.initialize import set_seed
from megatron_ext.checkpoint.resume import resolve_checkpoint
from megatron_ext.train.setup import check_machine_and_tokenizer
from pretrain_fixedcode import parse_args

ARMS = {"frozen": ["--input-interface", "frozen"],
        "factorized": ["--input-interface", "factorized", "--input-table-rank", "8"],
        "binary_map": ["--input-interface", "binary", "--code-projection"]}
RUN = TINY_RUN + ["--train-iters", "6", "--lr-warmup-iters", "1"]
# One worker runs the file, with the study and probes tests: arm_runs and conftest's tiny_study
# are each built once (under --dist loadgroup the file's tests went to both workers).
pytestmark = pytest.mark.xdist_group("study")


@pytest.fixture(scope="module")
def arm_runs(tmp_path_factory) -> dict:
    """``{arm: (uninterrupted run, resumed run, checkpoint folder)}``: each arm 6 steps
    straight, and 6 steps stopped after a save at 3 and resumed. Read-only."""
    runs = {}
    for name, flags in ARMS.items():
        ckpt = tmp_path_factory.mktemp(name) / "ckpt"
        straight = run_pretrain(RUN + flags)
        run_pretrain(RUN + flags + ["--save", ckpt, "--save-interval", "3", "--exit-interval",
                                    "3"])
        resumed = run_pretrain(RUN + flags + ["--save", ckpt, "--load", ckpt])
        runs[name] = (straight, resumed, ckpt)
    return runs


def initial_model(flags, cpu_dist):
    """The model a run of ``flags`` starts from (its generators seeded as the run seeds them)."""
    args = parse_args(RUN + flags)
    derived = check_machine_and_tokenizer(args, "cpu")[2]
    set_seed(args.training.seed)
    return model_provider(args, derived.padded_vocab_size, on_cpu=True,
                          code=build_code(args.model, derived.padded_vocab_size)), args


def trained_model(ckpt):
    path, args, fixed_code, iteration = read_checkpoint(str(ckpt))
    assert iteration == 6
    return load_model(path, args, fixed_code)


@pytest.mark.parametrize("arm", ARMS)
def test_each_new_arm_trains_and_resumes_exactly(arm_runs, arm):
    straight, resumed, ckpt = arm_runs[arm]
    losses = step_losses(straight)
    assert sorted(losses) == list(range(1, 7))
    assert losses[6] < losses[1] - 0.2, f"{arm}: loss {losses[1]} -> {losses[6]}"
    assert f"resumed from {ckpt}/iter_0000003 at iteration 3" in resumed.stdout
    assert step_losses(resumed) == losses  # --save's metrics file: steps 1-3, then 4-6
    # The start-up line names what the arm trains at the input: a projection is said.
    start = {"frozen": "frozen arm |", "factorized": "factorized arm |",
             "binary_map": "binary arm with a trainable 16 x 64 projection of the code "
                           "(--code-projection) |"}[arm]
    assert f"[fixedcode] {start}" in straight.stdout


def test_the_frozen_table_and_the_code_are_bit_identical_after_training(arm_runs, cpu_dist):
    """What is fixed stays so through training and a resume; what is trained moves."""
    start, _ = initial_model(ARMS["frozen"], cpu_dist)
    end = trained_model(arm_runs["frozen"][2])
    assert torch.equal(end.embedding.word_embeddings.weight,
                       start.embedding.word_embeddings.weight)
    assert not torch.equal(end.output_layer.weight, start.output_layer.weight)

    start, args = initial_model(ARMS["binary_map"], cpu_dist)
    end = trained_model(arm_runs["binary_map"][2])
    assert end.embedding.code == start.embedding.code == build_code(args.model, 512)
    ids = torch.arange(512).view(1, -1)
    assert not torch.equal(end.embedding.projection.weight, start.embedding.projection.weight)
    with torch.no_grad():
        end.embedding.projection.weight.copy_(start.embedding.projection.weight)
    assert torch.equal(end.embedding(ids, None), start.embedding(ids, None))

    start, _ = initial_model(ARMS["factorized"], cpu_dist)
    end = trained_model(arm_runs["factorized"][2])
    for name in ("table.weight", "projection"):
        moved = dict(end.embedding.word_embeddings.named_parameters())[name]
        assert not torch.equal(moved, dict(
            start.embedding.word_embeddings.named_parameters())[name]), name


@pytest.mark.parametrize("arm, other, message", [
    ("factorized", ["--input-interface", "factorized", "--input-table-rank", "16"],
     "--input-table-rank: checkpoint 8, now 16"),
    ("factorized", ["--input-interface", "learned"],
     "--input-interface: checkpoint 'factorized', now 'learned'"),
    ("binary_map", ["--input-interface", "binary"],
     "--code-projection: checkpoint True, now False"),
    ("frozen", ["--input-interface", "learned"],
     "--input-interface: checkpoint 'frozen', now 'learned'"),
])
def test_a_checkpoint_refuses_another_arm(arm_runs, cpu_dist, arm, other, message):
    args = parse_args(RUN + other + ["--load", str(arm_runs[arm][2])])
    with pytest.raises(CheckpointError, match=re.escape(message)):
        resolve_checkpoint(*check_machine_and_tokenizer(args, "cpu")[1:])


@pytest.mark.parametrize("arm,as_table", [(arm, False) for arm in ARMS] + [("binary_map", True)])
def test_every_new_arm_exports_and_validates(arm_runs, arm, as_table, tmp_path, cpu_dist):
    """A table arm is a stock Llama that says what its table is; the trained projection of a
    code is the custom code's map, or with as_table in the table (code times map; in bf16,
    rounded as the model in bf16 rounds its input)."""
    from megatron_ext.hf.convert import RECORD_KEY
    from megatron_ext.hf.export import export_checkpoint
    from megatron_ext.hf.parity import TOLERANCE
    out = tmp_path / "hf"
    result = export_checkpoint(str(arm_runs[arm][2]), str(out), check=True,
                               progress=lambda line: None, as_table=as_table,
                               dtype="bf16" if as_table else "fp32")
    assert result["max_abs_diff"] <= TOLERANCE and result["iteration"] == 6
    config = json.loads(Path(out, "config.json").read_text())
    if arm == "binary_map" and not as_table:
        assert config["model_type"] == "fixedcode_llama" and config["code_projection"]
        return
    # a table arm is a stock Llama (the factorised one as its product)
    assert config["model_type"] == "llama" and "auto_map" not in config
    assert config[RECORD_KEY]["arm"] == ARMS[arm][1]
    assert config[RECORD_KEY]["input_table"] == {
        "frozen": "fixed, never trained (Megatron's initial draw of the learned table)",
        "factorized": "trained at rank 8: the product T·P of the trained factors",
        "binary_map": "the fixed code (never trained) times the trained --code-projection "
                      "map (h x n)"}[arm]


def test_the_input_table_lr_mult_0_freezes_it_and_1_is_the_recipe(tmp_path, cpu_dist):
    """0: the learned table is bit-identical after training (the rest trains), and the
    checkpoint records the multiplier; 1 with the recipe's weight decay given explicitly (the
    table in a group of its own) trains exactly as the recipe."""
    learned = ["--input-interface", "learned", "--train-iters", "3"]
    recipe = run_pretrain(TINY_RUN + learned)
    explicit = run_pretrain(TINY_RUN + learned + ["--input-table-lr-mult", "1",
                                                  "--input-table-weight-decay", "0.1"])
    assert step_losses(explicit) == step_losses(recipe) and len(step_losses(recipe)) == 3
    frozen = run_pretrain(TINY_RUN + learned + ["--input-table-lr-mult", "0",
                                                "--save", tmp_path])
    assert step_losses(frozen) != step_losses(recipe)
    args = parse_args(TINY_RUN + learned)
    set_seed(args.training.seed)
    start = model_provider(args, 512, on_cpu=True)
    path, saved, fixed_code, _ = read_checkpoint(str(tmp_path))
    end = load_model(path, saved, fixed_code)
    assert torch.equal(end.embedding.word_embeddings.weight,
                       start.embedding.word_embeddings.weight)
    assert not torch.equal(end.output_layer.weight, start.output_layer.weight)
    training = saved.config.training
    assert (training.input_table_lr_mult, training.input_table_weight_decay) == (0.0, None)


def test_a_tiny_study_across_the_new_arms_reports_the_capacity_axis_and_probes(
        tiny_study, tmp_path, capsys):
    """tools/study.py end to end over the arms of issue 31 (trained in this process, 3 steps,
    2 seeds), on tiny_study's tokenizer, recipe and held-out text: each run evaluated and
    probed, and the gap to the learned table against trainable input parameters reported."""
    from conftest import study_trains_in_process
    from tools import study
    root = tiny_study["root"]
    (tmp_path / "study.toml").write_text(
        f'recipe = "{root / "recipe.args"}"\n'
        'arms = ["learned", "frozen", "map:binary@--code-projection", '
        '"r4:factorized@--input-table-rank=4"]\nseeds = [1, 2]\n'
        f'[eval]\ndata_path = "{root / "heldout"}"\ntokens = 640\n'
        '[probes]\ntokens = 640\nsample = 384\ntop_k = 8\nprobe_seeds = 2\n'
        f'unigram_counts = "{root / "heldout"}"\n')  # the runs train on mock data
    with study_trains_in_process():
        summary = study.main(["run", str(tmp_path / "runs"), "--study",
                              str(tmp_path / "study.toml")])
    points = {p["arm"]: p for p in summary["input_capacity"]}
    vocab, width = 512, 64  # the recipe's padded vocabulary and --hidden-size
    assert {arm: p["input_parameters"] for arm, p in points.items()} == {
        "frozen": 0, "map": 16 * width, "r4": vocab * 4 + 4 * width, "learned": vocab * width}
    for arm in ("frozen", "map", "r4"):
        assert points[arm]["gap"]["seeds"] == [1, 2], arm
    assert set(summary["probes"]) == {"learned", "frozen", "map", "r4"}
    text = (tmp_path / "runs" / "STUDY.md").read_text()
    assert "## Gap against trainable input parameters" in text
    assert "a random lookup of the id, never trained" in text  # the frozen arm's layer 0
