"""The plan of a run from its flags (megatron_ext/model/memory.py, megatron_ext/launch/plan.py,
tools/plan.py, the plan in tools/submit.py and tools/study.py): Megatron-LM's bytes per
parameter, the counts against Megatron-Core modules built on the meta device, the 1.7B shape
against the H200 run's measured peak, FLOPs, time and GPU-hours, the refusals. The CPU
measurements of real steps are tests/integration/test_memory_plan.py."""

from __future__ import annotations

import re

import pytest

from conftest import REPO
from megatron_ext.launch import plan
from megatron_ext.launch.plan import Cluster, check_fits, plan_run
from megatron_ext.metrics.flops import flops_per_token, peak_flops
from megatron_ext.model import memory
from megatron_ext.config.arms import parse_arm
from megatron_ext.model.param_count import count_arms
from megatron_ext.runtime.errors import FlagError, LaunchError
from pretrain_fixedcode import parse_args
from tools import plan as plan_tool
from tools import study as study_tool
from tools import submit

RECIPE = REPO / "examples" / "smollm2_1p7b" / "recipe.args"
PAPER = ["--recipe", str(RECIPE), "--vocab-size", "49152"]
GIB = 2 ** 30
# The H200 run (bench/RESULTS.md, "GPU: the first runs", 2026-11-30): the 1.7B shape, local
# layers, Megatron-Core's unfused attention, bf16, one GPU, 8 micro-batches of 1 x 2048
# tokens, torch's Adam without the distributed optimizer; its log's peak allocated memory.
H200_RUN = ["--preset", "smollm2-1.7b", "--vocab-size", "49151", "--mock-data", "--bf16",
            "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "20",
            "--transformer-impl", "local", "--attention-backend", "unfused"]
H200_PEAK_GIB = {"binary": 52.37, "learned": 54.06}
TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--ffn-hidden-size", "128", "--seq-length", "32", "--tokenizer-type", "NullTokenizer",
        "--vocab-size", "511", "--mock-data", "--micro-batch-size", "2",
        "--global-batch-size", "16", "--train-iters", "10"]


def cluster(nodes=1, gpus=8, memory_gib=None, mfu=None) -> Cluster:
    return Cluster(nodes, gpus, "H100", memory_gib, mfu)


@pytest.mark.parametrize("arm", ["learned", "binary", "gf2", "frozen",
                                 "factorized@--input-table-rank=64", "binary@--code-projection"])
def test_whole_model_parameters_are_the_built_modules(cpu_dist, arm):
    """At TP 1, PP 1 the planned parameters are Megatron-Core's modules (counted on the meta
    device by param_count), and bf16 training holds 18 bytes per trained one (Megatron-LM's
    figure) and 2 per frozen one."""
    args = parse_args(["--preset", "smollm2-1.7b", "--bf16", "--mock-data",
                       "--train-iters", "1"])
    counted = count_arms(args, [arm])[arm]
    one = plan.run_config(["--preset", "smollm2-1.7b", "--bf16", "--mock-data",
                           "--train-iters", "1", *parse_arm(arm).training_flags()])
    planned = memory.stage_parameters(one, 49152, 0)
    assert planned.trained == counted["total"]
    state = memory.state_bytes(one, 49152, 1, 0)
    assert sum(state.values()) == 18 * planned.trained + 2 * planned.frozen


def test_the_reference_state_is_the_h200_runs():
    """bench/RESULTS.md's training state at 1.7B, bf16, no distributed optimizer: 28.69 GiB
    for a fixed code, 30.38 GiB for the learned table; with the distributed optimizer
    Megatron-LM's 6 + 12/DP bytes per parameter, fp32 training 8 + 8/DP."""
    for arm, gib in (("binary", 28.69), ("learned", 30.38)):
        args = parse_args(H200_RUN + ["--input-interface", arm])
        fp = memory.footprint(args, 49152, 1, 8)
        assert round(fp.weight_and_optimizer / GIB, 2) == gib
    args = parse_args(H200_RUN + ["--use-distributed-optimizer"])
    n = memory.stage_parameters(args, 49152, 0).trained
    assert sum(memory.state_bytes(args, 49152, 8, 0).values()) == n * (6 + 12 / 8)
    args = parse_args([a for a in H200_RUN if a != "--bf16"] + ["--use-distributed-optimizer"])
    assert sum(memory.state_bytes(args, 49152, 4, 0).values()) == n * (8 + 8 / 4)


@pytest.mark.parametrize("arm", ["binary", "learned"])
def test_the_1p7b_peak_is_the_h200_runs(arm):
    """The plan of the H200 run (its state and the activations of its unfused attention)
    against the peak it measured: within 5%."""
    args = parse_args(H200_RUN + ["--input-interface", arm])
    planned = memory.footprint(args, 49152, 1, 8, device="cuda").total / GIB
    assert planned == pytest.approx(H200_PEAK_GIB[arm], rel=0.05)


def test_megatron_lms_line():
    """The start-up line's text and numbers as Megatron-LM prints them (MB = 2^20 bytes)."""
    fp = memory.Footprint(0, 3 * 2 ** 20, 2 ** 20, 2 ** 19, 1.25 * 2 ** 20)
    assert fp.megatron_line() == ("Theoretical memory footprints: weight and optimizer="
                                  "4.50 MB, activation=1.25 MB, total=5.75 MB")
    assert fp.largest() == "weights"


def test_layouts_split_the_state_and_the_activations():
    """TP halves the split tensors, PP the layers (the first stage holds the table, the last
    the head), SP the replicated activations; micro-batches in flight on the first stage."""
    base = parse_args(TINY + ["--bf16"])
    tp2 = parse_args(TINY + ["--bf16", "--tensor-model-parallel-size", "2"])
    sp = parse_args(TINY + ["--bf16", "--tensor-model-parallel-size", "2",
                            "--sequence-parallel"])
    pp2 = parse_args(TINY + ["--bf16", "--pipeline-model-parallel-size", "2"])
    whole = memory.stage_parameters(base, 512, 0).trained
    halves = memory.stage_parameters(tp2, 512, 0).trained
    assert whole / 2 < halves < whole / 2 + 2 * 64 * 2 + 64  # the norms are replicated
    assert memory.activation_bytes(sp, 512, 1, 0) < memory.activation_bytes(tp2, 512, 1, 0)
    first, last = (memory.stage_parameters(pp2, 512, i).trained for i in (0, 1))
    assert first + last == whole
    # the first stage holds two micro-batches (of 8) in flight, the last one
    one = memory.activation_bytes(pp2, 512, 1, 0)
    assert memory.activation_bytes(pp2, 512, 8, 0) == memory.activation_bytes(pp2, 512, 2, 0)
    assert memory.activation_bytes(pp2, 512, 2, 0) > one
    assert memory.activation_bytes(pp2, 512, 8, 1) == memory.activation_bytes(pp2, 512, 1, 1)


def test_recompute_and_precision_shrink_the_activations():
    kept = {name: memory.activation_bytes(parse_args(TINY + flags), 512, 1, 0)
            for name, flags in {
                "none": [], "bf16": ["--bf16"],
                "selective": ["--recompute-granularity", "selective", "--attention-backend",
                              "unfused"],
                "unfused": ["--attention-backend", "unfused"],
                "full": ["--recompute-granularity", "full", "--recompute-method", "uniform",
                         "--recompute-num-layers", "1"]}.items()}
    assert kept["bf16"] < kept["none"] and kept["full"] < kept["none"]
    assert kept["selective"] < kept["unfused"]


def test_flops_time_and_gpu_hours():
    """FLOPs per iteration are the log's count over the global batch; days and GPU-hours
    follow from the MFU and the dense bf16 peak."""
    run = plan_run("binary", TINY + ["--input-interface", "binary"], cluster(1, 8, mfu=0.5))
    args = parse_args(TINY)
    assert run.flops_per_iteration == flops_per_token(args.model, 512) * 16 * 32
    seconds = run.flops_per_iteration * 10 / (0.5 * peak_flops("H100", False) * 8)
    assert run.seconds(0.5) == pytest.approx(seconds)
    assert run.gpu_hours(0.5) == pytest.approx(seconds * 8 / 3600)
    assert plan.measured_mfu("binary") == 0.157 and plan.measured_mfu("gf2") == 0.157
    assert plan.measured_mfu("frozen") == plan.measured_mfu("learned") == 0.154


@pytest.mark.parametrize("flags, named", [
    (["--gpu-memory", "0"], "--gpu-memory"), (["--gpu-memory", "100000"], "--gpu-memory"),
    (["--assume-mfu", "0"], "--assume-mfu"), (["--assume-mfu", "1.5"], "--assume-mfu"),
    (["--gpu", "V100"], "--gpu"), (["--nodes", "0"], "--nodes"),
    (["--nodes", "3"], "--nodes 3"),  # 24 GPUs: 1024 is not a multiple of 8 x 24
    (["--gpus-per-node", "3", "--nodes", "1"], "--gpus-per-node 3"),
])
def test_bad_input_names_the_flag(flags, named, capsys):
    """Refused naming the flag: by the plan (``error: ...``) or by the parser (on stderr)."""
    with pytest.raises(SystemExit) as refused:
        plan_tool.main(PAPER + flags)
    assert refused.value.code != 0
    assert named in f"{refused.value.code} {capsys.readouterr().err}"


@pytest.mark.parametrize("extra, named", [
    (["--tensor-model-parallel-size", "3"], "--tensor-model-parallel-size 3"),
    (["--pipeline-model-parallel-size", "4"], "--num-layers 2"),
    (["--tensor-model-parallel-size", "8", "--num-attention-heads", "4"],
     "--num-attention-heads"),
])
def test_a_layout_that_does_not_divide_the_model_is_refused(tmp_path, extra, named):
    recipe = tmp_path / "r.args"
    shape = TINY[:TINY.index("--micro-batch-size")]
    recipe.write_text(" ".join(shape + ["--global-batch-size", "64", "--train-iters", "1"]
                               + extra))
    with pytest.raises(SystemExit, match=re.escape(named)):
        plan_tool.main(["--recipe", str(recipe), "--nodes", "1", "--gpus-per-node", "8"])


def test_the_paper_recipe_is_planned(capsys):
    plans = plan_tool.main(PAPER + ["--nodes", "8", "--gpu-memory", "80",
                                    "--assume-mfu", "0.4"])
    out = capsys.readouterr().out
    assert [p.name for p in plans] == ["learned", "binary", "gf2"]
    assert plans[0].iterations == 48828125 // 1024 and plans[0].gpus == 64
    assert f"[learned] {plans[0].footprint.megatron_line()}" in out
    assert f"[binary (and 1 more alike)] {plans[1].footprint.megatron_line()}" in out
    assert "| learned | 1 | TP 1, PP 1, DP 64, 2 micro-batches | 1,812,039,680 |" in out
    assert "total: 3 run(s)" in out and "at 40%" in out


def test_a_run_that_does_not_fit_is_refused_with_its_largest_term_and_a_lever():
    fat = plan_run("big", ["--preset", "smollm2-1.7b", "--bf16", "--mock-data",
                           "--micro-batch-size", "1", "--train-iters", "1"],
                   cluster(1, 1), vocab_size=49152)
    assert fat.footprint.largest() == "optimizer state"
    with pytest.raises(LaunchError, match="largest term is optimizer state.*"
                                          "--use-distributed-optimizer"):
        check_fits([fat], cluster(1, 1, memory_gib=20))
    wide = plan_run("wide", ["--preset", "smollm2-1.7b", "--bf16", "--mock-data",
                             "--micro-batch-size", "16", "--train-iters", "1",
                             "--use-distributed-optimizer"], cluster(1, 8), vocab_size=49152)
    assert wide.footprint.largest() == "activations"
    with pytest.raises(LaunchError, match="activations.*--recompute-granularity"):
        check_fits([wide], cluster(1, 8, memory_gib=80))
    check_fits([fat], cluster(1, 1, memory_gib=None))  # no memory stated: nothing checked


def test_submit_prints_the_plan_and_refuses_before_writing(tmp_path, capsys):
    recipe = tmp_path / "r.args"
    recipe.write_text(" ".join(TINY))
    submit.main(["--recipe", str(recipe), "--run-dir", str(tmp_path / "runs"),
                 "--gpus-per-node", "8", "--gpu-memory", "80", "--dry-run"])
    out = capsys.readouterr().out
    assert "Theoretical memory footprints" in out and "# ===== learned" in out
    with pytest.raises(SystemExit, match="does not fit"):
        submit.main(["--recipe", str(recipe), "--run-dir", str(tmp_path / "runs"),
                     "--gpus-per-node", "8", "--gpu-memory", "0.001"])
    assert not (tmp_path / "runs").exists()


def test_a_studys_dry_run_prints_its_plan_with_branches(tmp_path, capsys):
    """Every cell and arm, its seeds as runs alike; a budget's branch counts the iterations
    it trains (from its branch point), and the total sums them all. (A dry run asks no
    queue: tests/integration/test_study.py.)"""
    recipe = tmp_path / "r.args"
    recipe.write_text(" ".join(TINY[:-2] + ["--train-iters", "40", "--lr-decay-style", "WSD",
                                            "--lr-wsd-decay-iters", "8",
                                            "--save-interval", "5"]))
    (tmp_path / "s.toml").write_text(
        f'recipe = "{recipe}"\narms = ["learned", "binary"]\nseeds = [1, 2]\n'
        '[budgets]\ntokens = [10240]\n')
    study_tool.main(["run", str(tmp_path / "study"), "--study", str(tmp_path / "s.toml"),
                     "--launcher", "slurm", "--gpus-per-node", "8", "--dry-run"])
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in out.splitlines()
            if line.startswith("| ") and "micro-batches" in line}
    assert set(rows) == {"learned", "binary", "budget_10240/learned", "budget_10240/binary"}
    assert rows["binary"][1] == "2" and rows["binary"][10] == "40"
    assert rows["budget_10240/binary"][10] == "5"  # 20 steps of 512 tokens, from step 15
    assert "total: 8 run(s)" in out
