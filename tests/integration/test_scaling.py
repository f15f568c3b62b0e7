"""Studies across scale: factors (parsing, refusals, folders, jobs), differences paired by
seed within each level, the report's FLOPs figures, and the power-law fit (recovers known
parameters from synthetic data, refuses too few levels). The runs here are fabricated
records (metrics file, checkpoint markers, cached evaluations): no training."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from megatron_ext.launch.slurm import REPO
from megatron_ext.study import evaluation, fit, spec
from megatron_ext.study.scaling import analysis, figures, section, target
from megatron_ext.study.report import write_report
from megatron_ext.runtime.errors import StudyError
from tools import study as study_tool

from helpers.recipes import TINY_RECIPE

SIZES = {"d64": "--hidden-size 64 --ffn-hidden-size 128",
         "d96": "--hidden-size 96 --ffn-hidden-size 192",
         "d128": "--hidden-size 128 --ffn-hidden-size 256"}


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "recipe.args"
    path.write_text(TINY_RECIPE + "--tokenizer-type NullTokenizer --vocab-size 511\n")
    return path


def build(recipe, factors, **fields):
    return spec.build_study({"recipe": str(recipe), "arms": ["learned", "binary"],
                             "seeds": [1, 2], "factors": factors, **fields}, Path.cwd())


# ------------------------------------------------------------------------------- factors

def test_factor_levels_cross_into_cells_with_their_flags_after_the_recipe(recipe):
    study = build(recipe, {"size": {"d64": SIZES["d64"], "d128": SIZES["d128"]},
                           "lr": {"hi": "--lr 1e-2", "lo": ["--lr", "1e-3"]}})
    cells = study.cells()
    assert [folder for folder, _ in cells] == ["d64/hi", "d64/lo", "d128/hi", "d128/lo"]
    folder, cell = cells[2]
    assert cell.recipe[-6:] == ("--hidden-size", "128", "--ffn-hidden-size", "256", "--lr",
                                "1e-2")
    assert cell.recipe[:-6] == study.recipe and cell.factors == ()
    runs = spec.all_runs(study, Path("S"))
    assert len(runs) == 4 * 2 * 2
    assert runs[-1][-1] == Path("S/d128/lo/binary/seed2")
    # the definition survives definition.json
    assert spec.Study.from_json(json.loads(json.dumps(study.to_json()))) == study


def test_a_study_without_factors_is_one_cell_in_its_own_folder(recipe):
    study = build(recipe, {})
    assert study.cells() == [("", study)]
    assert spec.all_runs(study, Path("S"))[0][-1] == Path("S/learned/seed1")


@pytest.mark.parametrize("factors, message", [
    ({"size": {"d64": "--seed 3"}}, "level 'd64' of factor 'size' sets --seed, which the study"),
    ({"size": {"d64": "--save=/tmp/x"}}, "level 'd64' of factor 'size' sets --save"),
    ({"size": {"d/64": "--hidden-size 64"}}, "the name 'd/64' must be letters"),
    ({"size": {"d64": "hidden-size 64"}}, "'hidden-size 64' is not --flag [value]"),
    ({"size": {}}, "factor 'size' needs levels"),
    ({"lr": {"lr1": {"6e-2": "--lr 1.6e-2"}}}, "level 'lr1' of factor 'lr': give its flags "
                                               "as a string or a list (in TOML a level name "
                                               "with a dot"),
    ({"size": {"a": "--lr 1"}, "lr": {"a": "--lr 2"}}, "level name(s) ['a'] appear more than"),
    ({"size": {"d64": "--no-such-flag 1"}},
     "arm 'learned' at level d64 with recipe"),
])
def test_bad_factors_are_refused_naming_the_level(recipe, factors, message):
    with pytest.raises(StudyError, match=re.escape(message)):
        build(recipe, factors)


LRS = {"lo": "--lr 1e-3", "mid": "--lr 3e-3", "hi": "--lr 9e-3"}


@pytest.mark.parametrize("tune, factors, held_out, message", [
    ("lr", {"size": SIZES}, True, "tune = 'lr' is not a factor of the study (['size'])"),
    ("lr", {"size": SIZES, "lr": {"mid": LRS["mid"]}}, True,
     "factor 'lr' needs two levels or more"),
    ("lr", {"size": SIZES, "lr": LRS}, False, "chooses by the held-out loss: give [eval] "
                                               "data_path"),
])
def test_a_bad_tuned_factor_is_refused(recipe, tmp_path, tune, factors, held_out, message):
    evaluation = {"data_path": str(tmp_path / "heldout"), "tokens": 64} if held_out else {}
    with pytest.raises(StudyError, match=re.escape(message)):
        build(recipe, factors, tune=tune, eval=evaluation)


def slurm_dry_run(recipe, tmp_path, capsys, sections: str) -> tuple[Path, str]:
    """``(study folder, output)`` of a Slurm dry run of learned and binary, seed 1, with the
    TOML ``sections``."""
    toml = tmp_path / "s.toml"
    toml.write_text(f'recipe = "{recipe}"\narms = ["learned", "binary"]\nseeds = [1]\n'
                    + sections)
    study_dir = tmp_path / "S"
    study_tool.main(["run", str(study_dir), "--study", str(toml), "--launcher", "slurm",
                     "--gpus-per-node", "0", "--ntasks-per-node", "1", "--dry-run"])
    return study_dir, capsys.readouterr().out


def test_slurm_dry_run_submits_every_level_arm_and_seed(recipe, tmp_path, capsys):
    study_dir, out = slurm_dry_run(recipe, tmp_path, capsys, f'[factors.size]\nd64 = '
                                   f'"{SIZES["d64"]}"\nd96 = "{SIZES["d96"]}"\n')
    headers = re.findall(r"^# ===== (.+): (\S+) =====$", out, flags=re.M)
    assert headers == [(f"{size} {arm} seed 1", f"{study_dir}/{size}/{arm}/seed1/job.sbatch")
                       for size in ("d64", "d96") for arm in ("learned", "binary")]
    assert "#SBATCH --job-name=S-d96-binary-seed1" in out
    assert "    --hidden-size 96\n    --ffn-hidden-size 192\n    --input-interface binary" in out
    assert not study_dir.exists()


# ---------------------------------------------------------- fabricated runs and the report

E, A, ALPHA = 2.0, 1.5, 0.35
GAP_BY_LEVEL = {"d64": 0.30, "d96": 0.20, "d128": 0.12}  # binary − learned, per level
FLOPS = {"d64": 1e12, "d96": 4e12, "d128": 1.6e13}


def fabricate(study: spec.Study, study_dir: Path, loss, piqa=None, final=lambda folder: 4,
              non_embedding=lambda size: 900) -> None:
    """Records as a trained and evaluated run leaves them: a metrics file, completed
    checkpoints at half the cell's ``final`` iteration and at it, and their cached
    evaluations with ``loss(level, arm, seed, iteration)``, FLOPs proportional to the
    iteration, the size's ``non_embedding`` parameters; with ``piqa`` (the same arguments),
    PIQA items of which that fraction is right."""
    for folder, cell, arm, seed, run in spec.all_runs(study, study_dir):
        ckpt = run / "checkpoints"
        ckpt.mkdir(parents=True)
        last = final(folder)
        (ckpt / "metrics.jsonl").write_text(json.dumps(
            {"kind": "train", "iteration": last, "tokens": last * 128, "lm loss": 5.0}) + "\n")
        for it in (last // 2, last):
            (ckpt / f"iter_{it:07d}").mkdir()
            size = folder.split("/")[0]
            record = {"iteration": it, "settings": evaluation._settings_json(study.eval),
                      "flops": FLOPS[size] * it / 4,
                      "parameters": {"total": non_embedding(size) + 100,
                                     "non_embedding": non_embedding(size)},
                      "valid_loss": loss(folder, arm.name, seed, it)}
            if piqa is not None:
                right = round(20 * piqa(folder, arm.name, seed, it))
                items = [1.0] * right + [0.0] * (20 - right)
                record["tasks"] = {"piqa": {"metric": "acc", "value": right / 20,
                                            "items": items}}
            (run / "eval").mkdir(exist_ok=True)
            (run / "eval" / f"iter_{it:07d}.json").write_text(json.dumps(record))
        (ckpt / "latest_checkpointed_iteration.txt").write_text(str(last))


def synthetic_loss(level, arm, seed, it):
    """A power law in compute for learned; binary worse by the level's gap; a seed offset
    shared by both arms of a level (what pairing by seed removes)."""
    base = E + A * (FLOPS[level] * it / 4 / 1e12) ** -ALPHA
    offset = {1: -0.05, 2: 0.0, 3: 0.05}[seed] * (1 + list(FLOPS).index(level))
    return base + offset + (GAP_BY_LEVEL[level] if arm == "binary" else 0.0) + 0.001 * seed


@pytest.fixture(scope="module")
def fabricated(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("fabricated")
    recipe = tmp_path / "recipe.args"
    recipe.write_text(TINY_RECIPE + "--tokenizer-type NullTokenizer --vocab-size 511\n")
    study = build(recipe, {"size": SIZES}, seeds=[1, 2, 3],
                  eval={"data_path": str(tmp_path / "heldout"), "tokens": 64})
    study_dir = tmp_path / "S"
    fabricate(study, study_dir, synthetic_loss)
    return study, study_dir, write_report(study, study_dir)


def test_differences_are_paired_by_seed_within_each_level(fabricated):
    study, study_dir, summary = fabricated
    for level, gap in GAP_BY_LEVEL.items():
        diff = summary["levels"][level]["differences"]["binary"]["valid_loss"]["by_seed"]
        assert diff["mean"] == pytest.approx(gap)
        # the seed offsets are shared within a level, so the paired spread is ~0
        assert diff["high"] - diff["low"] < 1e-9
        series = summary["scaling"]["gaps"]["binary"][level]
        assert [c for c, _ in series] == [FLOPS[level] / 2, FLOPS[level]]
        assert series[-1][1]["mean"] == pytest.approx(gap)
    text = (study_dir / "STUDY.md").read_text()
    for level in SIZES:
        assert f"## Level `{level}`" in text
        assert (study_dir / level / "STUDY.md").read_text().startswith(f"# Study `S/{level}`")
    assert "### Against the control (`learned`): arm − control" in text
    for name in ("loss_vs_flops.png", "gap_vs_flops.png"):
        assert (study_dir / name).read_bytes().startswith(b"\x89PNG")
    assert not (study_dir / "downstream_vs_flops.png").exists()   # no tasks, no figure


def test_runs_that_have_not_finished_are_not_reported_as_final(tmp_path):
    """A study read while its runs train (one level, seeds that stopped at iteration 2 of 3)
    heads its table as the runs so far, naming them; it said "Final metrics"."""
    recipe = tmp_path / "recipe.args"
    recipe.write_text(TINY_RECIPE + "--tokenizer-type NullTokenizer --vocab-size 511\n")
    study = build(recipe, {"size": {"d64": SIZES["d64"]}}, seeds=[1, 2],
                  eval={"data_path": str(tmp_path / "held"), "tokens": 64})
    fabricate(study, tmp_path / "S", lambda *a: 5.0 + 0.01 * a[2], final=lambda folder: 2)
    write_report(study, tmp_path / "S")
    text = (tmp_path / "S" / "STUDY.md").read_text()
    assert "Metrics of the runs so far: iteration 2" in text and "Final metrics" not in text
    assert "learned seed 1 (iteration 2 of 3)" in text


def test_the_holm_family_counts_the_comparisons_it_adjusts():
    """Holm adjusts over the p-values present; the table's family size says that many (it
    counted the intervals without a p-value too), and a NaN is refused, not sorted."""
    from megatron_ext.study.report import family_table
    from megatron_ext.study.stats import holm
    with_p = {"mean": 0.1, "n": 3, "low": 0.05, "high": 0.15, "half_width": 0.05, "p": 0.01}
    no_p = {"mean": 0.1, "low": None, "high": None, "p": None, "conditional": True}
    summary = {"differences": {"binary": {"valid_loss": {"by_seed": with_p, "by_item": no_p}}},
               "pairwise": []}
    text = "\n".join(family_table(summary))
    assert "Holm p (family of 1)" in text and "2 difference intervals above" in text
    assert "by item, conditional on the one seed" in text
    with pytest.raises(ValueError, match="NaN"):
        holm([0.01, float("nan"), 0.02])


PIQA_GAP = {"d64": -0.15, "d96": -0.10, "d128": 0.0}   # binary − learned accuracy, per level


def synthetic_piqa(level, arm, seed, it):
    """Accuracy that grows with compute, binary below learned by the level's gap (0 at the
    largest level: no signal there), a seed offset shared by both arms of a level."""
    return (0.5 + 0.05 * list(FLOPS).index(level) + 0.1 * it / 4 + 0.05 * (seed - 2)
            + (PIQA_GAP[level] if arm == "binary" else 0.0))


def test_downstream_metrics_and_their_gaps_are_reported_against_flops(recipe, tmp_path):
    """With a task, the scaling section pairs its metric by seed within each level at every
    evaluated checkpoint, as for the loss: the known per-level gaps, 0 where there is none."""
    study = build(recipe, {"size": SIZES}, seeds=[1, 2, 3],
                  eval={"data_path": str(tmp_path / "heldout"), "tokens": 64,
                        "tasks": ["piqa"], "data_dir": str(tmp_path)})
    fabricate(study, tmp_path / "S", synthetic_loss, synthetic_piqa)
    summary = write_report(study, tmp_path / "S")
    task_gaps = summary["scaling"]["task_gaps"]["piqa"]["binary"]
    for level, gap in PIQA_GAP.items():
        assert [c for c, _ in task_gaps[level]] == [FLOPS[level] / 2, FLOPS[level]]
        for _, d in task_gaps[level]:
            assert d["mean"] == pytest.approx(gap, abs=1e-9)
            assert d["high"] - d["low"] < 1e-9   # the seed offsets are paired away
    text = (tmp_path / "S" / "STUDY.md").read_text()
    assert "![downstream metrics against FLOPs](downstream_vs_flops.png)" in text
    assert (tmp_path / "S" / "downstream_vs_flops.png").read_bytes().startswith(b"\x89PNG")


def test_three_levels_are_fitted_but_not_extrapolated(fabricated):
    """3 levels, 3 parameters: the law passes through every point, so it is described
    (parameters, residuals) but neither extrapolated nor given intervals, and the table
    says why (the bootstrap intervals it printed before were the miscalibrated ones)."""
    study, study_dir, summary = fabricated
    fits = summary["scaling"]["fits"]
    learned = fits["arms"]["learned"]
    # an exact fit of learned's mean losses (seed offsets average 0)
    assert learned["alpha"]["value"] == pytest.approx(ALPHA, abs=0.01)
    assert learned["E"]["value"] == pytest.approx(E + 0.002, abs=0.01)
    assert learned["alpha"]["low"] is None and learned["at_target"] is None
    assert not fits["extrapolated"] and fits["levels"] == 3
    text = (study_dir / "STUDY.md").read_text()
    assert ("**No extrapolation to the paper's compute and no intervals: 3 compute levels: "
            "an extrapolation needs at least 5") in text
    assert "residuals of 0 say nothing about the law's shape" in text
    assert re.search(r"\| binary \| [\d.]+ \(no interval\) \|", text)
    assert "orders of magnitude beyond" not in text


# binary − learned at each arm's own best learning rate, per size: 0 at d128 (no signal).
TUNED_GAP = {"d64": 0.20, "d96": 0.10, "d128": 0.0}


def tuned_loss(folder, arm, seed, it):
    """learned is best at lr "mid" at every size; binary is best at "hi" at d64 (the grid's
    edge) and at "mid" above it, where it is worse than learned by TUNED_GAP. The other
    levels cost 0.1 (0.3 for binary at d64's "mid": one rate for all sizes would overstate
    its gap there). A seed offset shared by both arms of a cell."""
    size, lr = folder.split("/")
    best = "hi" if (arm, size) == ("binary", "d64") else "mid"
    penalty = 0.0 if lr == best else (0.3 if (arm, size, lr) == ("binary", "d64", "mid")
                                      else 0.1)
    base = E + A * (FLOPS[size] * it / 4 / 1e12) ** -ALPHA
    gap = TUNED_GAP[size] if arm == "binary" else 0.0
    return base + gap + penalty + 0.05 * (seed - 2)


def test_a_tuned_factor_compares_each_arm_at_its_own_best_level(recipe, tmp_path):
    """size x lr with tune = "lr": each arm's chosen rate per size is its known best, the gap
    against compute is the known gap at the best rates (0 where there is none, not the 0.2
    that one rate for all would read at d64), and the edge-of-grid choice is flagged."""
    study = build(recipe, {"size": SIZES, "lr": LRS}, tune="lr", seeds=[1, 2, 3, 4, 5],
                  eval={"data_path": str(tmp_path / "heldout"), "tokens": 64})
    assert study.cells()[0][0] == "d64/lo"
    fabricate(study, tmp_path / "S", tuned_loss)
    summary = write_report(study, tmp_path / "S")
    chosen = {size: {arm: c["level"] for arm, c in arms.items()}
              for size, arms in summary["tuned"].items()}
    assert chosen == {"d64": {"learned": "mid", "binary": "hi"},
                      "d96": {"learned": "mid", "binary": "mid"},
                      "d128": {"learned": "mid", "binary": "mid"}}
    assert summary["tuned"]["d64"]["binary"]["edge"]
    assert not summary["tuned"]["d96"]["binary"]["edge"]
    scaling_gaps = summary["scaling"]["gaps"]["binary"]
    assert list(scaling_gaps) == ["d64", "d96", "d128"]
    for size, gap in TUNED_GAP.items():
        for _, d in scaling_gaps[size]:
            assert d["mean"] == pytest.approx(gap, abs=1e-9)
            assert d["high"] - d["low"] < 1e-9
    # the per-cell report at one rate still reads the confounded gap
    assert summary["levels"]["d64/mid"]["differences"]["binary"]["valid_loss"]["by_seed"][
        "mean"] == pytest.approx(TUNED_GAP["d64"] + 0.3)
    assert summary["scaling"]["fits"] is not None
    text = (tmp_path / "S" / "STUDY.md").read_text()
    assert "## Tuned factor `lr`: each arm at its best level" in text
    assert "`binary` at `d64`: its best `lr` (`hi`) is at the edge of the grid" in text
    assert "`learned` at `d64`" not in text
    # seeds 1 and 2 choose, seeds 3 to 5 are reported; the seeds column counts all 5
    assert "Selection seeds: 1, 2; reported seeds: 3, 4, 5." in text
    assert summary["tuned"]["d64"]["binary"]["reported"] == [3, 4, 5]
    assert [s for _, d in scaling_gaps["d64"] for s in d["seeds"]] == [3, 4, 5, 3, 4, 5]
    assert "| binary − learned (by seed) |" in text
    # the fabricated gap is the same for every seed: no spread, so no gap and no seed count
    assert re.search(r"^\| d64 \| 1e\+12 \| .* \| 5 \(3 reported\) \| .* \| "
                     r"\+0\.2000 \[\+0\.2000, \+0\.2000\] \| the seeds measured no spread: no "
                     r"detectable gap, no seed count \|$", text, flags=re.M)


def test_a_tuned_study_of_two_seeds_is_refused_unless_its_intervals_may_go_unreported(
        recipe, tmp_path, capsys):
    """Two seeds leave one reported seed, four two (an interval of 1 degree of freedom):
    refused at definition, naming the flag and what the interval would detect; with the
    flag the report says each tuned gap has no interval and names the seeds that give one,
    and the command line takes it."""
    fields = {"recipe": str(recipe), "arms": ["learned", "binary"], "seeds": [1, 2],
              "factors": {"size": SIZES, "lr": LRS}, "tune": "lr",
              "eval": {"data_path": str(tmp_path / "heldout"), "tokens": 64}}
    with pytest.raises(StudyError, match=re.escape(
            "tune = 'lr' with 2 seed(s): the first half of the seeds choose each arm's level "
            "and the others are reported, so its tuned gaps would rest on 1 reported seed(s): "
            "no interval; give at least 5 seeds (3 reported: gaps from 5.1 times that "
            "spread), or --allow-unreported-intervals to run it anyway")):
        spec.build_study(fields, Path.cwd())
    with pytest.raises(StudyError, match=re.escape(
            "on 2 reported seed(s): an interval of 1 degree of freedom, which detects only "
            "gaps above 27.6 times the per-seed spread of a difference at 80% expected "
            "power; give at least 5 seeds")):
        spec.build_study({**fields, "seeds": [1, 2, 3, 4]}, Path.cwd())
    study = spec.build_study(fields, Path.cwd(), allow_unreported_intervals=True)
    fabricate(study, tmp_path / "S", tuned_loss)
    write_report(study, tmp_path / "S")
    text = (tmp_path / "S" / "STUDY.md").read_text()
    assert re.search(r"^\| d96 \| .* \| 2 \(1 reported\) \| .* \| \+0\.1000 \(1 seed: no "
                     r"interval\) \| no interval \(1 reported seed\): an interval needs 2 "
                     r"reported seeds, and one that detects a gap of a few spreads 3 \(5 seeds: "
                     r"the first half choose\) \|$", text, flags=re.M)
    toml = tmp_path / "s.toml"
    toml.write_text(f'recipe = "{recipe}"\narms = ["learned", "binary"]\nseeds = [1, 2]\n'
                    f'tune = "lr"\n[eval]\ndata_path = "{tmp_path / "heldout"}"\n'
                    f'[factors.size]\nd64 = "{SIZES["d64"]}"\n[factors.lr]\n'
                    + "".join(f'{k} = "{v}"\n' for k, v in LRS.items()))
    run = ["run", str(tmp_path / "T"), "--study", str(toml), "--launcher", "slurm",
           "--gpus-per-node", "0", "--ntasks-per-node", "1", "--dry-run"]
    with pytest.raises(SystemExit, match="--allow-unreported-intervals to run it"):
        study_tool.main(run)
    study_tool.main(run + ["--allow-unreported-intervals"])
    assert "# ===== d64/lo learned seed 2:" in capsys.readouterr().out


def test_a_tuned_study_round_trips_through_its_definition(recipe, tmp_path):
    study = build(recipe, {"size": SIZES, "lr": LRS}, tune="lr", seeds=[1, 2, 3, 4, 5],
                  eval={"data_path": str(tmp_path / "heldout"), "tokens": 64})
    spec.settle(tmp_path / "S", study)
    assert spec.settle(tmp_path / "S", None) == study


def test_two_levels_report_without_a_fit_and_say_why(recipe, tmp_path):
    study = build(recipe, {"size": {k: SIZES[k] for k in ("d64", "d128")}},
                  eval={"data_path": str(tmp_path / "heldout"), "tokens": 64})
    fabricate(study, tmp_path / "S", synthetic_loss)
    summary = write_report(study, tmp_path / "S")
    assert summary["scaling"]["fits"] is None
    assert "No fit: arm learned: a power law needs at least 3 levels/budgets of different " \
           "compute, got 2" in (tmp_path / "S" / "STUDY.md").read_text()


def test_sizes_and_budgets_are_not_mixed_on_one_compute_axis(recipe, tmp_path):
    """2 sizes x 2 budgets: 4 points of distinct compute, which one law in compute would fit
    (3 parameters); the report fits in (N, D) instead, and refuses with 2 of each, naming
    why; N is the control's non-embedding parameters, D the cell's tokens."""
    recipe.write_text(WSD)
    study = build(recipe, {"size": {k: SIZES[k] for k in ("d64", "d128")}},
                  budgets={"tokens": [512]},
                  eval={"data_path": str(tmp_path / "heldout"), "tokens": 64})
    fabricate(study, tmp_path / "S",
              lambda folder, *run: synthetic_loss(folder.split("/")[0], *run),
              final=lambda folder: 4 if "budget" in folder else 6,
              non_embedding=lambda size: {"d64": 50_000, "d128": 180_000}[size])
    summary = write_report(study, tmp_path / "S")
    result = summary["scaling"]
    assert result["axes"] == ["N", "D"] and result["fits"] is None
    assert {(p["parameters"]["learned"]["non_embedding"], p["tokens"])
            for p in result["points"].values()} == {(n, d) for n in (50_000, 180_000)
                                                    for d in (512, 768)}
    assert len({p["compute"] for p in result["points"].values()}) == 4
    text = (tmp_path / "S" / "STUDY.md").read_text()
    assert "### Fit: L(N, D) = E + A·(N/N₀)^(−α) + B·(D/D₀)^(−β) per arm" in text
    assert ("No fit: arm learned: the law L(N, D) needs at least 3 sizes and 3 budgets "
            "(5 distinct points), got 2 sizes and 2 budgets.") in text
    assert "L(C) = E" not in text


def test_a_sizes_by_budgets_study_extrapolates_its_joint_law_to_the_papers_model(tmp_path):
    """4 sizes x 4 budgets of final points from a known L(N, D) (what the report's records
    give the scaling section): the section fits it, extrapolates to the paper's
    non-embedding parameters and 100B tokens with its warning, and draws a dashed line
    per size."""
    control = spec.Arm("learned", "learned")
    study = spec.Study("r", (), (control, spec.Arm("binary", "binary")), (1, 2, 3), "learned",
                       spec.EvalSettings())
    rng = np.random.default_rng(0)
    runs, summaries = {}, {}
    for n in (1e5, 3e5, 1e6, 3e6):
        for d in (6e4, 1.2e5, 2.4e5, 4.8e5):
            level = f"n{n:.0e}/d{d:.0e}"
            base = 3.5 + 0.5 * (n / 1e5) ** -0.3 + 1.2 * (d / 6e4) ** -0.5
            runs[level] = {arm: {s: {"evals": {1: {
                "valid_loss": base + (0.3 if arm == "binary" else 0.0)
                + 0.005 * rng.standard_normal(), "flops": 6 * n * d,
                "parameters": {"total": int(n) + 10, "non_embedding": int(n)}}}}
                for s in (1, 2, 3)} for arm in ("learned", "binary")}
            summaries[level] = {"final_iteration": 1, "final_tokens": int(d)}
    result = analysis.analyse(study, runs, summaries)
    fits = result["fits"]
    assert result["axes"] == ["N", "D"] and fits["extrapolated"]
    assert result["target"] == {"N": target.paper_parameters(), "D": 100e9}
    assert 1.6e9 < result["target"]["N"] < 1.8e9
    assert fits["arms"]["learned"]["fit"]["alpha"] == pytest.approx(0.3, abs=0.05)
    assert fits["arms"]["binary"]["gap_at_target"]["value"] == pytest.approx(0.3, abs=0.05)
    text = "\n".join(section.markdown(study, result))
    assert "is an extrapolation over 2.8 orders of magnitude in parameters and 5.3 in tokens" \
        in text
    assert "| arm | α | β | E | A | B | loss at N = 1.71e+09, D = 1e+11 |" in text
    assert "| arm − learned | g_N (per decade of parameters) | g_D (per decade of " in text
    assert len(figures._fit_lines(study, result)) == 4
    figures.plot(study, {}, result, tmp_path)
    assert (tmp_path / "loss_vs_flops.png").read_bytes().startswith(b"\x89PNG")


# ------------------------------------------------------------------------------------ fit

def test_the_fit_recovers_a_known_power_law_from_noisy_points():
    rng = np.random.default_rng(0)
    compute = np.geomspace(1e15, 1e19, 6)
    true = fit.power_law(compute, 2.1, 3.0, 0.3, 1e15)
    for trial in range(5):
        got = fit.fit_power_law(compute, true + rng.normal(0, 0.005, len(compute)))
        assert got["alpha"] == pytest.approx(0.3, abs=0.05), trial
        assert got["E"] == pytest.approx(2.1, abs=0.1), trial
        assert np.abs(got["residuals"]).max() < 0.02


def test_the_fit_refuses_fewer_than_three_compute_values():
    with pytest.raises(ValueError, match="at least 3 levels/budgets of different compute, "
                                         "got 2"):
        fit.fit_power_law([1e15, 1e15, 1e16], [3.0, 3.1, 2.5], "arm binary")


def five_levels(noise: float, gap=lambda c: 0.0, seeds=(1, 2, 3, 4), seed: int = 1,
                binary=(2.1, 2.5)) -> dict:
    rng = np.random.default_rng(seed)
    compute = {f"l{i}": c for i, c in enumerate(np.geomspace(1e14, 1e18, 5))}
    return {lv: {"compute": c, "loss": {
        "learned": {s: float(fit.power_law(c, 2.0, 2.0, 0.4, 1e14) + rng.normal(0, noise))
                    for s in seeds},
        "binary": {s: float(fit.power_law(c, *binary, 0.4, 1e14) + gap(c)
                            + rng.normal(0, noise)) for s in seeds}}}
            for lv, c in compute.items()}


def test_five_levels_extrapolate_with_intervals_that_hold_the_truth():
    """Seeds scatter each level's loss; the 95% intervals of α and of the loss at the target
    hold the truth, and the gap there is the difference of the two fits."""
    fits = fit.fit_arms(five_levels(0.01), "learned", 1e21)
    assert fits["extrapolated"] and fits["dof"] == 5 * 3
    for arm, e in (("learned", 2.0), ("binary", 2.1)):
        f = fits["arms"][arm]
        assert f["alpha"]["low"] <= 0.4 <= f["alpha"]["high"], f
        truth = fit.power_law(1e21, e, 2.0 if arm == "learned" else 2.5, 0.4, 1e14)
        assert f["at_target"]["low"] <= truth <= f["at_target"]["high"], f
    gap = fits["arms"]["binary"]["gap_at_target"]["value"]
    assert gap == pytest.approx(fit.predict(fits["arms"]["binary"]["fit"], 1e21)
                                - fit.predict(fits["arms"]["learned"]["fit"], 1e21))
    assert "gap_at_target" not in fits["arms"]["learned"]
    one_seed = fit.fit_arms(five_levels(0.01, seeds=(1,)), "learned", 1e21)
    assert not one_seed["extrapolated"] and "one seed per level" in one_seed["why_not"]
    assert one_seed["arms"]["binary"]["alpha"]["low"] is None


def test_the_gap_fitted_directly_recovers_a_known_trend():
    """binary = learned's law + a gap of 0.2 shrinking by 0.03 per decade of compute: the
    direct fit's slope and extrapolated gap are the known ones; with both arms on laws of
    one α, the α-fixed sensitivity's interval holds the true gap at the target."""
    trend = lambda c: 0.2 - 0.03 * np.log10(c / 1e14)  # noqa: E731
    gaps = fit.fit_arms(five_levels(0.0, trend, binary=(2.0, 2.0)), "learned", 1e21)["gaps"]
    assert gaps["binary"]["slopes"][0]["value"] == pytest.approx(-0.03)
    assert gaps["binary"]["at_target"]["value"] == pytest.approx(trend(1e21))
    fits = fit.fit_arms(five_levels(0.01), "learned", 1e21)
    fixed = fits["fixed_alpha"]["arms"]["binary"]["gap_at_target"]
    truth = fit.power_law(1e21, 2.1, 2.5, 0.4, 1e14) - fit.power_law(1e21, 2.0, 2.0, 0.4, 1e14)
    assert fixed["low"] <= truth <= fixed["high"], fixed


def test_a_parameter_at_its_bound_is_flagged_never_a_zero_width_interval(recipe, tmp_path):
    """Losses on a law whose floor lies below 0 (E = −0.3): E ends at its bound 0, the
    report flags it beside the value and prints no interval for it."""
    points = {f"l{i}": {"compute": c, "loss": {arm: {s: float(3.0 * (c / 1e14) ** -0.1 - 0.3
                                                              + 0.001 * s) for s in (1, 2, 3)}
                                              for arm in ("learned", "binary")}}
              for i, c in enumerate(np.geomspace(1e14, 1e18, 5))}
    fits = fit.fit_arms(points, "learned", 1e21)
    learned = fits["arms"]["learned"]
    assert learned["fit"]["at_bound"] == {"E": "E = 0"}
    assert learned["E"]["low"] is None and learned["at_target"]["low"] is None
    study = build(recipe, {"size": SIZES})
    text = "\n".join(section.markdown(study, {"points": {}, "fits": fits, "axes": ["compute"],
                                              "target": {"compute": 1e21},
                                              "orders_of_magnitude": {"compute": 3.0},
                                              "task_gaps": {}}))
    assert "(**at its bound: E = 0**, no interval)" in text
    assert "[0.000, 0.000]" not in text


def test_the_papers_compute_is_its_recipes_flops_per_token_times_its_tokens():
    """The 1.7B shape at 100B tokens: within 10% of 6·N·D with N = 1.7e9 (the causal
    attention and the logits add a little, the input embedding counts nothing)."""
    assert target.paper_compute() == pytest.approx(6 * 1.7e9 * 100e9, rel=0.1)


def test_the_papers_model_is_the_shape_of_the_papers_recipe():
    """The fit extrapolates to the ``smollm2-1.7b`` preset: every flag of the paper's recipe
    that shapes the model (what the FLOPs and the parameters count) is the preset's."""
    from megatron_ext.config.arguments import read_training_flags
    recipe = read_training_flags(spec.read_study_recipe(
        str(REPO / "examples/smollm2_1p7b/recipe.args"))).model
    model = target.paper_config().model
    shape = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
             "num_query_groups", "kv_channels", "seq_length", "swiglu", "disable_bias_linear",
             "untie_embeddings_and_output_weights", "normalization", "position_embedding_type",
             "make_vocab_size_divisible_by")
    assert {f: getattr(recipe, f) for f in shape} == {f: getattr(model, f) for f in shape}


def test_study_with_factors_round_trips_through_settle(recipe, tmp_path):
    study = build(recipe, {"size": {"d64": SIZES["d64"]}})
    assert spec.settle(tmp_path / "S", study) == spec.settle(tmp_path / "S", None) == study
    other = dataclasses.replace(study, factors=())
    with pytest.raises(StudyError, match="holds another study"):
        spec.settle(tmp_path / "S", other)


# ------------------------------------------------------------------------------- budgets

WSD = TINY_RECIPE.replace("--train-iters 3", "--train-iters 6") + (
    "--lr-decay-style WSD --lr-wsd-decay-iters 2 --save-interval 1\n"
    "--tokenizer-type NullTokenizer --vocab-size 511\n")


def test_budgets_branch_from_the_last_stable_save_before_their_cooldown(recipe):
    """6 steps of 128 tokens, the last 2 (1/3) decaying: a 640-token budget (5 steps)
    decays over its last third from the save at step 3; its cell follows its run's."""
    recipe.write_text(WSD)
    study = build(recipe, {}, arms=["learned"], seeds=[1], budgets={"tokens": [640]})
    (folder, main), (branch_folder, branch) = study.cells()
    assert (folder, branch_folder) == ("", "budget_640") and main.branch is None
    assert branch.recipe[len(main.recipe):] == (
        "--train-iters", "5", "--lr-wsd-decay-iters", "2", "--override-opt_param-scheduler",
        "--ckpt-step", "3")
    assert spec.branched_from(Path("S"), branch_folder, branch.arms[0], 1) == \
        Path("S/learned/seed1")


@pytest.mark.parametrize("change, budgets, message", [
    (("--lr-decay-style WSD", "--lr-decay-style cosine"), [640], "lacks: --lr-decay-style WSD"),
    (("--save-interval 1", ""), [640], "lacks: --save-interval"),
    # a fixed decay length in samples kept the branches from ever cooling down
    (("--train-iters 6", "--train-samples 24 --lr-decay-samples 24"), [640],
     "lacks: no --lr-decay-samples (the decay ends at the last iteration)"),
    (("", ""), [768], "budget 768 tokens (6 steps of 128 tokens)"),
    (("", ""), [200], "budget 200 tokens (1 steps of 128 tokens)"),
    (("", ""), [-5], "give distinct positive counts"),
])
def test_budgets_the_recipe_cannot_branch_are_refused(recipe, change, budgets, message):
    recipe.write_text(WSD.replace(*change))
    with pytest.raises(StudyError, match=re.escape(message)):
        build(recipe, {}, arms=["learned"], seeds=[1], budgets={"tokens": budgets})


def test_slurm_dry_run_makes_each_branch_depend_on_its_run(recipe, tmp_path, capsys):
    recipe.write_text(WSD)
    study_dir, out = slurm_dry_run(recipe, tmp_path, capsys, f'[factors.size]\nd64 = '
                                   f'"{SIZES["d64"]}"\n[budgets]\ntokens = [640]\n')
    headers = re.findall(r"^# ===== (.+?): \S+( \(after <\S+> succeeds\))? =====$", out,
                         flags=re.M)
    assert headers == [("d64 learned seed 1", ""), ("d64 binary seed 1", ""),
                       ("d64/budget_640 learned seed 1", " (after <S-d64-learned-seed1> succeeds)"),
                       ("d64/budget_640 binary seed 1", " (after <S-d64-binary-seed1> succeeds)")]
    branch = out[out.index("# ===== d64/budget_640 binary"):]
    assert f"--load {study_dir}/d64/binary/seed1/checkpoints" in branch
    assert f"--save {study_dir}/d64/budget_640/binary/seed1/checkpoints" in branch


def test_a_branch_trains_from_its_run_resumes_after_a_kill_and_is_not_retrained(recipe,
                                                                                 tmp_path):
    """The one real training here: a 6-step WSD run and its 5-step branch from step 3; the
    branch's state after a kill (its save at step 4 the latest) resumes from its own
    checkpoint; a finished branch is skipped."""
    import shutil

    from megatron_ext.metrics.sinks import read_metrics
    recipe.write_text(WSD)
    toml = tmp_path / "s.toml"
    toml.write_text(f'recipe = "{recipe}"\narms = ["learned"]\nseeds = [1]\n'
                    f'[budgets]\ntokens = [640]\n')
    study_dir = tmp_path / "S"
    run = ["run", str(study_dir), "--study", str(toml), "--no-eval"]
    study_tool.main(run)
    main, branch = study_dir / "learned" / "seed1", study_dir / "budget_640" / "learned" / "seed1"
    log = (branch / "train.log").read_text()
    assert f"resumed from {main}/checkpoints/iter_0000003 at iteration 3" in log
    lr = {r["iteration"]: r["learning-rate"] for r in read_metrics(str(main / "checkpoints"))
          if r["kind"] == "train"}
    branch_lr = {r["iteration"]: r["learning-rate"]
                 for r in read_metrics(str(branch / "checkpoints")) if r["kind"] == "train"}
    assert sorted(branch_lr) == [4, 5]
    assert branch_lr[4] < lr[4] == lr[3]  # the run is still stable at step 4; the branch decays
    # killed after its save at step 4: the marker names 4 and step 5 never completed
    ckpt = branch / "checkpoints"
    shutil.rmtree(ckpt / "iter_0000005")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("4")
    study_tool.main(run)
    log = (branch / "train.log").read_text()
    assert f"--save {ckpt} holds iteration 4: resuming from it" in log
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "5"
    before = (branch / "train.log").stat().st_size
    study_tool.main(run)
    assert (branch / "train.log").stat().st_size == before  # nothing trained again
