"""The compile-time line of ``--torch-compile-layers`` (train/compile_layers.CompileTime): the
seconds from dynamo's own account where torch keeps one, and where it does not (a torch
without ``calculate_time_spent``), a line saying the phase compiled and that its time
includes the compile, never a silent gap."""

from __future__ import annotations

import torch

from megatron_ext.train.compile_layers import CompileTime


def stats():
    """dynamo's counter of graphs, looked up at each use: ``counters.clear()`` (which an
    earlier test of the session may call) replaces the object."""
    return torch._dynamo.utils.counters["stats"]


def test_the_seconds_spent_compiling_are_logged_for_the_phase_that_compiled(monkeypatch,
                                                                             capsys):
    spent = {"total_wall_time": 1.0}
    monkeypatch.setattr(torch._dynamo.utils, "calculate_time_spent", lambda: dict(spent))
    timer = CompileTime()
    timer.report("iteration 1")
    assert capsys.readouterr().out == ""          # nothing compiled since
    spent["total_wall_time"] = 4.5
    timer.report("iteration 1")
    out = capsys.readouterr().out
    assert "torch.compile: 3.5 s of iteration 1 spent compiling" in out, out
    timer.report("iteration 2")
    assert capsys.readouterr().out == ""


def test_a_torch_without_the_account_says_the_phase_includes_the_compile(monkeypatch, capsys):
    monkeypatch.delattr(torch._dynamo.utils, "calculate_time_spent", raising=False)
    monkeypatch.setitem(stats(), "unique_graphs", stats()["unique_graphs"])
    timer = CompileTime()
    timer.report("iteration 1")
    assert capsys.readouterr().out == ""
    monkeypatch.setitem(stats(), "unique_graphs", stats()["unique_graphs"] + 2)
    timer.report("iteration 1")
    out = capsys.readouterr().out
    assert "iteration 1 compiled" in out and "time includes it" in out, out
