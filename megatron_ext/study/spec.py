"""What a study is: a recipe (the flag file tools/submit.py reads), named arms, seeds, the
control arm, how checkpoints are evaluated and, optionally, how the final ones are probed
(``[probes]``, :class:`megatron_ext.probes.settings.ProbeSettings`). Read from a TOML study
file and/or flags, checked once, and frozen into ``STUDY_DIR/definition.json`` by the first
command, so that every later command (and the report) uses exactly the same definition,
including the held-out loss gap of interest and the equivalence margin the report reads its
comparisons against (fixed before any result: :meth:`Study.reading`).

A study may also cross named **factors** (``[factors.NAME]``, each level a string of flags,
e.g. one model size): every combination of levels (a *cell*) runs every arm and seed with
the level's flags after the recipe's. Run ``S`` of arm ``A`` in the cell of levels ``L1``,
``L2``... lives in ``STUDY_DIR/L1/L2/.../A/seedS/``; each cell is a study of its own
(:meth:`Study.cells`), so arms are compared with the control by seed within a cell. Token
budgets (``[budgets] tokens = [...]``) add, per cell, a cell ``budget_B`` of WSD cooldown
branches of its runs (:mod:`.budgets`).

An arm is ``[NAME:]INTERFACE[@--flag=value[@--flag ...]]``: ``binary``,
``gf2@--code-seed=7``, ``small:binary@--code-scale=0.02``. Its name (default: the whole
spec) names its folder; a control is one more arm. A seed sets ``--seed`` (backbone
initialisation and data order); the fixed code stays as the arm defines it. Run ``S`` of arm
``A`` lives in ``STUDY_DIR/A/seedS/`` (``checkpoints/`` with ``metrics.jsonl``, ``eval/``,
the training log).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import itertools
import shlex
import tomllib
from pathlib import Path
from typing import Optional, Sequence

from ..codes.limits import ARMS, PAPER_ARMS
from ..config import recipes, run_config
from ..config.arms import Arm, check_name, parse_arm as parse_arm_spec
from ..config.flag_fields import FlagConfig, flag
from ..probes.settings import ProbeSettings
from ..runtime.errors import FlagError, StudyError
from ..runtime.files import write_text

from .budgets import Branch, plan


def _spellings(role: str) -> tuple[str, ...]:
    """The flags whose field declares this role in a study (flag_fields.STUDY_ROLES), as the
    command line spells them."""
    return tuple(spelling for config, field in run_config.fields_where(study=role)
                 for spelling in config.spellings(field))


# Set by the study for every run (the arm, the seed, where it saves and logs); an arm or
# recipe that sets them is refused.
PER_RUN_FLAGS = _spellings("per_run")
# What an arm may not change: the tokens of an iteration, at which the arms are compared.
ARM_FIXED_FLAGS = _spellings("arm_fixed")  # (batch ramps: UNSTUDIED_FLAGS)


@dataclasses.dataclass(frozen=True)
class Level:
    """One level of a factor: its name (a folder) and the flags it adds to the recipe."""
    name: str
    flags: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Factor:
    name: str
    levels: tuple[Level, ...]


@dataclasses.dataclass(frozen=True)
class StudyFlags(FlagConfig):
    """The flags naming a study's file and arms (tools/study.py's, and tools/plan.py's and
    tools/submit.py's): each arm as :func:`parse_arm` reads it."""
    study: Optional[str] = flag(None, "a study file (tools/study.py's TOML)")
    arms: str = flag(
        ",".join(PAPER_ARMS),
        "comma-separated arms of %s (default: %s), each with flags of its own as a study names "
        "them: [NAME:]ARM[@--flag=value...], e.g. r32:factorized@--input-table-rank=32 (NAME "
        "names its folder)" % (",".join(ARMS), ",".join(PAPER_ARMS)))


@dataclasses.dataclass(frozen=True)
class EvalSettings(FlagConfig):
    """How each checkpoint is evaluated: the held-out token set (the first ``tokens``
    tokens of ``data_path``, the same for every run and checkpoint) and, optionally,
    downstream tasks (tools/evaluate.py's, from ``data_dir``; the fields with a flag are
    tools/study.py's and, ``data_dir``, ``batch_size`` and ``limit``, tools/evaluate.py's). A
    held-out prefix that the recipe trains on is refused unless ``allow_train_text`` (then the
    report says so)."""
    data_path: Optional[str] = flag(None, "indexed dataset prefix of the held-out set",
                                    names=("--eval-data-path",))
    tokens: int = flag(65536, "held-out tokens per evaluation (default 65536)",
                       names=("--eval-tokens",))
    batch_size: int = flag(8, "windows (the held-out loss) and documents (lm-eval) per "
                              "forward pass")
    tasks: tuple[str, ...] = ()
    data_dir: Optional[str] = flag(None, "folder of <task>.jsonl files (official layouts)")
    limit: Optional[int] = flag(None, "only the first N documents per task (tests)")
    allow_train_text: bool = False


@dataclasses.dataclass(frozen=True)
class Study:
    recipe_path: str
    recipe: tuple[str, ...]  # the recipe's flags, then the study's overrides
    arms: tuple[Arm, ...]
    seeds: tuple[int, ...]
    control: str
    eval: EvalSettings
    probes: Optional[ProbeSettings] = None
    factors: tuple[Factor, ...] = ()
    budgets: tuple[int, ...] = ()  # tokens
    branch: Optional[Branch] = None  # a budget's cell: its runs branch from their run's
    # A factor tuned over, e.g. "lr": across levels, each arm is compared at its best level
    # of it (lowest final held-out loss) for every combination of the other factors.
    tune: Optional[str] = None
    # Fixed before the study (nats of held-out loss): the gap a fresh study should detect
    # and the equivalence / non-inferiority margin, study-wide and per comparison
    # ``("B - A", gap, margin)``, which override them (:meth:`reading`).
    gap_of_interest: Optional[float] = None
    margin: Optional[float] = None
    comparisons: tuple[tuple[str, Optional[float], Optional[float]], ...] = ()

    def reading(self, b: str, a: str) -> tuple[Optional[float], Optional[float]]:
        """``(gap of interest, margin)`` of the comparison ``b − a`` in nats."""
        own = next((c for c in self.comparisons if c[0] == f"{b} - {a}"), None)
        if own is None:
            return self.gap_of_interest, self.margin
        return (own[1] if own[1] is not None else self.gap_of_interest,
                own[2] if own[2] is not None else self.margin)

    def runs(self):
        """``(arm, seed)`` of every run of a study without factors (of one cell), arm-major."""
        return [(arm, seed) for arm in self.arms for seed in self.seeds]

    def cells(self) -> list[tuple[str, "Study"]]:
        """``(folder, study)`` of every combination of the factors' levels, in the order
        the factors and levels are listed: the folder (``L1/L2``, relative to the study's;
        ``""`` without factors) and the study of that cell (the levels' flags appended to
        the recipe, no factors), each followed by its budgets' cells (``L1/L2/budget_B``,
        the branch's flags appended)."""
        cells = []
        for levels in itertools.product(*(f.levels for f in self.factors)):
            flags = tuple(flag for level in levels for flag in level.flags)
            folder = "/".join(level.name for level in levels)
            cell = dataclasses.replace(self, recipe=self.recipe + flags, factors=(), budgets=(),
                                       tune=None)
            cells.append((folder, cell))
            what = f"level {folder}" if folder else f"the recipe {self.recipe_path}"
            for branch in plan(cell.recipe, self.budgets, what):
                cells.append(("/".join(filter(None, [folder, branch.folder])),
                              dataclasses.replace(cell, recipe=cell.recipe + branch.flags(),
                                                  branch=branch)))
        return cells

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Study":
        return cls(recipe_path=d["recipe_path"], recipe=tuple(d["recipe"]),
                   arms=tuple(Arm(a["name"], a["interface"], tuple(a["flags"]))
                              for a in d["arms"]),
                   seeds=tuple(d["seeds"]), control=d["control"],
                   eval=EvalSettings(**{**d["eval"], "tasks": tuple(d["eval"]["tasks"])}),
                   probes=ProbeSettings(**d["probes"]) if d.get("probes") else None,
                   factors=tuple(Factor(f["name"], tuple(Level(lv["name"], tuple(lv["flags"]))
                                                         for lv in f["levels"]))
                                 for f in d.get("factors", ())),
                   budgets=tuple(d.get("budgets", ())), tune=d.get("tune"),
                   gap_of_interest=d.get("gap_of_interest"), margin=d.get("margin"),
                   comparisons=tuple(tuple(c) for c in d.get("comparisons", ())))


def nats(value, key: str) -> float:
    """A loss gap given as nats (a number, or its text) or as a share of perplexity
    (``"3.3%"``: ln 1.033 nats); positive."""
    text = str(value).strip()
    try:
        gap = math.log1p(float(text[:-1]) / 100) if text.endswith("%") else float(text)
    except ValueError:
        gap = math.nan
    if not gap > 0 or not math.isfinite(gap):
        raise StudyError(f"{key} {value!r}: expected a positive loss gap in nats (0.0325) or "
                         f"as % perplexity (3.3%)")
    return gap


def _comparisons(fields: dict, arms: Sequence[str]) -> tuple:
    """``[comparisons."B - A"]`` tables (``gap_of_interest``, ``margin``) as
    :attr:`Study.comparisons`, each naming two of the study's arms."""
    out = []
    for name, keys in (fields or {}).items():
        pair = [x.strip() for x in name.split(" - ")]
        if len(pair) != 2 or not set(pair) <= set(arms):
            raise StudyError(f"[comparisons.{name!r}]: expected \"B - A\" of two arms "
                             f"among {list(arms)}")
        unknown = set(keys) - {"gap_of_interest", "margin"}
        if unknown:
            raise StudyError(f"[comparisons.{name!r}]: unknown key(s) {sorted(unknown)}; "
                             f"expected gap_of_interest, margin")
        out.append((" - ".join(pair), *(None if keys.get(k) is None else nats(keys[k], k)
                                        for k in ("gap_of_interest", "margin"))))
    return tuple(out)


def run_dir(study_dir: Path, arm: Arm, seed: int) -> Path:
    return Path(study_dir) / arm.name / f"seed{seed}"


def all_runs(study: "Study", study_dir: Path) -> list[tuple[str, "Study", Arm, int, Path]]:
    """``(cell folder, cell study, arm, seed, run folder)`` of every run, cell by cell (a
    run before its budgets' branches)."""
    return [(folder, cell, arm, seed, run_dir(Path(study_dir) / folder, arm, seed))
            for folder, cell in study.cells() for arm, seed in cell.runs()]


def branched_from(study_dir: Path, folder: str, arm: Arm, seed: int) -> Path:
    """The run that the run ``arm``/``seed`` of the budget cell ``folder`` branches from."""
    return run_dir(Path(study_dir) / Path(folder).parent, arm, seed)


def parse_arm(spec: str, interfaces: tuple[str, ...]) -> Arm:
    """An arm from ``[NAME:]INTERFACE[@--flag=value...]``
    (:func:`megatron_ext.config.arms.parse_arm`) that sets neither a flag the study sets for
    every run nor the tokens of an iteration; errors name the spec."""
    try:
        arm = parse_arm_spec(spec, interfaces)
    except FlagError as error:
        raise StudyError(str(error)) from None
    _refuse_per_run(arm.flags, f"arm {spec!r}")
    for token in arm.flags:
        if token.split("=")[0] in ARM_FIXED_FLAGS:
            raise StudyError(f"arm {spec!r} sets {token.split('=')[0]}: the arms are compared "
                             f"at equal iterations, so each trains the recipe's tokens per "
                             f"iteration; set it in the recipe or a factor's level")
    return arm


def _refuse_per_run(flags, what: str) -> None:
    """Refuse flags that the study sets for every run, naming ``what`` sets them."""
    for token in flags:
        if token.split("=")[0] in PER_RUN_FLAGS:
            raise StudyError(f"{what} sets {token.split('=')[0]}, which the study sets "
                             f"for every run")


def parse_factors(fields: dict) -> tuple[Factor, ...]:
    """``[factors.NAME]`` tables of ``LEVEL = "--flag value ..."`` (a string or a list of
    flags), in the order written; errors name the factor and level."""
    if not isinstance(fields, dict):
        raise StudyError("factors must be tables [factors.NAME] of LEVEL = \"--flags\"")
    factors, names = [], []
    for factor, levels in fields.items():
        check_name(factor, f"factor {factor!r}", StudyError)
        if not isinstance(levels, dict) or not levels:
            raise StudyError(f"factor {factor!r} needs levels: LEVEL = \"--flags\"")
        parsed = []
        for level, flags in levels.items():
            what = f"level {level!r} of factor {factor!r}"
            check_name(level, what, StudyError)
            if not isinstance(flags, (str, list)):
                raise StudyError(f"{what}: give its flags as a string or a list (in "
                                 f"TOML a level name with a dot, such as lr1.6e-2, needs "
                                 f"quotes: \"lr1.6e-2\" = \"--lr 1.6e-2\")")
            flags = shlex.split(flags) if isinstance(flags, str) else [str(f) for f in flags]
            if not flags or not flags[0].startswith("--"):
                raise StudyError(f"{what}: {' '.join(flags)!r} is not --flag [value]...")
            _refuse_per_run(flags, what)
            parsed.append(Level(level, tuple(flags)))
            names.append(level)
        factors.append(Factor(factor, tuple(parsed)))
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise StudyError(f"level name(s) {repeated} appear more than once; each names "
                         f"a folder")
    return tuple(factors)


def _budgets(fields: Optional[dict]) -> tuple[int, ...]:
    """``[budgets] tokens = [...]``: distinct positive token counts, in increasing order."""
    if fields is None:
        return ()
    if not isinstance(fields, dict) or set(fields) != {"tokens"}:
        raise StudyError("[budgets] takes one key, tokens = [token counts]")
    tokens = [int(t) for t in fields["tokens"]]
    if not tokens or min(tokens) <= 0 or len(set(tokens)) != len(tokens):
        raise StudyError(f"[budgets] tokens {tokens}: give distinct positive counts")
    return tuple(sorted(tokens))


def read_study_recipe(path: str) -> list[str]:
    return recipes.read_recipe(Path(path), PER_RUN_FLAGS, "the study sets for every run")


def build_study(fields: dict, base: Path, allow_unreported_intervals: bool = False) -> Study:
    """A study from ``fields`` (a study file's keys, or flags): ``recipe``, ``overrides``
    (flags appended to the recipe's, e.g. a smaller ``--train-samples``), ``arms``,
    ``seeds``, ``control``, ``eval`` (a dict of :class:`EvalSettings` fields), ``probes`` (a
    dict of :class:`ProbeSettings` fields; ``data_path`` defaults to the eval's). Relative
    paths are taken from ``base`` (the study file's folder, or the working directory).
    ``allow_unreported_intervals``: define a tuned study of fewer than 3 seeds, whose tuned
    gaps have no interval (refused otherwise). ``gap_of_interest`` and ``margin`` (nats or
    ``"x%"`` perplexity, :func:`nats`) and ``comparisons`` (``{"B - A": {...}}``, their
    per-comparison values) are fixed with the rest, before any result."""
    unknown = set(fields) - {"recipe", "overrides", "arms", "seeds", "control", "eval",
                             "probes", "factors", "budgets", "tune", "gap_of_interest",
                             "margin", "comparisons"}
    if unknown:
        raise StudyError(f"unknown study key(s) {sorted(unknown)}; expected recipe, "
                         f"overrides, arms, seeds, control, eval, probes, factors, budgets, "
                         f"tune, gap_of_interest, margin, comparisons")
    for key in ("recipe", "arms", "seeds"):
        if not fields.get(key):
            raise StudyError(f"the study needs {key} (a study file key or --{key})")
    arms = tuple(parse_arm(str(a), ARMS) for a in fields["arms"])
    names = [a.name for a in arms]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise StudyError(f"duplicate arm name(s) {duplicates}; name them NAME:SPEC")
    seeds = tuple(int(s) for s in fields["seeds"])
    if len(set(seeds)) != len(seeds):
        raise StudyError(f"duplicate seeds in {list(seeds)}")
    control = fields.get("control") or "learned"
    if control not in names:
        raise StudyError(f"the control arm {control!r} is not among the arms {names} "
                         f"(--control)")
    evaluation = dict(fields.get("eval") or {})
    bad = set(evaluation) - {f.name for f in dataclasses.fields(EvalSettings)}
    if bad:
        raise StudyError(f"unknown eval setting(s) {sorted(bad)}")
    for key in ("data_path", "data_dir"):
        if evaluation.get(key):
            evaluation[key] = str((base / evaluation[key]).resolve())
    evaluation["tasks"] = tuple(evaluation.get("tasks") or ())
    if evaluation["tasks"] and not evaluation.get("data_dir"):
        raise StudyError("downstream tasks need eval data_dir (--data-dir), the folder "
                         "of <task>.jsonl files")
    probes = _probe_settings(fields.get("probes"), base, evaluation.get("data_path"))
    recipe_path = str((base / fields["recipe"]).resolve())
    overrides = [str(f) for f in fields.get("overrides") or ()]
    _refuse_per_run(overrides, "overrides")
    study = Study(recipe_path=recipe_path,
                  recipe=tuple(read_study_recipe(recipe_path) + overrides), arms=arms,
                  seeds=seeds, control=control, eval=EvalSettings(**evaluation),
                  probes=probes, factors=parse_factors(fields.get("factors") or {}),
                  budgets=_budgets(fields.get("budgets")), tune=fields.get("tune"),
                  **{k: None if fields.get(k) is None else nats(fields[k], k)
                     for k in ("gap_of_interest", "margin")},
                  comparisons=_comparisons(fields.get("comparisons"), names))
    _check_tune(study, allow_unreported_intervals)
    _check_held_out(study)
    _check_flags(study)
    return study


ALLOW_UNREPORTED = "--allow-unreported-intervals"
# A tuned study's reported seeds, at least: 2 degrees of freedom, whose interval detects a
# gap of about 5 per-seed spreads at 80% expected power (with 2 reported seeds, 1 degree of
# freedom: about 28; with 1, no interval).
REPORTED_SEEDS = 3


def split_seeds(seeds: Sequence) -> tuple[list, list]:
    """``(selection, reported)`` of a tuned study: the first half of the sorted seeds
    (rounded down, at least one) choose each arm's level, the others are reported; one seed
    does both."""
    seeds = sorted(seeds)
    if len(seeds) < 2:
        return seeds, seeds
    half = len(seeds) // 2
    return seeds[:half], seeds[half:]


def seeds_for_reported(reported: int) -> int:
    """The fewest seeds a tuned study trains for ``reported`` reported seeds
    (:func:`split_seeds`): 2·reported − 1, the selection's included."""
    return 2 * reported - 1


def _check_tune(study: Study, allow_unreported_intervals: bool) -> None:
    """``tune`` names a factor of two levels or more, a held-out set picks the best, and
    there are seeds enough for the tuned gaps to have an interval that can detect something
    (:data:`REPORTED_SEEDS` reported: 5 seeds, the first half choose) unless
    ``allow_unreported_intervals``."""
    if study.tune is None:
        return
    factor = next((f for f in study.factors if f.name == study.tune), None)
    if factor is None:
        raise StudyError(f"tune = {study.tune!r} is not a factor of the study "
                         f"({[f.name for f in study.factors]})")
    if len(factor.levels) < 2:
        raise StudyError(f"tune = {study.tune!r}: factor {study.tune!r} needs two levels "
                         f"or more to choose from")
    if not study.eval.data_path:
        raise StudyError(f"tune = {study.tune!r} chooses by the held-out loss: give "
                         f"[eval] data_path")
    reported = len(split_seeds(study.seeds)[1])
    if reported < REPORTED_SEEDS and not allow_unreported_intervals:
        from .power import Part, detectable  # scipy: only when refusing

        def spread(r: int) -> str:  # the smallest gap r reported seeds detect
            return f"{detectable([Part(1 / r, r - 1, 1.0)]):.1f}"
        weak = ("no interval" if reported < 2 else
                f"an interval of {reported - 1} degree of freedom, which detects only gaps "
                f"above {spread(reported)} times the per-seed spread of a difference at "
                f"80% expected power")
        raise StudyError(
            f"tune = {study.tune!r} with {len(study.seeds)} seed(s): the first half of the "
            f"seeds choose each arm's level and the others are reported, so its tuned gaps "
            f"would rest on {reported} reported seed(s): {weak}; give at least "
            f"{seeds_for_reported(REPORTED_SEEDS)} seeds ({REPORTED_SEEDS} reported: gaps "
            f"from {spread(REPORTED_SEEDS)} times that spread), or {ALLOW_UNREPORTED} to run "
            f"it anyway")


def _check_held_out(study: Study) -> None:
    """The held-out sets (eval, probes) must not be a training prefix of any run (whose
    relative prefixes are taken from the repository root, where the launchers start it)."""
    from ..launch.slurm import REPO as RUNS_START_IN
    trained = sorted({p for _, cell in study.cells() for arm in cell.arms
                      for p in recipes.training_prefixes([*cell.recipe, *arm.flags])})
    for what, settings in (("eval data_path", study.eval), ("probes data_path", study.probes)):
        if settings is not None and settings.data_path:
            recipes.check_held_out(settings.data_path, trained, RUNS_START_IN, what,
                                   f"the recipe {study.recipe_path} (or an arm)",
                                   settings.allow_train_text,
                                   "allow_train_text = true (in its section)")


def _probe_settings(fields: Optional[dict], base: Path, eval_data: Optional[str]
                    ) -> Optional[ProbeSettings]:
    if fields is None:
        return None
    bad = set(fields) - {f.name for f in dataclasses.fields(ProbeSettings)}
    if bad:
        raise StudyError(f"unknown probes setting(s) {sorted(bad)}")
    data_path = fields.get("data_path")
    data_path = str((base / data_path).resolve()) if data_path else eval_data
    if not data_path:
        raise StudyError("[probes] needs data_path (or [eval] data_path): the held-out "
                         "tokens the probes read")
    counts = fields.get("unigram_counts")
    counts = str((base / counts).resolve()) if counts else None
    settings = ProbeSettings(**{**fields, "data_path": data_path, "unigram_counts": counts})
    settings.check()
    return settings


# Training flags a study's accounting cannot follow, refused rather than read wrong.
UNSTUDIED_FLAGS = (
    ("--rampup-batch-size", "a study counts a checkpoint's compute as its iterations x "
                            "--global-batch-size, which a batch ramp overstates; train the "
                            "study's runs without one"),
    ("--data-args-path", "the held-out sets are checked against the training prefixes of "
                         "--data-path and --train-data-path; give the blend there"),
    ("--per-split-data-args-path", "the held-out sets are checked against the training "
                                   "prefixes of --data-path and --train-data-path; give the "
                                   "blends as --train/valid/test-data-path"),
)


def _check_flags(study: Study) -> None:
    """Every arm's flags at every level must parse as pretrain_fixedcode.py's (named per arm
    and level), use none of :data:`UNSTUDIED_FLAGS`, and leave to the study which checkpoint
    a run loads. (Whether each run's flags go together is checked for every run, as it will
    start, before any is: ``launch.check_runs``.)"""
    from ..config.arguments import add_training_args, build_parser
    parser = build_parser("")
    add_training_args(parser)
    for folder, cell in study.cells():
        for arm in cell.arms:
            what = f"arm {arm.name!r}" + (f" at level {folder}" if folder else "")
            flags = [*cell.recipe, *arm.training_flags(), "--seed", "1"]
            unknown = parser.parse_known_args(flags)[1]
            if unknown:
                raise StudyError(f"{what} with recipe {study.recipe_path}: "
                                 f"unknown flag(s) {' '.join(unknown)}")
            if cell.branch is None and "--ckpt-step" in [t.split("=")[0] for t in flags]:
                raise StudyError(f"{what} with recipe {study.recipe_path}: --ckpt-step: each "
                                 f"run of a study resumes its own latest checkpoint (a budget "
                                 f"branch loads the step it branches from); remove it")
            try:
                parsed = parser.parse_args(flags)
            except FlagError as e:
                raise StudyError(f"{what} with recipe {study.recipe_path}: {e}") from e
            except SystemExit as e:  # argparse's refusal of a value (it printed why)
                raise StudyError(f"{what} with recipe {study.recipe_path}: "
                                 f"{e.code or 'invalid flags'}") from e
            for flag, why in UNSTUDIED_FLAGS:
                if getattr(parsed, flag[2:].replace("-", "_")):
                    raise StudyError(f"{what} with recipe {study.recipe_path}: {flag}: {why}")


def read_study_file(path: str) -> dict:
    if not os.path.isfile(path):
        raise StudyError(f"--study {path}: no such file")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise StudyError(f"{path}: {e}") from e


SPEC_FILE = "definition.json"


def study_from_flags(study_file: Optional[str], flags: dict, evaluation: dict,
                     allow_unreported_intervals: bool = False) -> Optional[Study]:
    """The study that a ``--study`` file and the command line define together (flags win), or
    None when they define none. ``flags``: ``recipe``, ``arms``, ``seeds`` and ``control`` as
    given (lists comma-separated; None when absent); ``evaluation``: the ``[eval]`` keys given
    by flags (None when absent). A flag's path is relative to the working directory, the
    file's paths to the file's folder. ``allow_unreported_intervals``: as
    :func:`build_study`."""
    fields, base = {}, Path.cwd()
    if study_file:
        fields, base = read_study_file(study_file), Path(study_file).resolve().parent
    split = lambda text: [x.strip() for x in text.split(",") if x.strip()]  # noqa: E731
    given = {"recipe": flags["recipe"] and str(Path(flags["recipe"]).resolve()),
             "arms": flags["arms"] and split(flags["arms"]),
             "seeds": flags["seeds"] and split(flags["seeds"]), "control": flags["control"],
             "gap_of_interest": flags.get("gap_of_interest"), "margin": flags.get("margin")}
    fields.update({k: v for k, v in given.items() if v})
    merged = dict(fields.get("eval", {}))
    for key, value in evaluation.items():
        if value:
            merged[key] = (str(Path(value).resolve()) if key in ("data_path", "data_dir")
                           else split(value) if key == "tasks" else value)
    if merged:
        fields["eval"] = merged
    return build_study(fields, base, allow_unreported_intervals) if fields else None


def settle(study_dir: Path, study: Optional[Study], save: bool = True) -> Study:
    """The study of ``study_dir``: the one given, saved there on first use (unless not
    ``save``); a different one is refused (a study directory holds one study)."""
    path = Path(study_dir) / SPEC_FILE
    if path.exists():
        saved = Study.from_json(json.loads(path.read_text()))
        if study is not None and study != saved:
            raise StudyError(f"{study_dir} holds another study ({path}); give the same "
                             f"definition, none (to reuse it), or another directory")
        return saved
    if study is None:
        raise StudyError(f"{path} does not exist: start the study with --study FILE or "
                         f"--recipe/--arms/--seeds")
    if not save:
        return study
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(study.to_json(), indent=2) + "\n")
    return study
