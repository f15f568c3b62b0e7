"""The log lines read as Megatron-LM's: parsed by regular expressions written from its
source (tests/helpers/megatron_log.py), every value read back as it was given."""

from __future__ import annotations

import dataclasses
import datetime
import math

import pytest

from helpers.megatron_log import TRAINING, VALIDATION
from megatron_ext.metrics.log_line import TrainingFields, training_line, validation_lines

FIELDS = TrainingFields(
    iteration=25, train_iters=30, consumed_samples=100, step_time_s=0.4123,
    tflops_per_gpu=410.54, learning_rate=2.9e-3, global_batch_size=4, loss=4.123456,
    loss_scale=1.0, grad_norm=0.8124, num_zeros=None, params_norm=None, skipped_iterations=1,
    nan_iterations=1, tokens_per_s=5120.0, mfu=0.415, mfu_fp8=None, memory_gib=31.2,
    reserved_gib=33.1, overflow_skipped_total=None)
NOW = datetime.datetime(2026, 12, 1, 21, 30, 5, 123456)


def test_the_training_line_parses_as_megatron_lms():
    line = training_line(FIELDS, NOW)
    m = TRAINING.match(line)
    assert m, line
    assert line.startswith(" [2026-12-01 21:30:05.123456] iteration       25/      30 |")
    assert (int(m["iteration"]), int(m["train_iters"]), int(m["consumed_samples"])) \
        == (25, 30, 100)
    assert float(m["elapsed_ms"]) == 412.3 and float(m["tflops"]) == 410.5
    assert float(m["learning_rate"]) == 2.9e-3 and int(m["global_batch_size"]) == 4
    assert float(m["lm_loss"]) == pytest.approx(4.123456, rel=1e-6)
    assert float(m["loss_scale"]) == 1.0 and float(m["grad_norm"]) == 0.812
    assert (int(m["skipped"]), int(m["nan"])) == (1, 1)
    assert m["num_zeros"] is None and m["params_norm"] is None
    ours = line[m.end():]  # our fields come after Megatron-LM's
    assert ours == " tokens/s: 5,120 | MFU: 41.5% | mem: 31.20 GiB (reserved 33.10 GiB) |"


def test_optional_fields_sit_where_megatron_lm_prints_them():
    fp16 = dataclasses.replace(FIELDS, loss_scale=65536.0, num_zeros=12, params_norm=41.25,
                               overflow_skipped_total=7, loss=None, grad_norm=None)
    line = training_line(fp16, NOW)
    m = TRAINING.match(line)
    assert m, line
    assert float(m["loss_scale"]) == 65536.0 and int(m["num_zeros"]) == 12
    assert float(m["params_norm"]) == 41.25
    assert m["lm_loss"] is None and m["grad_norm"] is None  # left out, as Megatron-LM does
    assert line.endswith(" overflow skipped: 7 |")


def test_the_old_line_does_not_parse():
    """The regular expression can fail: our line before issue 32 is refused."""
    old = ("iteration       25/30 | consumed samples        100 | lm loss: 4.123456E+00 | "
           "lr: 2.900E-03 | grad norm: 0.812 | tokens/s: 5,120 | step time: 412.3 ms | "
           "TFLOP/s/GPU: 410.5 | mem: 0.50 GiB | skipped: 0")
    assert not TRAINING.match(old)
    assert not VALIDATION.match("validation at iteration 3 | lm loss: 5.0E+00 | "
                                "lm loss PPL: 1.4841E+02")


@pytest.mark.parametrize("loss", [2.5, 25.0])
def test_the_validation_line_parses_as_megatron_lms(loss):
    rule, line, closing = validation_lines(3, loss)
    m = VALIDATION.match(line)
    assert m, line
    assert int(m["iteration"]) == 3 and float(m["lm_loss"]) == loss
    assert float(m["ppl"]) == pytest.approx(math.exp(min(20, loss)), rel=1e-6)
    assert rule == closing == "-" * (len(line) + 1)
