"""One declaration per flag: a config's dataclass field carries its command-line flag (the
name, Megatron-LM's where Megatron-LM has it, the type, default, choices and help, in the
field's metadata), and the argparse parser is made from the fields (:func:`add_flags`), as
Megatron-LM's ``megatron/training/config/`` dataclasses and torchtitan's ``job_config.py``
make theirs. A config is built from the parsed flags by the fields' names
(:meth:`FlagConfig.from_flags`: where a Namespace becomes a config, at an entry point) or
from a checkpoint's saved flags (:meth:`FlagConfig.from_record`), and written back as such a
record (:meth:`FlagConfig.record`). Imports nothing heavy: the command lines start without torch.

A field's flag, from its type: ``int`` (at least ``least``, 1 unless 0 means something),
``float``, ``str``, ``tuple[X, ...]`` (``nargs``; a list on the command line and in a record),
``bool`` (a switch: ``--name`` when off by default, ``--no-name`` when on, both spellings with
``switch="both"``). A field without ``help`` has no flag (a value the tool sets).

A training flag's field also declares its life on resume (:data:`RESUME_KINDS`: refused,
said, reconciled or free when it differs from the checkpoint's), what ``--use-checkpoint-args``
takes of it, whether it was added since the first checkpoints, its role in a study and
Megatron-LM's default where it differs (:func:`flag`); ``checkpoint/``, ``study/`` and
``megatron_defaults.py`` read them (``run_config.fields_where``)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import typing
from typing import Any, ClassVar, Optional, Sequence

from .flag_types import nonnegative_int, positive_int


# What a resume does with a flag whose value differs from its checkpoint's
# (checkpoint/compatibility.py).
RESUME_KINDS = {
    "model": "defines the model or its input: refused, named",
    "precision": "the precision the optimizer state holds its parameter copies in: refused",
    "said": "may change on purpose (the data and their order, what the model computes "
            "without changing its shape): taken, and the log names it",
    "schedule": "the learning-rate and weight-decay schedule: reconciled with "
                "--override-opt_param-scheduler / --use-checkpoint-opt_param-scheduler",
    "free": "not compared: how this run runs (parallel sizes, saving, logging, kernels, "
            "guards), or a flag that a compared value covers",
}
# What --use-checkpoint-args does with a flag (checkpoint/saved_args.py): takes the
# checkpoint's always, or where the command line leaves the flag unset (None).
CHECKPOINT_ARGS = ("always", "unset_only")
# A flag's role in a study (study/spec.py): set by the study for every run (an arm, a level
# or a recipe may not set it), or fixed across the arms (a recipe or a level sets it).
STUDY_ROLES = ("per_run", "arm_fixed")


def _one_of(what: str, value, allowed) -> None:
    if value is not None and value not in allowed:
        raise TypeError(f"flag({what}={value!r}): choose one of {', '.join(allowed)}")


def flag(default: Any, help: str, *, names: Sequence[str] = (), least: int = 1,
         choices: Optional[Sequence] = None, nargs=None, metavar=None,
         switch: Optional[str] = None, group: Optional[str] = None,
         resume: Optional[str] = None, checkpoint_args: Optional[str] = None,
         added: bool = False, study: Optional[str] = None,
         megatron_lm: Optional[tuple[Any, str]] = None):
    """A config field that declares its flag: ``names`` (default ``--field-name``),
    ``least`` (an integer's least value), ``choices``, ``nargs`` and ``metavar`` as argparse
    takes them, ``switch="both"`` (a bool with its ``--no-`` form), ``group`` (the ``--help``
    group, default the config's ``FLAG_GROUP``).

    A training flag's life beside the command line, one declaration each: ``resume``, what
    a resume does when it differs from the checkpoint's (a key of :data:`RESUME_KINDS`;
    every training flag states one, tests/unit/test_run_config.py holds them to it);
    ``checkpoint_args``, what ``--use-checkpoint-args`` takes of it (:data:`CHECKPOINT_ARGS`,
    None: nothing); ``added``, added since the first checkpoints (one that lacks it was
    trained with its declared default, the behaviour it was added with); ``study``, its role
    in a study (:data:`STUDY_ROLES`); ``megatron_lm``, ``(Megatron-LM's default, what it
    means)`` where Megatron-LM's differs from ours (said at start-up). A kind outside its set
    is a TypeError where the field is declared."""
    _one_of("resume", resume, RESUME_KINDS)
    _one_of("checkpoint_args", checkpoint_args, CHECKPOINT_ARGS)
    _one_of("study", study, STUDY_ROLES)
    if megatron_lm is not None and not (isinstance(megatron_lm, tuple) and len(megatron_lm) == 2
                                        and isinstance(megatron_lm[1], str)):
        raise TypeError(f"flag(megatron_lm={megatron_lm!r}): give (Megatron-LM's default, "
                        f"what it means)")
    return dataclasses.field(default=default, metadata=dict(
        help=help, names=tuple(names), least=least, choices=choices, nargs=nargs,
        metavar=metavar, switch=switch, group=group, resume=resume,
        checkpoint_args=checkpoint_args, added=added, study=study, megatron_lm=megatron_lm))


def flag_name(name: str) -> str:
    """``--flag-name`` of a field ``flag_name``."""
    return "--" + name.replace("_", "-")


@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _scalar(hint):
    """``(the value type, whether it is a tuple)`` of a field's annotation (``Optional``
    unwrapped)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union:
        return _scalar(args[0])
    if typing.get_origin(hint) is tuple:
        return args[0], True
    return hint, False


class FlagConfig:
    """A frozen dataclass of flags (each field declared with :func:`flag`); ``FLAG_GROUP``
    is the ``--help`` group of its fields that name none."""
    FLAG_GROUP: ClassVar[str] = ""

    @classmethod
    def flag_fields(cls) -> list:
        """The fields that declare a flag."""
        return [f for f in dataclasses.fields(cls) if "help" in f.metadata]

    @classmethod
    def group_of(cls, field: dataclasses.Field) -> str:
        return field.metadata["group"] or cls.FLAG_GROUP

    @classmethod
    def spellings(cls, field: dataclasses.Field) -> tuple[str, ...]:
        """A field's flag as the command line spells it: its ``names``, else
        ``--field-name`` (``--no-field-name`` for a switch on by default)."""
        meta = field.metadata
        if meta["names"]:
            return meta["names"]
        if _scalar(_hints(cls)[field.name])[0] is bool and meta["switch"] != "both" \
                and field.default is True:
            return ("--no-" + field.name.replace("_", "-"),)
        return (flag_name(field.name),)

    @classmethod
    def from_flags(cls, flags: argparse.Namespace, **values):
        """The config of parsed ``flags`` (a flag the parser did not have keeps its declared
        default; lists become tuples), with ``values`` for the fields they set."""
        return cls.from_record({**vars(flags), **values})

    @classmethod
    def from_record(cls, record: dict):
        """The config of a record of flags by name (a checkpoint's saved ``args``, a
        parsed Namespace's ``vars``): names it lacks (flags added since it was written)
        take their declared defaults, names it has besides are left out."""
        values = {f.name: record[f.name] for f in dataclasses.fields(cls) if f.name in record}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})

    def record(self) -> dict:
        """The flags as a record by name, as argparse gives them (tuples as lists)."""
        return {f.name: list(v) if isinstance(v, tuple) else v
                for f in dataclasses.fields(self) for v in [getattr(self, f.name)]}

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def add_flags(group, config: type, title: Optional[str] = None,
              only: Optional[Sequence[str]] = None, defaults: Optional[dict] = None,
              required: Sequence[str] = (), helps: Optional[dict] = None,
              renamed: Optional[dict] = None) -> list:
    """Add to ``group`` (a parser or an argument group) the flags of ``config``'s fields in
    the ``--help`` group ``title`` (None: all), or those named in ``only``; ``defaults``
    replace declared defaults, the fields in ``required`` must be given, ``helps`` replace
    the help of a tool that reads a training flag for a purpose of its own (its name, type
    and default stay the field's), ``renamed`` (``{field: old names}``) keeps a tool's old
    spellings of a renamed flag for one release (:class:`RenamedFlag`). Returns the actions
    added."""
    hints, added = _hints(config), []
    for field in config.flag_fields():
        if (title is not None and config.group_of(field) != title) \
                or (only is not None and field.name not in only):
            continue
        meta, (kind, many) = field.metadata, _scalar(hints[field.name])
        names = config.spellings(field)
        default = (defaults or {}).get(field.name, field.default)
        options = dict(dest=field.name, help=(helps or {}).get(field.name, meta["help"]),
                       default=list(default) if isinstance(default, tuple) else default)
        if kind is bool:
            if meta["switch"] == "both":
                options["action"] = argparse.BooleanOptionalAction
            elif field.default is True:
                options["action"] = "store_false"
            else:
                options["action"] = "store_true"
        else:
            options["type"] = ({0: nonnegative_int, 1: positive_int}[meta["least"]]
                               if kind is int else None if kind is str else kind)
            for key in ("choices", "nargs", "metavar"):
                if meta[key] is not None:
                    options[key] = list(meta[key]) if key == "choices" else meta[key]
            if many and "nargs" not in options:
                raise TypeError(f"{config.__name__}.{field.name}: a tuple needs nargs")
        if field.name in required:
            options.update(required=True, default=None)
        old = tuple((renamed or {}).get(field.name, ()))
        if old and (meta["switch"] == "both" or field.name in required):
            raise TypeError(f"{config.__name__}.{field.name}: an old name of a flag that is "
                            f"required or has a --no- form is not kept")
        if old:
            options["help"] += (f" (formerly {', '.join(old)}, accepted until the next "
                                f"release)")
        added.append(group.add_argument(*names, **options))
        for name in old:
            group.add_argument(name, action=RenamedFlag, new=names[0], help=argparse.SUPPRESS,
                               default=argparse.SUPPRESS, **{
                                   k: v for k, v in added[-1].__dict__.items()
                                   if k in ("dest", "type", "choices", "nargs", "metavar",
                                            "const") and v is not None})
    return added


class RenamedFlag(argparse.Action):
    """The old spelling of a tool's renamed flag, kept for one release: it sets what the new
    one sets, and says on stderr that the name changed."""

    def __init__(self, option_strings, dest, new: str, **options):
        self.new = new
        super().__init__(option_strings, dest, **options)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"[fixedcode] {option_string} is now {self.new}; the old name goes in the next "
              f"release", file=sys.stderr)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


class ShowDefaults(argparse.HelpFormatter):
    """``--help`` shows each flag's default, where it says something: not None, not a
    switch's (False for ``--name``, True for ``--no-name``)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        hidden = action.default is None or action.default is False \
            or action.default == argparse.SUPPRESS \
            or action.const is False  # --no-name
        if not hidden and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text
