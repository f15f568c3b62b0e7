"""An arm as a study, tools/submit.py, tools/plan.py and tools/param_report.py name it:
``[NAME:]INTERFACE[@--flag[=value]...]`` (``binary``, ``gf2@--code-seed=7``,
``r32:factorized@--input-table-rank=32``), parsed in one place (:func:`parse_arm`), and the
config of one arm over a base of flags (:meth:`Arm.config`), its dependent defaults filled
from the arm's own flags as a run's are."""

from __future__ import annotations

import dataclasses
import re

from ..codes.limits import ARMS
from ..runtime.errors import FlagError
from .arguments import build_parser
from .run_config import RunConfig

# An arm's name (and a study's factor and level names): it names a folder.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@=+-]*")


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str
    interface: str
    flags: tuple[str, ...] = ()  # the arm's own flags, as a command line gives them

    def training_flags(self) -> list[str]:
        return ["--input-interface", self.interface, *self.flags]

    def config(self, base: RunConfig) -> RunConfig:
        """The arm's config: its interface and model flags over ``base`` (the flags'
        config before :meth:`RunConfig.with_dependent_defaults`: a value ``base`` has filled,
        such as its ``--ffn-hidden-size``, stays as if given), then the defaults that depend
        on other flags (``--ffn-hidden-size`` of the arm's ``--hidden-size``); refused as
        training refuses them."""
        parser = build_parser("one arm")
        parser.set_defaults(**base.record())  # what the arm does not name stays as it is
        try:
            one = RunConfig.from_flags(parser.parse_args(self.training_flags()))
        except SystemExit:
            raise FlagError(f"arm {self.name!r}: {' '.join(self.training_flags())} are not "
                            f"model flags (the error above)") from None
        one = one.with_dependent_defaults()
        one.model.validate_input()
        return one


def check_name(name: str, what: str, error: type = FlagError) -> None:
    """Refuse a name (of an arm, a study's factor or level) that cannot name a folder."""
    if not NAME.fullmatch(name):
        raise error(f"{what}: the name {name!r} must be letters, digits and _.@=+- (it "
                    f"names a folder)")


def parse_arm(spec: str, interfaces: tuple[str, ...] = ARMS) -> Arm:
    """An arm from ``[NAME:]INTERFACE[@--flag[=value]...]`` (its name, default the whole
    spec, names its folder); errors name the spec."""
    name, sep, body = spec.partition(":")
    if not sep:
        name, body = spec, spec
    interface, *parts = body.split("@")
    if interface not in interfaces:
        raise FlagError(f"arm {spec!r}: unknown input interface {interface!r} "
                        f"(choose from {', '.join(interfaces)})")
    check_name(name, f"arm {spec!r}")
    flags = []
    for part in parts:
        flag, eq, value = part.partition("=")
        if not flag.startswith("--"):
            raise FlagError(f"arm {spec!r}: {part!r} is not a --flag[=value]")
        flags += [flag, value] if eq else [flag]
    return Arm(name, interface, tuple(flags))
