"""What every report of the project shares (study, probes, training and evaluation
reports): the cells of its Markdown tables, "—" for a missing value, and matplotlib set up
without a display, its figures written atomically (:mod:`megatron_ext.files`).

An interval is a dict with ``mean`` and either ``half_width`` or ``low``/``high`` (None
when there is one seed), as :mod:`megatron_ext.study.stats` returns them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .files import publish, temporary_name

MISSING = "—"


def number(value: Optional[float], spec: str = ".3f") -> str:
    """``value`` in the format ``spec``, or "—"."""
    return MISSING if value is None else format(value, spec)


def mean_interval(interval: Optional[dict], digits: int = 4) -> str:
    """``mean ± half width`` of an interval, or "—"."""
    if interval is None:
        return MISSING
    if interval["half_width"] is None:
        return f"{interval['mean']:.{digits}f} (1 seed: no interval)"
    return f"{interval['mean']:.{digits}f} ± {interval['half_width']:.{digits}f}"


def signed_range(interval: Optional[dict], digits: int = 4) -> str:
    """``+mean [+low, +high]`` of a difference's interval, or "—"."""
    if interval is None:
        return MISSING
    if interval.get("low") is None:
        return f"{interval['mean']:+.{digits}f} (1 seed: no interval)"
    return (f"{interval['mean']:+.{digits}f} [{interval['low']:+.{digits}f}, "
            f"{interval['high']:+.{digits}f}]")


def pyplot():
    """``matplotlib.pyplot`` on the headless Agg backend (no display on a cluster node)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path) -> None:
    """Lay out ``fig``, write it to ``path`` atomically (its suffix names the format) and
    close it."""
    plt = pyplot()
    fig.tight_layout()
    tmp = temporary_name(path)
    try:
        fig.savefig(tmp, format=Path(path).suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    publish(tmp, path)
