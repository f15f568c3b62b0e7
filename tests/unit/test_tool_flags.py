"""The tools' flags are the configs' fields (issue 58): a tool builds its configs from the
parsed flags with ``from_flags``; one name per meaning across the tools, a renamed flag's old
spelling accepted for one release with a notice on stderr."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from megatron_ext.config.checkpoint_config import SavedIteration
from megatron_ext.config.flag_fields import add_flags, flag
from megatron_ext.launch.plan import Cluster
from megatron_ext.launch.slurm import Job, Layout
from megatron_ext.probes.settings import ProbeRun, ProbeSettings
from tools import check_checkpoint, evaluate, probe

NOTICE = "[fixedcode] --ckpt-step is now --iteration; the old name goes in the next release\n"


def test_the_old_name_sets_the_new_flag_and_says_so(capsys):
    args = check_checkpoint.parse_args(["runs/binary", "--ckpt-step", "2000"])
    assert SavedIteration.from_flags(args).iteration == 2000
    assert capsys.readouterr().err == NOTICE


def test_the_new_name_says_nothing_and_the_default_is_the_latest(capsys):
    assert SavedIteration.from_flags(
        check_checkpoint.parse_args(["d", "--iteration", "7"])).iteration == 7
    assert SavedIteration.from_flags(check_checkpoint.parse_args(["d"])).iteration is None
    assert capsys.readouterr().err == ""


def test_the_old_name_takes_the_new_ones_type_and_the_help_names_it(capsys):
    with pytest.raises(SystemExit):
        check_checkpoint.parse_args(["d", "--ckpt-step", "-1"])
    assert "argument --ckpt-step: must be at least 0, got -1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        check_checkpoint.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--iteration ITERATION" in text and "(formerly --ckpt-step, accepted until the next " \
        "release)" in text
    assert "--ckpt-step CKPT_STEP" not in text and "[--ckpt-step" not in text


def test_a_renamed_switch_keeps_its_old_spelling(capsys):
    @dataclasses.dataclass(frozen=True)
    class Switch(SavedIteration):
        validate: bool = flag(False, "check it")
    parser = argparse.ArgumentParser()
    add_flags(parser, Switch, renamed={"validate": ("--check",)})
    assert parser.parse_args(["--check"]).validate is True
    assert "--check is now --validate" in capsys.readouterr().err
    assert parser.parse_args([]).validate is False


def test_the_layout_defaults_are_written_once():
    """A job's and a plan's nodes and GPUs per node are Layout's fields, one default each."""
    layout = {f.name: f.default for f in dataclasses.fields(Layout)}
    for config in (Job, Cluster):
        assert {f.name: f.default for f in dataclasses.fields(config)
                if f.name in layout} == layout


def test_probe_builds_its_settings_from_the_flags():
    args = probe.parse_args(["a=x", "--data-path", "held", "--sample", "5", "--ridge", "0.5",
                             "--no-cka", "--allow-train-text"])
    assert ProbeSettings.from_flags(args) == ProbeSettings(
        data_path="held", sample=5, ridge=0.5, allow_train_text=True)
    assert ProbeRun.from_flags(args) == ProbeRun(cka=False)
    assert ProbeSettings.from_flags(probe.parse_args(["x", "--data-path", "p"])) == \
        ProbeSettings(data_path="p")


def test_evaluate_reads_the_tasks_and_the_shared_settings(tmp_path):
    from megatron_ext.hf.eval_settings import EvaluateSettings
    from megatron_ext.study.spec import EvalSettings
    for name in ("config.json", "tokenizer_config.json"):
        (tmp_path / name).write_text("{}")
    args = evaluate.parse_args([str(tmp_path), "--data-dir", str(tmp_path), "--tasks",
                                "piqa, hellaswag", "--limit", "3", "--no-model-card"])
    run = EvaluateSettings.from_flags(args)
    shared = EvalSettings.from_flags(args, tasks=tuple(run.task_names))
    assert run.task_names == ["piqa", "hellaswag"] and not run.model_card
    assert (shared.data_dir, shared.limit, shared.batch_size) == (str(tmp_path), 3, 8)
    default = EvaluateSettings.from_flags(evaluate.parse_args([str(tmp_path), "--online"]))
    assert default.task_names == ["hellaswag", "piqa", "lambada_openai"]


def test_the_old_name_reaches_the_check(tmp_path, capsys):
    """``--ckpt-step 3`` checks iteration 3, as ``--iteration 3`` does."""
    for flag in ("--ckpt-step", "--iteration"):
        with pytest.raises(SystemExit) as refused:
            check_checkpoint.main([str(tmp_path), flag, "3"])
        assert refused.value.code != 0
        assert f"{tmp_path}/iter_0000003 does not exist" in \
            f"{refused.value.code} {capsys.readouterr().err}"
