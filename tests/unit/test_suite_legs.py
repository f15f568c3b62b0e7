"""tests/conftest.py's ``one_leg`` mark: a test independent of megatron-core's release runs on
the leg of `make test` it names, is skipped on the other with the reason, and runs outside
`make test`."""

from __future__ import annotations

import pytest

import conftest


class Item:
    """What the hook reads of a collected test: its ``one_leg`` mark; what it adds."""

    def __init__(self, *args):
        self.nodeid = "tests/x.py::test_x"
        self.mark = pytest.mark.one_leg(*args).mark if args else None
        self.added = []

    def get_closest_marker(self, name):
        return self.mark if name == "one_leg" else None

    def add_marker(self, marker):
        self.added.append(marker.mark)


@pytest.mark.parametrize("leg,skipped", [("1", False), ("2", True), (None, False)])
def test_a_test_runs_on_its_leg_only(monkeypatch, leg, skipped):
    monkeypatch.setattr(conftest, "LEG", leg)
    marked, plain = Item(1, "no megatron-core in it"), Item()
    conftest.OneLeg().pytest_collection_modifyitems([marked, plain])
    assert not plain.added
    assert [m.name for m in marked.added] == (["skip"] if skipped else [])
    if skipped:
        assert marked.added[0].kwargs["reason"] == (
            "independent of megatron-core's release (no megatron-core in it): `make test` runs "
            "it on leg 1")


@pytest.mark.parametrize("args", [(3, "why"), (1, "")])
def test_a_mark_without_its_leg_or_reason_is_refused(args):
    with pytest.raises(pytest.UsageError, match="one_leg takes the leg"):
        conftest.OneLeg().pytest_collection_modifyitems([Item(*args)])


def test_make_test_names_each_leg():
    makefile = (conftest.REPO / "Makefile").read_text()
    assert "FIXEDCODE_LEG=1 FIXEDCODE_ENGINES=" in makefile
    assert "FIXEDCODE_LEG=2 $(VENV19)/bin/python $(PYTEST)" in makefile
