"""How a study report reads its comparisons (megatron_ext/study/report.py, stats.py,
power.py; issue 57), on fabricated records (tests/unit/test_study_capacity.py's: no
training): a NaN or missing loss is refused naming the run and seed; a comparison over
fewer seeds than its arms have says which it dropped."""

from __future__ import annotations

import json
import math

import pytest

from megatron_ext.metrics.reporting import signed_range
from megatron_ext.runtime.errors import StudyError
from megatron_ext.study.stats import paired_difference

from tests.unit.test_study_capacity import report


def _spoil(study_dir, arm, seed, value):
    path = study_dir / arm / f"seed{seed}" / "eval" / "iter_0000004.json"
    record = json.loads(path.read_text())
    if value is None:
        del record["valid_loss"]
    else:
        record["valid_loss"] = value
    path.write_text(json.dumps(record))


@pytest.mark.parametrize("value", [math.nan, None, math.inf])
def test_a_nan_or_missing_loss_is_refused_naming_the_run_and_seed(tmp_path, value,
                                                                  monkeypatch):
    import megatron_ext.study.report as report_module
    real = report_module.collect

    def spoiled(study, study_dir):
        _spoil(study_dir, "binary", 2, value)
        return real(study, study_dir)
    monkeypatch.setattr(report_module, "collect", spoiled)
    with pytest.raises(StudyError, match=r"binary/seed2: validation loss at iteration 4 is "
                                         + ("nan" if value is not None and math.isnan(value)
                                            else "inf" if value else "missing")):
        report(tmp_path, {"learned": 0.0, "binary": 0.3}, arms=["learned", "binary"])


def test_a_comparison_over_fewer_seeds_than_its_arms_have_names_the_dropped_seeds():
    d = paired_difference({1: 3.0, 2: 5.0, 3: 4.0, 9: 0.0}, {1: 1.0, 2: 2.0, 3: 3.0, 4: 1.0})
    assert d["seeds"] == [1, 2, 3] and d["dropped"] == [4, 9]
    assert signed_range(d).endswith("(paired on seeds 1, 2, 3; seeds 4, 9 dropped: one arm "
                                    "lacks them)")
    whole = paired_difference({1: 3.0, 2: 5.0}, {1: 1.0, 2: 2.0})
    assert "dropped" not in whole and "paired on" not in signed_range(whole)
    with pytest.raises(StudyError, match="seed 2: nan"):
        paired_difference({1: 3.0, 2: math.nan}, {1: 1.0, 2: 2.0})


def _read(tmp_path, gap, **fields):
    from tests.unit import test_study_capacity as capacity
    from helpers.recipes import TINY_RECIPE
    from pathlib import Path
    from megatron_ext.study import spec
    from megatron_ext.study.report import write_report
    recipe = tmp_path / "recipe.args"
    recipe.write_text(TINY_RECIPE + "--tokenizer-type NullTokenizer --vocab-size 511\n")
    study = spec.build_study({"recipe": str(recipe), "arms": ["learned", "binary", "frozen"],
                              "seeds": [1, 2, 3], **fields,
                              "eval": {"data_path": str(tmp_path / "heldout"), "tokens": 64}},
                             Path.cwd())
    capacity.fabricate(study, tmp_path / "S", gap)
    return study, write_report(study, tmp_path / "S"), (tmp_path / "S" / "STUDY.md").read_text()


def test_a_gap_of_interest_prints_its_expected_power_and_seeds_per_comparison(tmp_path):
    """The study's gap (3.3% perplexity: ln 1.033 nats) and a comparison's own (0.2 nats):
    the family table prints, for the held-out loss, the expected power of a fresh study of
    this size at that gap and the seeds for 80% (power.sensitivity), never the seeds for
    the measured gap."""
    from megatron_ext.study import power
    study, summary, text = _read(tmp_path, {"learned": 0.0, "binary": 0.30, "frozen": 0.40},
                                 gap_of_interest="3.3%",
                                 comparisons={"frozen - learned": {"gap_of_interest": 0.2}})
    assert study.gap_of_interest == pytest.approx(math.log(1.033))
    assert study.reading("frozen", "learned") == (0.2, None)
    for arm, gap in (("binary", math.log(1.033)), ("frozen", 0.2)):
        interval = summary["differences"][arm]["valid_loss"]["by_seed"]
        found = power.sensitivity(interval, 0.05, gap)
        row = next(line for line in text.splitlines()
                   if line.startswith(f"| {arm} − control | validation loss | by seed | "))
        assert f"power {found['power']:.2f}, {found['seeds_needed']} seeds" in row
        assert power.gap_text(gap) in row
    assert "(3.3% perplexity)" in text


def test_a_margin_gives_each_comparison_its_equivalence_verdict(tmp_path):
    """binary's loss is 0.30 nats above learned's (a spread of a few thousandths): not
    within ±0.1; frozen is compared with binary at its own margin 0.2 (gap 0.10): within.
    The bound is the 90% interval's (TOST at 5%), in study.json too."""
    study, summary, text = _read(
        tmp_path, {"learned": 0.0, "binary": 0.30, "frozen": 0.40}, margin=0.1,
        comparisons={"frozen - binary": {"margin": 0.2}})
    rows = {(r["pair"], r["metric"]): r for r in summary["rules_out"]}
    binary = rows[("binary − control", "valid_loss")]
    interval = summary["differences"]["binary"]["valid_loss"]["by_seed"]
    ninety = paired_difference(*(
        {s: 5.0 + 0.1 * s + g + n for s, n in zip((1, 2, 3), noise)}
        for g, noise in ((0.30, (0.008, -0.004, 0.002)), (0.0, (0, 0, 0)))), 0.90)
    assert binary["equivalence"]["high"] == pytest.approx(ninety["high"])
    assert binary["equivalence"]["bound"] == pytest.approx(ninety["high"])
    assert binary["equivalence"]["within"] is False and interval["low"] > 0.1
    assert rows[("frozen − binary", "valid_loss")]["equivalence"]["within"] is True
    assert binary["non_inferiority_seeds"] is not None
    saved = json.loads((tmp_path / "S" / "study.json").read_text())
    assert saved["rules_out"][0]["equivalence"]["bound"] == pytest.approx(
        summary["rules_out"][0]["equivalence"]["bound"])
    assert "| not shown |" in text and "within ±0.2000" in text


def test_the_differences_figure_draws_each_90_percent_interval_and_the_margin(
        tmp_path, monkeypatch):
    """differences.png shows what the study rules out: per comparison its 90% interval
    (power.equivalence, TOST at 5%) inside its 95% one, and the dashed ±margin."""
    from megatron_ext.study import power, report
    drawn = {}

    def keep(fig, path):
        drawn[path.name] = fig.axes[0]
    monkeypatch.setattr(report, "save_figure", keep)
    study, summary, _ = _read(tmp_path, {"learned": 0.0, "binary": 0.30, "frozen": 0.05},
                              margin=0.1)
    ax = drawn["differences.png"]
    lines = [tuple(line.get_xdata()) for line in ax.get_lines()]
    for arm in ("binary", "frozen"):
        interval = summary["differences"][arm]["valid_loss"]["by_seed"]
        ninety = power.equivalence(interval)
        assert any(len(x) == 2 and math.isclose(x[0], ninety["low"], abs_tol=1e-12)
                   and math.isclose(x[1], ninety["high"], abs_tol=1e-12) for x in lines)
        assert interval["low"] < ninety["low"] < ninety["high"] < interval["high"]
    dashed = sorted(line.get_xdata()[0] for line in ax.get_lines()
                    if line.get_linestyle() == "--")
    assert dashed == pytest.approx([-0.1, 0.1])


def test_the_scaling_table_prints_the_gap_of_interest_beside_each_levels_loss_gap(tmp_path):
    """Each level's held-out loss gap against the control carries the expected power at
    the comparison's gap of interest and the seeds for 80%, as the family table's does."""
    from helpers.recipes import TINY_RECIPE
    from pathlib import Path
    from megatron_ext.study import power, spec
    from megatron_ext.study.scaling import section
    recipe = tmp_path / "recipe.args"
    recipe.write_text(TINY_RECIPE + "--tokenizer-type NullTokenizer --vocab-size 511\n")
    study = spec.build_study({"recipe": str(recipe), "arms": ["learned", "binary", "frozen"],
                              "seeds": [1, 2, 3], "gap_of_interest": "3.3%",
                              "comparisons": {"frozen - learned": {"gap_of_interest": 0.2}},
                              "eval": {"data_path": str(tmp_path / "heldout"), "tokens": 64}},
                             Path.cwd())
    loss = {arm: {s: 5.0 + g + n for s, n in zip((1, 2, 3), (0.01, -0.004, 0.003))}
            for arm, g in (("learned", 0.0), ("binary", 0.02), ("frozen", 0.05))}
    loss["learned"][2] += 0.01
    result = {"points": {"L1": {"compute": 1e15, "tokens": 4096, "loss": loss,
                                "parameters": {"learned": {"non_embedding": 10, "total": 20}}}},
              "task_gaps": [], "axes": ["compute"], "fits": None, "refused": "one level"}
    text = "\n".join(section.markdown(study, result))
    row = next(line for line in text.splitlines() if line.startswith("| L1 |"))
    for arm, gap in (("binary", math.log(1.033)), ("frozen", 0.2)):
        cell = power.cell(paired_difference(loss[arm], loss["learned"]), gap=gap)
        assert "· power" in cell and f"| {cell} |" in row + " |"
    assert "at the gap of interest: expected power, seeds for 80%" in text


@pytest.mark.parametrize("fields, message", [
    ({"gap_of_interest": "-1%"}, "gap_of_interest '-1%': expected a positive loss gap"),
    ({"margin": "wide"}, "margin 'wide': expected a positive loss gap"),
    ({"comparisons": {"gf2 - learned": {"margin": 0.1}}}, "two arms among"),
    ({"comparisons": {"binary - learned": {"gap": 0.1}}}, r"unknown key\(s\) \['gap'\]"),
])
def test_a_bad_gap_or_margin_is_refused_naming_the_key(tmp_path, fields, message):
    from pathlib import Path
    from helpers.recipes import TINY_RECIPE
    from megatron_ext.study import spec
    recipe = tmp_path / "recipe.args"
    recipe.write_text(TINY_RECIPE + "--tokenizer-type NullTokenizer --vocab-size 511\n")
    with pytest.raises(StudyError, match=message):
        spec.build_study({"recipe": str(recipe), "arms": ["learned", "binary"],
                          "seeds": [1, 2], **fields}, Path.cwd())


def test_the_definition_keeps_the_gap_and_margin_and_the_flags_set_them(tmp_path):
    """Fixed in definition.json with the rest (a later different value is another study);
    `--gap-of-interest 3.3%` as the study file's key."""
    from megatron_ext.study import spec
    recipe = tmp_path / "recipe.args"
    from helpers.recipes import TINY_RECIPE
    recipe.write_text(TINY_RECIPE + "--tokenizer-type NullTokenizer --vocab-size 511\n")
    study = spec.study_from_flags(None, {"recipe": str(recipe), "arms": "learned,binary",
                                         "seeds": "1,2", "control": None,
                                         "gap_of_interest": "3.3%", "margin": "0.02"}, {})
    assert (study.gap_of_interest, study.margin) == (pytest.approx(math.log(1.033)), 0.02)
    assert spec.Study.from_json(json.loads(json.dumps(study.to_json()))) == study
