"""What every report of the project shares (study, probes, training and evaluation
reports): the cells of its Markdown tables, "—" for a missing value, and matplotlib set up
without a display, its figures written atomically (:mod:`megatron_ext.runtime.files`), each arm in
one colour in every figure (:func:`colours`), token axes in readable units.

An interval is a dict with ``mean`` and either ``half_width`` or ``low``/``high`` (None
when there is one seed), as :mod:`megatron_ext.study.stats` returns them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..runtime.files import publish, temporary_name

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
    """``+mean [+low, +high]`` of a difference's interval, or "—"; an interval conditional
    on one seed (``"conditional"``, :func:`megatron_ext.study.stats.crossed_interval`)
    says so, and a paired one over fewer seeds than its arms have names those dropped."""
    if interval is None:
        return MISSING
    if interval.get("low") is None:
        return f"{interval['mean']:+.{digits}f} (1 seed: no interval)"
    text = (f"{interval['mean']:+.{digits}f} [{interval['low']:+.{digits}f}, "
            f"{interval['high']:+.{digits}f}]")
    if interval.get("dropped"):  # a paired difference over fewer seeds than its arms have
        text += (f" (paired on seeds {', '.join(map(str, interval['seeds']))}; seeds "
                 f"{', '.join(map(str, interval['dropped']))} dropped: one arm lacks them)")
    return text + " (1 seed: conditional on this seed)" if interval.get("conditional") else text


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


# One colour per arm in every figure of a study and of the probes: the inputs by their
# interface names, any other name (a study's named arm, a probed model) in order after them.
ARM_COLOURS = {"learned": "C0", "binary": "C1", "gf2": "C2", "permuted": "C3", "random": "C4"}
OTHER_COLOURS = ("C5", "C6", "C7", "C8", "C9")


def colours(names: list[str]) -> dict:
    """``{name: matplotlib colour}``: :data:`ARM_COLOURS` for the interface names, the
    others in order (cycling)."""
    others = [n for n in names if n not in ARM_COLOURS]
    return {n: ARM_COLOURS.get(n) or OTHER_COLOURS[others.index(n) % len(OTHER_COLOURS)]
            for n in names}


def shown_path(path) -> str:
    """``path`` as a report shows it: relative to the working directory when it lies under it
    (the repository, usually), so a pasted report carries no machine's absolute paths."""
    resolved = Path(path).resolve()
    try:
        return str(resolved.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def readable_tokens(count: float) -> str:
    """``384``, ``12.3K``, ``1.5M``, ``100B``, ``2T``."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(count) >= size:
            return f"{count / size:.3g}{unit}"
    return f"{count:g}"


def tokens_axis(ax) -> None:
    """Label an x axis of token counts in readable units (:func:`readable_tokens`)."""
    from matplotlib.ticker import FuncFormatter
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: readable_tokens(x)))
    ax.set_xlabel("tokens seen")
