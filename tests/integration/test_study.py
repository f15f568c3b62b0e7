"""tools/study.py: a study of arms x seeds, end to end on CPU (train, evaluate every
checkpoint once, report: conftest's tiny_study), its statistics against hand computations, a Slurm
dry run, and bad study definitions refused naming the problem."""

from __future__ import annotations

import getpass
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import STUDY_PIQA, study_trains_in_process
from helpers.recipes import TINY_RECIPE
from megatron_ext.launch.slurm import REPO
from megatron_ext.study import power, spec
from megatron_ext.study.stats import crossed_interval, holm, paired_difference, t_interval
from megatron_ext.runtime.errors import DataError, FlagError, StudyError
from tools import study

# One worker runs the file with conftest's tiny_study (pytest-xdist --dist loadgroup).
pytestmark = pytest.mark.xdist_group("study")

PIQA = STUDY_PIQA


# ------------------------------------------------------------------------------ statistics

def test_t_interval_matches_a_hand_computation():
    # mean 2, sample sd 1, t(0.975, 2 dof) = 4.302652729911275
    got = t_interval([1.0, 2.0, 3.0])
    assert got["mean"] == 2.0 and got["n"] == 3
    assert got["half_width"] == pytest.approx(4.302652729911275 / math.sqrt(3))
    assert (got["low"], got["high"]) == pytest.approx((2 - got["half_width"],
                                                       2 + got["half_width"]))
    one = t_interval([5.0])
    assert one["mean"] == 5.0 and one["low"] is one["high"] is one["half_width"] is None


def test_paired_difference_uses_the_shared_seeds():
    got = paired_difference({1: 3.0, 2: 5.0, 3: 4.0, 9: 0.0}, {1: 1.0, 2: 2.0, 3: 3.0})
    # differences 2, 3, 1: mean 2, sd 1
    assert got["seeds"] == [1, 2, 3] and got["mean"] == 2.0
    assert got["half_width"] == pytest.approx(4.302652729911275 / math.sqrt(3))
    assert paired_difference({1: 1.0}, {2: 1.0}) is None


def test_the_crossed_interval_separates_an_arm_better_on_every_item():
    arm, control = [[1.0] * 30 + [1.0] * 10] * 2, [[0.0] * 30 + [1.0] * 10] * 2
    got = crossed_interval(arm, control)
    assert got["mean"] == pytest.approx(0.75) and not got["conditional"]
    # no seed spread: the items' part alone, t(39 dof) x sqrt(var(items' differences) / 40)
    half = 2.0226909200367604 * math.sqrt(np.var([1.0] * 30 + [0.0] * 10, ddof=1) / 40)
    assert got["half_width"] == pytest.approx(half)
    assert got["p"] < 1e-6
    same = crossed_interval(control, control)
    assert (same["low"], same["mean"], same["high"], same["p"]) == (0.0, 0.0, 0.0, None)
    alone = crossed_interval(arm[:1], control[:1])
    assert alone["conditional"] and alone["half_width"] == pytest.approx(
        2.0226909200367604 * math.sqrt(np.var([1.0] * 30 + [0.0] * 10, ddof=1) / 40))
    with pytest.raises(ValueError, match="one shape"):
        crossed_interval([[1.0, 0.0]], [[1.0]])


def test_the_crossed_interval_counts_the_items_noise_once():
    """Seeds differ by a constant per seed and items add noise within each run: the
    interval is the by-seed t interval (the items' part is 0 when every item moves alike),
    not wider as a bootstrap of seeds then items would make it."""
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 1, (3, 200))
    arm = noise + np.array([[0.1], [0.3], [0.2]])
    got = crossed_interval(arm, np.zeros_like(arm))
    by_seed = t_interval(arm.mean(1))
    assert got["half_width"] == pytest.approx(by_seed["half_width"], rel=0.05)
    assert got["half_width"] >= by_seed["half_width"]


def test_holm_adjusts_a_family_step_down():
    # sorted 0.01, 0.03, 0.04 of 3: 0.03, max(0.03, 0.06), max(0.06, 0.04)
    assert holm([0.01, 0.04, None, 0.03]) == pytest.approx([0.03, 0.06, None, 0.06])
    assert holm([0.5, 0.9]) == [1.0, 1.0]
    assert holm([]) == []


# ---------------------------------------------------------------------- study definitions


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "recipe.args"
    path.write_text(TINY_RECIPE + "--tokenizer-type NullTokenizer --vocab-size 511\n")
    return path


@pytest.mark.parametrize("fields, message", [
    ({"arms": ["learned", "ternary"]}, "arm 'ternary': unknown input interface 'ternary'"),
    ({"arms": ["binary", "binary"]}, "duplicate arm name(s) ['binary']"),
    ({"arms": ["learned", "binary@--seed=3"]},
     "arm 'binary@--seed=3' sets --seed, which the study sets for every run"),
    ({"arms": ["learned", "binary@code-scale=2"]}, "'code-scale=2' is not a --flag[=value]"),
    ({"arms": ["learned", "binary@--global-batch-size=8"]},
     "arm 'binary@--global-batch-size=8' sets --global-batch-size: the arms are compared at "
     "equal iterations"),
    ({"arms": ["binary", "gf2"]}, "the control arm 'learned' is not among the arms"),
    ({"arms": ["learned", "binary@--no-such-flag=1"]},
     "arm 'binary@--no-such-flag=1' with recipe"),
    ({"overrides": ["--ckpt-step", "2"]},
     "--ckpt-step: each run of a study resumes its own latest checkpoint (a budget branch "
     "loads the step it branches from); remove it"),
    ({"seeds": [1, 1]}, "duplicate seeds in [1, 1]"),
    ({"overrides": ["--rampup-batch-size", "2", "2", "8"]},
     "--rampup-batch-size: a study counts a checkpoint's compute as its iterations x "
     "--global-batch-size, which a batch ramp overstates"),
    ({"overrides": ["--data-args-path", "blend.txt"]},
     "--data-args-path: the held-out sets are checked against the training prefixes of "
     "--data-path and --train-data-path; give the blend there"),
    ({"colour": "red"}, "unknown study key(s) ['colour']"),
    ({"eval": {"tasks": ["piqa"]}}, "downstream tasks need eval data_dir"),
])
def test_bad_studies_are_refused_naming_the_problem(recipe, fields, message):
    base = {"recipe": str(recipe), "arms": ["learned", "binary"], "seeds": [1, 2]}
    with pytest.raises(StudyError, match=re.escape(message)):
        spec.build_study({**base, **fields}, Path.cwd())


@pytest.mark.parametrize("line", ["--seed 7", "--input-interface gf2"])
def test_a_recipe_that_sets_a_per_run_flag_is_refused(recipe, line):
    recipe.write_text(recipe.read_text() + line + "\n")
    with pytest.raises(FlagError, match=re.escape(f"sets {line.split()[0]}")):
        spec.build_study({"recipe": str(recipe), "arms": ["learned"], "seeds": [1]}, Path.cwd())


@pytest.mark.parametrize("data", ["--train-data-path data/x_text_document",
                                  "--data-path 0.7 data/a_text_document 0.3 data/x_text_document"])
def test_a_held_out_set_that_the_recipe_trains_on_is_refused(recipe, data):
    """Named with the recipe's prefix; ``allow_train_text`` overrides it, and the report
    says so (the tiny study below)."""
    recipe.write_text(recipe.read_text().replace("--mock-data", data))
    fields = {"recipe": str(recipe), "arms": ["learned"], "seeds": [1],
              "eval": {"data_path": "data/x_text_document"}}
    with pytest.raises(DataError, match=r"eval data_path \S+/data/x_text_document is a "
                       r"training prefix \(data/x_text_document\) of the recipe \S+recipe.args"):
        spec.build_study(fields, REPO)
    fields["eval"]["allow_train_text"] = True
    assert spec.build_study(fields, REPO).eval.allow_train_text
    with pytest.raises(DataError, match="probes data_path"):
        spec.build_study({**fields, "eval": {}, "probes": {"data_path": "data/x_text_document"}},
                         REPO)


def test_a_rebuilt_copy_of_the_training_prefix_is_refused_by_content(recipe, tmp_path):
    """The held-out set is checked against the training data by its documents' tokens: a
    copy of the training prefix under another path passes the check of paths but not this
    one (named with both files and the count); other documents pass; allow_train_text
    overrides it."""
    from helpers.indexed_data import make_dataset
    from megatron_ext.study.evaluation import check_held_out_content
    train = make_dataset(tmp_path / "train_text_document", [40, 50, 60])
    copy = make_dataset(tmp_path / "copy_text_document", [40, 50, 60])
    other = make_dataset(tmp_path / "other_text_document", [40, 50, 60], first_id=7)
    recipe.write_text(recipe.read_text().replace("--mock-data", f"--data-path {train}"))

    def study(held_out, **eval_fields):
        return spec.build_study({"recipe": str(recipe), "arms": ["learned"], "seeds": [1],
                                 "eval": {"data_path": held_out, "tokens": 64,
                                          **eval_fields}}, REPO)
    with pytest.raises(DataError, match=r"\[eval\] data_path \S+copy_text_document: 2 of its "
                       r"2 held-out documents are training documents of \S+train_text_document "
                       r"\(the same tokens; compared with all of it\)"):
        check_held_out_content(study(copy))
    said = []
    check_held_out_content(study(other), said.append)
    assert said == [f"[held-out] [eval] 2 documents: none among the training documents of "
                    f"{train} (all of it)"]
    check_held_out_content(study(copy, allow_train_text=True), said.append)
    assert len(said) == 1


def test_probe_differences_pair_every_two_arms_by_seed():
    from megatron_ext.study.probing import PAIRED, differences
    def arm(values):  # {seed: value of every metric at layers 0 and 1}
        return {"by_seed": {s: [{m: v + layer for m in PAIRED} for layer in (0, 1)]
                            for s, v in values.items()}}
    summary = {"learned": arm({1: 0.0, 2: 0.0, 3: 0.0}), "binary": arm({1: 1.0, 2: 2.0, 3: 3.0}),
               "gf2": arm({1: 1.0, 2: 1.0, 9: 5.0})}
    pairs = differences(summary)
    assert [(p["a"], p["b"]) for p in pairs] == [("learned", "binary"), ("learned", "gf2"),
                                                 ("binary", "gf2")]
    gf2_binary = pairs[2]["layers"][1]["id_bits_selectivity"]
    assert gf2_binary["seeds"] == [1, 2] and gf2_binary["mean"] == pytest.approx(-0.5)
    assert pairs[0]["layers"][0]["readout_loss"]["mean"] == pytest.approx(2.0)


def test_an_eval_cache_made_before_allow_train_text_still_holds(tmp_path):
    """allow_train_text changes no result: adding it must not re-evaluate every checkpoint
    of an existing study."""
    import dataclasses
    from megatron_ext.study.evaluation import cache_path, read_cached
    settings = spec.EvalSettings(data_path="x", tasks=("piqa",), data_dir="d")
    old = {k: list(v) if isinstance(v, tuple) else v
           for k, v in dataclasses.asdict(settings).items() if k != "allow_train_text"}
    path = cache_path(tmp_path, 3)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"iteration": 3, "settings": old, "valid_loss": 1.0}))
    assert read_cached(tmp_path, 3, settings)["valid_loss"] == 1.0
    assert read_cached(tmp_path, 3, dataclasses.replace(settings, tokens=5)) is None


def test_a_study_directory_holds_one_study(recipe, tmp_path):
    one = spec.build_study({"recipe": str(recipe), "arms": ["learned"], "seeds": [1]}, tmp_path)
    two = spec.build_study({"recipe": str(recipe), "arms": ["learned"], "seeds": [1, 2]},
                           tmp_path)
    assert spec.settle(tmp_path / "s", one) == one == spec.settle(tmp_path / "s", None)
    with pytest.raises(StudyError, match="holds another study"):
        spec.settle(tmp_path / "s", two)


@pytest.mark.integration
def test_slurm_dry_run_prints_one_job_per_run_and_writes_nothing(recipe, tmp_path, capsys):
    study_dir = tmp_path / "study"
    study.main(["run", str(study_dir), "--recipe", str(recipe), "--arms",
                "learned,small:binary@--code-scale=0.02", "--seeds", "1,2", "--launcher",
                "slurm", "--gpus-per-node", "0", "--ntasks-per-node", "2", "--dry-run"])
    out = capsys.readouterr().out
    headers = re.findall(r"^# ===== (\S+) seed (\d): (\S+) =====$", out, flags=re.M)
    assert [(a, int(s)) for a, s, _ in headers] == [("learned", 1), ("learned", 2),
                                                    ("small", 1), ("small", 2)]
    assert "#SBATCH --job-name=study-small-seed2" in out
    assert "    --input-interface binary\n    --code-scale 0.02\n    --seed 2\n" in out
    assert f"    --save {study_dir}/small/seed2/checkpoints" in out
    assert not study_dir.exists()


FAKE_SLURM = {
    # each records its arguments, one call a line, in FAKE_DIR/NAME.calls
    "squeue": """#!/bin/bash
echo "$*" >> "$FAKE_DIR/squeue.calls"
if [[ -n $FAKE_SQUEUE_FAILS ]]; then
  echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2
  exit 1
fi
printf '%b' "$FAKE_SQUEUE_JOBS"
""",
    "sbatch": """#!/bin/bash
echo "$*" >> "$FAKE_DIR/sbatch.calls"
echo "$((100 + $(wc -l < "$FAKE_DIR/sbatch.calls")))"
"""}


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """Stand-ins for squeue and sbatch on PATH; ``calls(name)``: the arguments of each call
    of ``name``, in order."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in FAKE_SLURM.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DIR", str(bin_dir))
    monkeypatch.delenv("FAKE_SQUEUE_FAILS", raising=False)
    monkeypatch.setenv("FAKE_SQUEUE_JOBS", "")

    def calls(name):
        path = bin_dir / f"{name}.calls"
        return path.read_text().splitlines() if path.exists() else []
    return calls


def submit_study(recipe, study_dir, *extra):
    study.main(["run", str(study_dir), "--recipe", str(recipe), "--arms",
                "learned,binary", "--seeds", "1,2", "--launcher", "slurm",
                "--gpus-per-node", "0", "--ntasks-per-node", "2", *extra])


@pytest.mark.integration
def test_a_dry_run_asks_no_queue(recipe, tmp_path, fake_slurm, capsys):
    """Issue 58: a dry run on a login node whose Slurm controller is down printed its
    scripts after one ~9 s squeue per run; it asks none now, and says so."""
    submit_study(recipe, tmp_path / "study", "--dry-run")
    assert fake_slurm("squeue") == [] and fake_slurm("sbatch") == []
    out = capsys.readouterr().out
    assert "# dry run: the queue is not asked (squeue)" in out
    assert len(re.findall(r"^# ===== ", out, flags=re.M)) == 4


@pytest.mark.integration
def test_a_queue_that_cannot_be_asked_stops_the_submission_before_any_sbatch(
        recipe, tmp_path, fake_slurm, monkeypatch):
    """'Could not ask' is not 'not queued': a controller briefly down would have had the
    study resubmit its queued runs."""
    monkeypatch.setenv("FAKE_SQUEUE_FAILS", "1")
    with pytest.raises(SystemExit) as stop:
        submit_study(recipe, tmp_path / "study")
    user = getpass.getuser()
    assert str(stop.value) == (
        f"error: squeue --noheader --user {user} --format '%i %j' failed (exit 1): "
        f"slurm_load_jobs error: Unable to contact slurm controller (connect failure); "
        f"nothing was submitted (which runs are queued is not known); retry when the Slurm "
        f"controller answers")
    assert fake_slurm("squeue") == [f"--noheader --user {user} --format %i %j"]
    assert fake_slurm("sbatch") == []


@pytest.mark.integration
def test_the_queue_is_asked_once_per_study_and_queued_runs_are_not_resubmitted(
        recipe, tmp_path, fake_slurm, monkeypatch, capsys):
    study_dir = tmp_path / "study"
    monkeypatch.setenv("FAKE_SQUEUE_JOBS", "77 study-binary-seed1\n78 other-learned-seed1\n")
    submit_study(recipe, study_dir)
    assert len(fake_slurm("squeue")) == 1
    submitted = [call.split()[-1] for call in fake_slurm("sbatch")]
    assert submitted == [str(study_dir / run / "job.sbatch") for run in
                         ("learned/seed1", "learned/seed2", "binary/seed2")]
    out = capsys.readouterr().out
    assert "binary seed 1: queued or running as job 77" in out
    assert "learned seed 1: job 101" in out and "binary seed 2: job 103" in out
    # rerun: the jobs submitted are queued now, and nothing is submitted again
    monkeypatch.setenv("FAKE_SQUEUE_JOBS", "".join(
        f"{i} study-{run}\n" for i, run in ((101, "learned-seed1"), (102, "learned-seed2"),
                                            (77, "binary-seed1"), (103, "binary-seed2"))))
    submit_study(recipe, study_dir)
    assert len(fake_slurm("squeue")) == 2 and len(fake_slurm("sbatch")) == 3


# --------------------------------------------------------------------------- end to end

@pytest.mark.integration
def test_a_study_trains_evaluates_and_reports(tiny_study):
    study_dir, summary = tiny_study["study_dir"], tiny_study["summary"]
    assert summary["final_iteration"] == 3 and summary["final_tokens"] == 3 * 4 * 32
    for name in ("STUDY.md", "study.json", "valid_loss.png", "downstream.png",
                 "differences.png"):
        assert (study_dir / name).exists(), name
    assert (study_dir / "valid_loss.png").read_bytes().startswith(b"\x89PNG")
    # The report's numbers are recomputed from the runs' evaluation records.
    evals = {(arm, seed): json.loads((study_dir / arm / f"seed{seed}" / "eval" /
                                      "iter_0000003.json").read_text())
             for arm in ("learned", "binary") for seed in (1, 2)}
    for arm in ("learned", "binary"):
        losses = [evals[(arm, s)]["valid_loss"] for s in (1, 2)]
        final = summary["arms"][arm]["final"]["valid_loss"]
        assert final["mean"] == pytest.approx(np.mean(losses))
        assert final["half_width"] == pytest.approx(
            12.706204736174707 * np.std(losses, ddof=1) / math.sqrt(2))
        for s in (1, 2):
            assert evals[(arm, s)]["valid_tokens"] == 640
            assert len(evals[(arm, s)]["tasks"]["piqa"]["items"]) == len(PIQA)
    diff = summary["differences"]["binary"]
    assert diff["valid_loss"]["by_seed"]["mean"] == pytest.approx(np.mean(
        [evals[("binary", s)]["valid_loss"] - evals[("learned", s)]["valid_loss"]
         for s in (1, 2)]))
    assert diff["piqa"]["by_item"]["n"] == len(PIQA)
    text = (study_dir / "STUDY.md").read_text()
    assert "## Final metrics: iteration 3 (384 tokens)" in text
    # learned vs binary: valid loss by seed, piqa by seed and by seed and item: one family
    assert "Family of comparisons: the 3 difference intervals above" in text
    rows = re.findall(r"^\| binary − control \| (.+?) \| (by seed(?: and item)?) \| "
                      r"([\d.e+-]+|—) \| ([\d.e+-]+|—) \| (.+) \| (.+) \|$", text.split("What each difference rules out")[0],
                      flags=re.M)
    assert len(rows) == 3
    # the tiny PIQA's 3 items score alike in both seeds: no spread, so no p-value (issue
    # 57: it printed p = 0, which Holm's adjustment counted), and the family is of 1
    assert [r[2] for r in rows[1:]] == ["—", "—"] and "2 difference" not in text
    assert "3 difference intervals above (pairs of arms × metrics × by seed / by seed and " \
           "item), 1 with a p-value" in text
    assert float(rows[0][3]) == pytest.approx(holm([float(rows[0][2])])[0], rel=1e-2)
    # beside it, what the design detects: the loss's from its 2 seeds' spread, at 95%
    assert rows[0][:2] == ("validation loss", "by seed")
    assert rows[0][4] == power.cell(diff["valid_loss"]["by_seed"], family=1)
    assert re.fullmatch(r"±\d+\.\d{4}", rows[0][4])
    assert f"| {power.header(1)} | gap of interest |" in text
    # and what it rules out: the 90% interval and the TOST bound
    ruled = summary["rules_out"][0]["equivalence"]
    assert f"| [{ruled['low']:+.4f}, {ruled['high']:+.4f}] | ±{ruled['bound']:.4f} |" in text
    assert summary["pairwise"] == []
    assert "| binary | `--input-interface binary` |" in text
    assert re.search(r"\| binary \| 2 \| 0 \| \d\.\d{4} ± \d\.\d{4} \|", text)


def test_the_reports_paths_are_shown_relative_to_the_working_directory(tiny_study,
                                                                      monkeypatch):
    """A pasted STUDY.md carries no machine's absolute paths: the recipe, held-out text and
    task folder under the working directory are shown relative to it; others stay whole."""
    from megatron_ext.study.report import header
    study = spec.settle(tiny_study["study_dir"], None, save=False)
    generated = {"time": "t", "machine": "m", "fixedcode": "f", "megatron_core": "c"}
    monkeypatch.chdir(tiny_study["root"])
    text = "\n".join(header(study, "tiny", ["0" * 64], generated))
    assert "- Recipe: `recipe.args`: `" in text
    assert "tokens of `heldout` (" in text and "- Tasks: piqa from `tasks`" in text
    assert str(tiny_study["root"]) not in text
    monkeypatch.chdir(tiny_study["root"] / "tasks")   # the recipe is no longer under it
    text = "\n".join(header(study, "tiny", ["0" * 64], generated))
    assert f"- Recipe: `{tiny_study['root'] / 'recipe.args'}`: `" in text


def test_each_arm_keeps_one_colour_in_every_figure(tiny_study, monkeypatch):
    """The curves and the differences of a study, and the probes' figures, take their
    colours from one definition (reporting.colours); token axes read 384, 1.5M, 100B."""
    from matplotlib.colors import to_hex
    from megatron_ext.metrics.reporting import colours, readable_tokens
    from megatron_ext.study import report
    study_dir, summary = tiny_study["study_dir"], tiny_study["summary"]
    definition = spec.settle(study_dir, None)
    drawn = {}

    def keep(fig, path):
        ax = fig.axes[0]
        if ax.get_legend_handles_labels()[1]:  # the curves: one labelled line per arm
            drawn[path.name] = {label: to_hex(line.get_color()) for line, label in
                                zip(*ax.get_legend_handles_labels())}
        else:  # the differences: one error bar per arm, in the order of the y ticks
            arms = [t.get_text() for t in ax.get_yticklabels()]
            drawn[path.name] = {arm: to_hex(c.lines[0].get_color())
                                for arm, c in zip(arms, ax.containers)}
    monkeypatch.setattr(report, "save_figure", keep)
    report._plot_curves(definition, summary, ["valid_loss"], study_dir / "valid_loss.png")
    report._plot_differences(definition, summary, ["valid_loss"], study_dir / "d.png")
    expected = {name: to_hex(c) for name, c in colours(["learned", "binary"]).items()}
    assert drawn["valid_loss.png"] == expected
    assert drawn["d.png"] == {"binary": expected["binary"]}
    assert to_hex(colours(["binary", "gf2", "small"])["binary"]) == expected["binary"]
    assert len(set(colours(["learned", "binary", "gf2", "permuted", "random", "a", "b"])
                   .values())) == 7
    assert [readable_tokens(x) for x in (384, 12_300, 1.5e6, 1e11)] == \
        ["384", "12.3K", "1.5M", "100B"]


@pytest.mark.integration
def test_the_held_out_loss_is_the_models_own_loss(tiny_study):
    """Independent of the study's evaluation code: logits from the loaded checkpoint,
    cross-entropy by torch, on the same held-out windows."""
    from megatron_ext.hf.megatron_checkpoint import load_model, read_checkpoint
    from megatron_ext.runtime.initialize import initialize_distributed
    from megatron_ext.datasets.held_out import held_out_tokens
    study_dir = tiny_study["study_dir"]
    definition = spec.settle(study_dir, None)
    initialize_distributed("cpu", 1, 1)
    run = study_dir / "binary" / "seed2"
    path, args, code, _ = read_checkpoint(str(run / "checkpoints"), 3)
    model = load_model(path, args, code)
    windows = torch.from_numpy(held_out_tokens(definition.eval.data_path, 640, 32))
    with torch.no_grad():
        logits = model(windows[:, :-1], torch.arange(32).expand(len(windows), 32), None)
    assert logits.shape[:2] == (len(windows), 32)  # [batch, sequence, vocabulary]
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                 windows[:, 1:].reshape(-1))
    cached = json.loads((run / "eval" / "iter_0000003.json").read_text())
    assert cached["valid_loss"] == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.integration
def test_each_evaluated_point_carries_the_flops_the_training_log_counts(tiny_study):
    """The log's model FLOPs per token (TFLOP/s x world size / tokens per second, from the
    metrics file) times the tokens trained is the point's FLOPs; the learned arm has an
    input table the fixed arm lacks, and the same non-embedding count."""
    from megatron_ext.metrics.sinks import read_metrics
    study_dir, summary = tiny_study["study_dir"], tiny_study["summary"]
    params = {}
    for arm in ("learned", "binary"):
        run = study_dir / arm / "seed1"
        train = [r for r in read_metrics(str(run / "checkpoints")) if r["kind"] == "train"][-1]
        logged = train["tflops-per-gpu"] * 1e12 / train["tokens-per-second"]  # world size 1
        record = json.loads((run / "eval" / "iter_0000003.json").read_text())
        assert record["flops"] == pytest.approx(logged * 3 * 4 * 32, rel=1e-9)
        assert summary["arms"][arm]["final"]["flops"] == pytest.approx(record["flops"])
        params[arm] = record["parameters"]
    assert params["learned"]["non_embedding"] == params["binary"]["non_embedding"]
    from megatron_ext.hf.megatron_checkpoint import read_checkpoint
    trained = read_checkpoint(str(study_dir / "learned" / "seed1" / "checkpoints"), 3)[1]
    assert params["learned"]["total"] - params["binary"]["total"] == \
        trained.padded_vocab_size * trained.config.model.hidden_size


@pytest.mark.integration
def test_a_rerun_trains_nothing_and_evaluates_nothing_twice(tiny_study, capsys):
    """Also: a record cached before records carried the training compute gets it back
    without being evaluated again."""
    study_dir, summary = tiny_study["study_dir"], tiny_study["summary"]
    cached = study_dir / "binary" / "seed1" / "eval" / "iter_0000003.json"
    record = json.loads(cached.read_text())
    cached.write_text(json.dumps({k: v for k, v in record.items()
                                  if k not in ("flops", "parameters")}))
    again = study.main(["run", str(study_dir)])
    out = capsys.readouterr().out
    assert "[study] 4 of 4 runs finished; training 0" in out
    assert "[study] evaluated 0 checkpoints (4 cached)" in out
    assert json.loads(cached.read_text()) == record
    assert again["differences"] == summary["differences"]


@pytest.mark.integration
def test_an_interrupted_local_study_saves_and_a_rerun_resumes(recipe, tmp_path, capsys):
    """SIGTERM (or Ctrl-C) to the study lets the current run save first; rerunning the same
    command resumes that run from its checkpoint and goes on with the others."""
    import signal
    import subprocess
    import sys
    recipe.write_text(recipe.read_text().replace("--train-iters 3", "--train-iters 12"))
    study_dir = tmp_path / "study"
    cmd = [sys.executable, str(Path(study.__file__)), "run", str(study_dir), "--recipe",
           str(recipe), "--arms", "learned,binary", "--seeds", "1", "--no-eval"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "iteration        2/" in line:
            proc.send_signal(signal.SIGTERM)
            break
    out = "".join(lines) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 1, out
    assert "[study] interrupted: learned seed 1 saved its checkpoint" in out
    stopped = int(re.search(r"received SIGTERM: exiting at iteration (\d+)", out).group(1))
    ckpt = study_dir / "learned" / "seed1" / "checkpoints"
    assert int((ckpt / "latest_checkpointed_iteration.txt").read_text()) == stopped < 12
    capsys.readouterr()
    with study_trains_in_process():  # the rerun: this process is not under test
        study.main(cmd[2:])
    again = capsys.readouterr().out
    assert f"resumed from {ckpt}/iter_{stopped:07d} at iteration {stopped}" in again
    assert "[study] run 2/2: binary seed 1" in again
