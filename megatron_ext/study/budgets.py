"""Token budgets from one run (a study's ``[budgets]``): WSD cooldown branches. Each run trains
once with ``--lr-decay-style WSD``; for each listed budget of ``B`` tokens (``T`` iterations)
the study branches a cooldown from the run's last saved checkpoint at or before the point
where a decay of the recipe's proportion would start (``T·(1 − wsd/train)``, rounded down
to a multiple of ``--save-interval``), and trains it to ``T`` with the decay over the rest
(``--override-opt_param-scheduler --ckpt-step``, docs/training.md). :meth:`.spec.Study.cells`
makes each budget a cell ``LEVEL/budget_B`` whose runs load their own run's checkpoint.

A branch saves into its own folder, which training resumes before ``--load`` (a killed
branch continues); a finished one is skipped like any run.
"""

from __future__ import annotations

import dataclasses

from ..config.schedule import train_iters_of_samples
from ..runtime.errors import StudyError


@dataclasses.dataclass(frozen=True)
class Branch:
    tokens: int      # the budget asked for
    iterations: int  # T: the branch's last iteration (tokens rounded down to whole steps)
    start: int       # the run's checkpoint it branches from
    uses_samples: bool  # the recipe counts --train-samples (else --train-iters)
    global_batch: int

    @property
    def folder(self) -> str:
        return f"budget_{self.tokens}"

    def flags(self) -> tuple[str, ...]:
        """What the branch adds to its run's flags (its ``--load`` is set per run)."""
        length = (["--train-samples", str(self.iterations * self.global_batch)]
                  if self.uses_samples else ["--train-iters", str(self.iterations)])
        return (*length, "--lr-wsd-decay-iters", str(self.iterations - self.start),
                "--override-opt_param-scheduler", "--ckpt-step", str(self.start))


def plan(recipe: tuple[str, ...], budgets: tuple[int, ...], what: str) -> list[Branch]:
    """The branches of ``budgets`` (tokens) for runs of the flags ``recipe``; refused,
    naming ``what`` (the recipe or level), where the recipe cannot branch them."""
    if not budgets:
        return []
    from ..config.arguments import read_training_flags
    config = read_training_flags(recipe)
    training, save_interval = config.training, config.checkpoint.save_interval
    need = {"--lr-decay-style WSD": training.lr_decay_style == "WSD",
            "--lr-wsd-decay-iters": training.lr_wsd_decay_iters is not None,
            "--global-batch-size": training.global_batch_size is not None,
            "--save-interval": save_interval is not None,
            "no --lr-decay-iters (the decay ends at the last iteration)":
                training.lr_decay_iters is None,
            "no --lr-decay-samples (the decay ends at the last iteration)":
                training.lr_decay_samples is None}
    missing = [k for k, ok in need.items() if not ok]
    if missing:
        raise StudyError(f"[budgets] branch WSD cooldowns, but {what} lacks: "
                         f"{', '.join(missing)}")
    batch = training.global_batch_size
    per_step = batch * config.model.seq_length
    main = training.train_iters if training.train_iters is not None \
        else train_iters_of_samples(training.train_samples, batch)
    stable_end = main - training.lr_wsd_decay_iters
    fraction = training.lr_wsd_decay_iters / main
    branches = []
    for tokens in budgets:
        iterations = tokens // per_step
        start = int(iterations * (1 - fraction)) // save_interval * save_interval
        if not 0 < start < iterations < main:
            raise StudyError(
                f"budget {tokens:,} tokens ({iterations} steps of {per_step:,} tokens) "
                f"of {what}: no saved stable checkpoint to branch from (the run trains "
                f"{main} steps, stable to {stable_end}, saving every {save_interval}); "
                f"a budget must lie between one save interval and the run's length")
        branches.append(Branch(tokens, iterations, start, training.train_iters is None, batch))
    return branches
