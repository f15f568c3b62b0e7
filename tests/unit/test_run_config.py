"""The typed run configs (megatron_ext/config/run_config.py) without a training: every flag of
the entry point belongs to one config, building and validating them writes nothing into the
flags, each refusal that needs only the flags comes when they are parsed, naming them, and a
study refuses a run's flags before it defines itself, naming the run and the flag
(megatron_ext/study/launch.py:check_runs)."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import re
from pathlib import Path

import pytest

from conftest import TINY_RUN
from helpers.recipes import TINY_RECIPE
from megatron_ext.config.arguments import (add_training_args, build_parser, check_run_flags,
                                           parse_flags)
from megatron_ext.config.flag_fields import RESUME_KINDS, FlagConfig, flag
from megatron_ext.config.run_config import (CheckpointConfig, DataConfig, LoggingConfig,
                                            ModelConfig, ParallelConfig, RunConfig,
                                            TrainingConfig)
from megatron_ext.preprocess.preprocess import preprocess
from megatron_ext.preprocess.preprocess_config import PreprocessConfig
from megatron_ext.runtime.errors import FlagError
from pretrain_fixedcode import parse_args
from tools import check_data, preprocess_data, study, submit

CONCERNS = (ModelConfig, ParallelConfig, TrainingConfig, DataConfig, CheckpointConfig,
            LoggingConfig)


def test_every_flag_belongs_to_one_config():
    parser = build_parser("")
    add_training_args(parser)
    dests = {a.dest for a in parser._actions if a.dest != "help"
             and a.default is not argparse.SUPPRESS}
    fields = [f.name for cls in CONCERNS for f in dataclasses.fields(cls)]
    assert len(fields) == len(set(fields)), "a flag in two configs"
    assert set(fields) == dests, (sorted(dests - set(fields)), sorted(set(fields) - dests))


def undeclared_resume(configs) -> list[str]:
    """The fields of ``configs`` that state no resume kind, as ``Config.field``."""
    return [f"{cls.__name__}.{f.name}" for cls in configs for f in dataclasses.fields(cls)
            if f.metadata.get("resume") not in RESUME_KINDS]


def test_every_training_flag_states_what_a_resume_does_with_it():
    """Each field of each training config declares what a resume does with it (there is no
    default kind: a flag added without one fails here, named); a kind, a
    --use-checkpoint-args mode or a study role outside its set, or a Megatron-LM default
    without its meaning, is a TypeError where the field is declared."""
    assert undeclared_resume(CONCERNS) == []

    @dataclasses.dataclass(frozen=True)
    class Added(FlagConfig):
        stated: int = flag(1, "a flag that states its kind", resume="free")
        silent: int = flag(1, "a flag added without one")
    assert undeclared_resume([Added]) == ["Added.silent"]
    for typo, named in ((dict(resume="modle"), "resume='modle'"),
                        (dict(checkpoint_args="allways"), "checkpoint_args='allways'"),
                        (dict(study="per-run"), "study='per-run'"),
                        (dict(megatron_lm=0.1), "megatron_lm=0.1")):
        with pytest.raises(TypeError, match=re.escape(f"flag({named})")):
            flag(1, "a flag", **typo)


def test_a_tool_that_reads_training_flags_takes_their_declarations():
    """tools/check_data.py and tools/preprocess_data.py read --split, --eval-iters,
    --code-bits, ... for checks of their own: the flags' type and default are the fields'
    (its help is the tool's), so a default changed in a config changes there too."""
    fields = {f.name: f for cls in CONCERNS for f in dataclasses.fields(cls)}
    checked = vars(check_data.parse_args(["prefix"]))
    for name in ("code_bits", "seq_length", "split", "eval_iters", "train_samples",
                 "train_iters", "global_batch_size"):
        assert checked[name] == fields[name].default, name
    with pytest.raises(SystemExit):  # --train-iters's type is the field's: at least 1
        check_data.parse_args(["prefix", "--train-iters", "0", "--global-batch-size", "2"])
    preprocessed = vars(preprocess_data.parse_args(
        ["--input", "x", "--output-prefix", "y", "--tokenizer-type", "NullTokenizer"]))
    assert preprocessed["code_bits"] == fields["code_bits"].default


def test_preprocessing_takes_its_config_built_once_without_writing_into_the_flags():
    """tools/preprocess_data.py's parser is PreprocessConfig's fields and training's tokenizer
    and --code-bits; the config is built from the parsed flags without writing into them, its
    validate() refuses what the flags alone get wrong (before preprocess reads a file), and
    tools/check_data.py leaves --train-iters' samples out of its parsed flags."""
    args = preprocess_data.parse_args(["--input", "missing.jsonl", "--output-prefix", "o",
                                       "--tokenizer-type", "NullTokenizer", "--vocab-size", "9",
                                       "--json-keys", "a", "b"])
    parsed = copy.deepcopy(vars(args))
    config = PreprocessConfig.from_flags(args, tokenizer=DataConfig.from_flags(args))
    assert vars(args) == parsed
    assert set(vars(args)) == {f.name for f in PreprocessConfig.flag_fields()} | {
        "tokenizer_type", "tokenizer_model", "vocab_file", "merge_file", "vocab_size",
        "code_bits"}
    assert (config.input, config.json_keys, config.code_bits) == (
        ("missing.jsonl",), ("a", "b"), ModelConfig.code_bits)
    assert (config.tokenizer.tokenizer_type, config.tokenizer.vocab_size) == ("NullTokenizer", 9)
    config.validate()
    for change, message in (({"verify_fraction": 1.5}, "--verify-fraction 1.5: a share"),
                            ({"json_keys": ("a", "a")}, "--json-keys a a: a key is given")):
        with pytest.raises(FlagError, match=message):
            config.replace(**change).validate()
    with pytest.raises(FlagError, match="a key is given twice"):  # before the input is sought
        preprocess(config.replace(json_keys=("a", "a")))
    assert check_data.parse_args(["p", "--seq-length", "8", "--train-iters", "3",
                                  "--global-batch-size", "2"]).train_samples is None


def test_configs_are_frozen_and_built_without_writing_into_the_flags():
    args = parse_flags(TINY_RUN + ["--train-iters", "2", "--data-path", "a", "b",
                                   "--profile-ranks", "0", "1"], "", add_training_args)
    parsed = copy.deepcopy(vars(args))
    config = RunConfig.from_flags(args)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model.hidden_size = 128
    assert config.data.data_path == ("a", "b") and config.logging.profile_ranks == (0, 1)
    assert (config.model.hidden_size, config.training.train_iters) == (64, 2)
    with pytest.raises(FlagError, match="give either --data-path or --mock-data"):
        config.validate()
    assert vars(args) == parsed


@pytest.mark.parametrize("flags, expected", [
    (["--hidden-size", "512", "--num-attention-heads", "8", "--swiglu"], (1344, 32)),
    (["--hidden-size", "512", "--num-attention-heads", "8", "--no-swiglu",
      "--max-position-embeddings", "128"], (2048, 128)),
])
def test_the_defaults_that_depend_on_other_flags_are_filled_while_parsing(flags, expected):
    """Megatron-LM's --ffn-hidden-size and --max-position-embeddings defaults, as --preset is
    applied: when the flags are parsed, not by a validation."""
    shape = [f for f in TINY_RUN if f not in ("--ffn-hidden-size", "128")]
    model = parse_args(shape + flags + ["--train-iters", "2"]).model
    assert (model.ffn_hidden_size, model.max_position_embeddings) == expected


@pytest.mark.parametrize("flags, message", [
    # the model and input arm
    (["--hidden-size", "66"], "--hidden-size 66 is not divisible by --num-attention-heads 4"),
    (["--bf16", "--fp16"], "--bf16 and --fp16 are exclusive"),
    (["--input-interface", "binary", "--code-bits", "70"], "--code-bits must be in [1, 62]"),
    (["--cross-entropy-loss-fusion"], "--cross-entropy-loss-fusion with "
                                      "--cross-entropy-fusion-impl native needs --bf16"),
    # parallelism, and the layout rules the planner applies too
    (["--overlap-param-gather"], "--overlap-param-gather needs --use-distributed-optimizer and "
                                 "--overlap-grad-reduce, as in Megatron-LM"),
    # what the layers given by --transformer-impl cannot run (else checked at start-up)
    (["--transformer-impl", "local", "--fp8-format", "hybrid"],
     "--fp8-format needs --transformer-impl transformer_engine"),
    (["--transformer-impl", "transformer_engine", "--reset-attention-mask"],
     "--reset-attention-mask needs --transformer-impl local"),
    (["--transformer-impl", "local", "--attention-backend", "fused"],
     "--attention-backend fused selects Transformer Engine's fused (cuDNN) attention"),
    (["--tensor-model-parallel-size", "3"],
     "--tensor-model-parallel-size 3 does not divide --num-attention-heads 4"),
    (["--pipeline-model-parallel-size", "4"],
     "--pipeline-model-parallel-size 4 does not divide --num-layers 2"),
    (["--tensor-model-parallel-size", "2", "--num-query-groups", "1"],
     "--tensor-model-parallel-size 2 does not divide --num-query-groups 1"),
    # the schedule and optimizer
    (["--lr-warmup-iters", "2", "--lr-warmup-fraction", "0.1"],
     "give one of --lr-warmup-fraction, --lr-warmup-iters and --lr-warmup-samples"),
    (["--lr-warmup-samples", "4"], "--lr-warmup-samples count samples: use them with "
                                   "--train-samples, not --train-iters"),
    # the data and tokenizer
    (["--require-data-cache"], "--require-data-cache needs --data-cache-path"),
    (["--split", "1,1,1,1"], "--split 1,1,1,1: give one to three non-negative proportions"),
    (["--vocab-file", "vocab.json"], "--vocab-file and --merge-file are GPT2BPETokenizer's"),
    # checkpoints
    (["--ckpt-step", "4"], "--ckpt-step needs --load"),
    (["--use-checkpoint-args"], "--use-checkpoint-args needs --load"),
    (["--save", "x", "--keep-checkpoints-every", "5"],
     "--keep-checkpoints-every applies with --keep-last-checkpoints only"),
    (["--no-load-optim"], "--no-load-optim needs --load (the checkpoint it reads)"),
    (["--load", "x", "--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"],
     "--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler are exclusive"),
    # logging and profiling
    (["--profile", "--profile-step-start", "5", "--profile-step-end", "5"],
     "--profile-step-start 5 must be >= 0 and below --profile-step-end 5"),
    # across concerns
    (["--log-layer-norms", "--use-distributed-optimizer"],
     "--log-layer-norms reads whole gradients, which --use-distributed-optimizer scatters"),
    (["--torch-compile-layers", "--tensor-model-parallel-size", "2"],
     "--torch-compile-layers with --tensor-model-parallel-size > 1"),
    (["--input-interface", "binary", "--input-table-lr-mult", "0.5"],
     "--input-table-lr-mult: --input-interface binary has no trained input table"),
])
def test_a_refusal_of_the_flags_alone_comes_when_they_are_parsed(flags, message):
    """Before any process group, tokenizer or data: the entry point's parse_args, and the
    check a study or a submission makes of a run's flags, refuse the same way."""
    with pytest.raises(FlagError, match=re.escape(message)):
        parse_args(TINY_RUN + ["--train-iters", "2"] + flags)
    with pytest.raises(FlagError, match=re.escape(message)):
        check_run_flags(TINY_RUN + ["--train-iters", "2"] + flags)


@pytest.mark.parametrize("layout", [["--tensor-model-parallel-size", "3"],
                                    ["--pipeline-model-parallel-size", "4"]])
def test_a_run_and_its_plan_refuse_a_layout_alike(layout):
    """One rule of what the parallel sizes divide (``RunConfig.check_layout``): the run
    refuses it when its flags are parsed, the planner before it plans, in the same words;
    and the world's rule (``ParallelConfig.check_world``) names the planner's GPUs."""
    from megatron_ext.launch.plan import Cluster, plan_run
    flags = TINY_RUN + ["--train-iters", "2"] + layout
    with pytest.raises(FlagError) as run:
        parse_args(flags)
    with pytest.raises(FlagError) as plan:
        plan_run("arm", flags, Cluster(1, 12), vocab_size=511)
    assert str(run.value) == str(plan.value)
    with pytest.raises(FlagError, match=re.escape(
            "--nodes 1 x --gpus-per-node 3 = 3 GPUs is not a multiple of "
            "--tensor-model-parallel-size 2 x --pipeline-model-parallel-size 1")):
        plan_run("arm", TINY_RUN + ["--train-iters", "2", "--tensor-model-parallel-size", "2"],
                 Cluster(1, 3), vocab_size=511)


@pytest.mark.parametrize("data, message", [
    ([], "give --data-path (indexed dataset prefixes), --train-data-path, or --mock-data"),
    (["--data-path", "a", "--valid-data-path", "b"],
     "give either --data-path (with --split) or --train-data-path/--valid-data-path/"
     "--test-data-path"),
    (["--data-path", "a", "--data-args-path", "blend.txt"],
     "give one of --data-path and --data-args-path"),
    (["--per-split-data-args-path", "s.json", "--mock-data"],
     "give either --per-split-data-args-path s.json or --mock-data, not both"),
    (["--per-split-data-args-path", "s.json", "--test-data-path", "t"],
     "give one of --train/valid/test-data-path and --per-split-data-args-path"),
])
def test_the_data_are_given_one_way(data, message):
    without_data = [f for f in TINY_RUN if f != "--mock-data"]
    with pytest.raises(FlagError, match=re.escape(message)):
        parse_args(without_data + ["--train-iters", "2", *data])


def test_the_start_up_line_names_a_code_projection():
    def arm(*flags):
        return parse_args(TINY_RUN + ["--train-iters", "2", *flags])
    assert arm("--input-interface", "gf2").model.arm_description() == "gf2 arm"
    assert arm("--input-interface", "gf2", "--code-projection", "--code-bits", "12").model \
        .arm_description() == ("gf2 arm with a trainable 12 x 64 projection of the code "
                               "(--code-projection)")


def test_the_checks_that_need_the_machine_or_the_tokenizer_are_named_for_it():
    config = parse_args(TINY_RUN + ["--train-iters", "2", "--profile", "--input-interface",
                                    "binary"])
    config.logging.check_device("cuda")
    with pytest.raises(FlagError, match="needs a GPU; add --use-pytorch-profiler on CPU"):
        config.logging.check_device("cpu")
    config.model.check_vocab(65536, 65000)
    with pytest.raises(FlagError, match="vocabulary of 65664 tokens .* does not fit a 16-bit "
                                        "code"):
        config.model.check_vocab(65664, 65536)


# ------------------------------------------------------------------ a study's runs, checked


def run_study(tmp_path: Path, recipe_lines: str, *extra: str) -> Path:
    """``tools/study.py run`` of the tiny recipe with ``recipe_lines`` added; the study's
    folder."""
    recipe = tmp_path / "recipe.args"
    recipe.write_text(TINY_RECIPE + "--tokenizer-type NullTokenizer --vocab-size 511\n"
                      + recipe_lines)
    study_dir = tmp_path / "study"
    study.main(["run", str(study_dir), "--recipe", str(recipe), "--seeds", "1,2", *extra])
    return study_dir


@pytest.mark.parametrize("launcher", [["--arms", "learned,binary"],
                                      ["--arms", "learned,binary", "--launcher", "slurm",
                                       "--gpus-per-node", "0", "--dry-run"]],
                         ids=["local", "slurm-dry-run"])
@pytest.mark.parametrize("recipe_lines, run, message", [
    ("--save-interval 1 --keep-checkpoints-every 2\n", "learned seed 1",
     "--keep-checkpoints-every applies with --keep-last-checkpoints only"),
    ("--overlap-grad-reduce --overlap-param-gather\n", "learned seed 1",
     "--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce"),
    ("--lr-decay-samples 64\n", "learned seed 1",
     "--lr-decay-samples count samples: use them with --train-samples, not --train-iters"),
])
def test_a_study_refuses_a_runs_flags_before_anything_is_saved_or_started(
        tmp_path, capsys, launcher, recipe_lines, run, message):
    """Each run's flags as it will start (the recipe, the arm's, the seed, its --save and
    --load) get the checks the run makes when it starts: a refusal names the run and the
    flag, and nothing is written, trained or submitted."""
    with pytest.raises(SystemExit) as refused:
        run_study(tmp_path, recipe_lines, *launcher)
    assert re.match(rf"error: run {run} \(\S+/study/learned/seed1\): {re.escape(message)}",
                    refused.value.code), refused.value.code
    assert not (tmp_path / "study").exists()
    assert "# =====" not in capsys.readouterr().out


def test_an_arms_flags_are_checked_in_each_of_its_runs(tmp_path):
    with pytest.raises(SystemExit, match=re.escape(
            "error: run og seed 1 ") + r"\S+" + re.escape(
            ": --overlap-param-gather needs --use-distributed-optimizer")):
        run_study(tmp_path, "", "--arms", "learned,og:binary@--overlap-param-gather")


def test_a_budget_branch_is_checked_with_the_flags_it_adds(tmp_path):
    """A recipe that keeps the checkpoint's schedule (--use-checkpoint-opt_param-scheduler)
    trains its runs, but each token budget's cooldown branch overrides the schedule: the
    branches' flags conflict, and the first branch is named."""
    recipe = tmp_path / "recipe.args"
    recipe.write_text(TINY_RECIPE.replace("--train-iters 3", "--train-iters 12")
                      + "--tokenizer-type NullTokenizer --vocab-size 511 --lr-decay-style WSD "
                        "--lr-wsd-decay-iters 4 --save-interval 2 "
                        "--use-checkpoint-opt_param-scheduler\n")
    toml = tmp_path / "study.toml"
    toml.write_text(f'recipe = "{recipe}"\narms = ["learned"]\nseeds = [1]\n'
                    f'[budgets]\ntokens = [1024]\n')
    with pytest.raises(SystemExit, match=re.escape("error: run budget_1024 learned seed 1 (")
                       + r"\S+" + re.escape("/study/budget_1024/learned/seed1): "
                                            "--override-opt_param-scheduler and "
                                            "--use-checkpoint-opt_param-scheduler are "
                                            "exclusive")):
        study.main(["run", str(tmp_path / "study"), "--study", str(toml), "--launcher",
                    "slurm", "--gpus-per-node", "0", "--dry-run"])


def test_a_recipe_that_picks_the_checkpoint_a_run_loads_is_refused_at_definition(tmp_path):
    """The study sets --load for every run (its own saves; a branch, the run it branches
    from): a --ckpt-step of the recipe would send every launch back to that step."""
    with pytest.raises(SystemExit, match=re.escape(
            "error: arm 'learned' with recipe ") + r"\S+" + re.escape(
            ": --ckpt-step: each run of a study resumes its own latest checkpoint")):
        run_study(tmp_path, "--ckpt-step 2\n", "--arms", "learned")
    assert not (tmp_path / "study").exists()


def test_submit_refuses_an_arms_flags_before_anything_is_queued(tmp_path, capsys):
    """tools/submit.py checks each arm's flags as its job will start with them (the recipe,
    the arm's, its --save and --load), naming the arm and the flag; nothing is written or
    printed as a script."""
    recipe = tmp_path / "recipe.args"
    recipe.write_text(TINY_RECIPE + "--tokenizer-type NullTokenizer --vocab-size 511\n")
    with pytest.raises(SystemExit) as refused:
        submit.main(["--recipe", str(recipe), "--run-dir", str(tmp_path / "runs"),
                     "--arms", "learned,og:binary@--overlap-param-gather",
                     "--gpus-per-node", "0", "--ntasks-per-node", "1", "--dry-run"])
    assert refused.value.code == ("error: og: --overlap-param-gather needs "
                                  "--use-distributed-optimizer and --overlap-grad-reduce, as in Megatron-LM")
    assert "# =====" not in capsys.readouterr().out and not (tmp_path / "runs").exists()
    recipe.write_text(recipe.read_text() + "--keep-checkpoints-every 2\n")
    with pytest.raises(SystemExit, match="^error: learned: --keep-checkpoints-every applies "
                                         "with --keep-last-checkpoints only"):
        submit.main(["--recipe", str(recipe), "--run-dir", str(tmp_path / "runs"),
                     "--gpus-per-node", "0", "--ntasks-per-node", "1"])
    assert not (tmp_path / "runs").exists()
