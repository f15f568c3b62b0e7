"""Regular expressions for Megatron-LM's log lines, written from its source (core_v0.16.1,
``megatron/training/training.py``): ``training_log``'s line and
``evaluate_and_print_results``'s. What a scraper written for Megatron-LM matches; fields
Megatron-LM prints only under a flag or a condition are optional. Our own fields may follow
the match."""

from __future__ import annotations

import re

_NUMBER = r"[-+]?\d+(?:\.\d*)?(?:E[-+]\d+)?"  # '{:.1f}', '{:.3f}' and '{:.6E}' alike

# log_string of training_log, field by field, in its order.
TRAINING = re.compile(
    r" \[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{6}\]"
    r" iteration +(?P<iteration>\d+)/ *(?P<train_iters>\d+) \|"
    r" consumed samples: +(?P<consumed_samples>\d+) \|"
    r"(?: skipped samples: +\d+ \|)?"
    rf" elapsed time per iteration \(ms\): (?P<elapsed_ms>{_NUMBER}) \|"
    rf"(?: throughput per GPU \(TFLOP/s/GPU\): (?P<tflops>{_NUMBER}) \|)?"
    rf" learning rate: (?P<learning_rate>{_NUMBER}) \|"
    r" global batch size: +(?P<global_batch_size>\d+) \|"
    rf"(?: lm loss: (?P<lm_loss>{_NUMBER}) \|)?"
    rf" loss scale: (?P<loss_scale>{_NUMBER}) \|"
    rf"(?: grad norm: (?P<grad_norm>{_NUMBER}) \|)?"
    rf"(?: num zeros: (?P<num_zeros>{_NUMBER}) \|)?"
    rf"(?: params norm: (?P<params_norm>{_NUMBER}) \|)?"
    r" number of skipped iterations: +(?P<skipped>\d+) \|"
    r" number of nan iterations: +(?P<nan>\d+) \|")

# evaluate_and_print_results, prefix 'iteration {N}', one loss key: 'lm loss'.
VALIDATION = re.compile(
    r" validation loss at iteration (?P<iteration>\d+) \|"
    rf" lm loss value: (?P<lm_loss>{_NUMBER}) \| lm loss PPL: (?P<ppl>{_NUMBER}) \| $")


# evaluate_and_print_results at the end of training: prefix 'iteration {N} on validation set'
# and 'iteration {N} on test set'.
FINAL = re.compile(
    r" validation loss at iteration (?P<iteration>\d+) on (?P<split>validation|test) set \|"
    rf" lm loss value: (?P<lm_loss>{_NUMBER}) \| lm loss PPL: (?P<ppl>{_NUMBER}) \| $")


def training_lines(text: str) -> list[re.Match]:
    """The training log lines of ``text``, parsed."""
    return [m for m in map(TRAINING.match, text.splitlines()) if m]


def validation_lines(text: str) -> list[re.Match]:
    return [m for m in map(VALIDATION.match, text.splitlines()) if m]


def final_lines(text: str) -> list[re.Match]:
    """The evaluations at the end of training: validation set, then test set."""
    return [m for m in map(FINAL.match, text.splitlines()) if m]
