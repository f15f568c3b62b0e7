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
