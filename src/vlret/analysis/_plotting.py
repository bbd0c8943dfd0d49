"""What every figure of :mod:`vlret.analysis` needs: matplotlib (the ``plot`` extra), an Agg
figure, the colours and markers of its series, and legends that cover no data.

Legends: a figure whose legend has more than a couple of entries puts one legend for all its
panels outside the axes (:func:`legend_outside`, placed by matplotlib's constrained layout),
so no entry hides a curve or another legend. Epoch axes count from 0, as the console and
``metrics.jsonl`` do (:func:`integer_epochs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from .._extras import require
from .._files import atomic_write

#: Colours told apart at a glance: matplotlib's ``tab10``, whose closest two differ by a CIE76
#: colour difference of 27.7 (``tab20``, whose light and dark pairs differ by as little as
#: 16.6, is not used). More series than colours cycle them again with the next of
#: :data:`MARKERS`.
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
#: Filled markers, the second cue once :data:`PALETTE` is used up (``o`` for the first ten
#: series, ``s`` for the next ten, ...); every one can be drawn hollow too.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h")


def require_matplotlib(what: str = "plotting") -> None:
    """Refuse, before any work, when matplotlib (the ``plot`` extra) cannot be imported:
    :class:`~vlret._extras.MissingExtra` (an ``ImportError``), one line naming ``what`` needs
    it and the install command (the command line prints it and exits with status 2).

    Raises:
        MissingExtra: matplotlib is not installed.
    """
    require("matplotlib", what)


def new_figure(
    figsize: tuple[float, float], *, layout: Literal["constrained"] | None = None
) -> Any:
    """A matplotlib ``Figure`` on the Agg canvas (no display, no global pyplot state);
    ``layout="constrained"`` for a figure with a legend outside its axes
    (:func:`legend_outside`)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout=layout)
    FigureCanvasAgg(fig)
    return fig


def series_styles(n: int) -> list[tuple[str, str]]:
    """``(colour, marker)`` of ``n`` series or groups: :data:`PALETTE` in order, then again
    with the next of :data:`MARKERS`; the pairs are distinct up to 80 series."""
    size = len(PALETTE)
    return [(PALETTE[i % size], MARKERS[(i // size) % len(MARKERS)]) for i in range(n)]


def integer_epochs(ax: Any) -> None:
    """Ticks of ``ax``'s x axis on whole epochs only (the epochs of ``metrics.jsonl``, from 0)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def legend_outside(
    fig: Any,
    handles: Sequence[Any],
    labels: Sequence[str],
    *,
    where: str = "lower center",
    ncols: int | None = None,
) -> Any:
    """One legend for the whole figure, outside every axes: ``where`` is ``"lower center"``
    (under the panels) or ``"right upper"`` (beside them); matplotlib's constrained layout
    (``new_figure(..., layout="constrained")``) makes room for it, so it covers no data and no
    other legend. ``ncols`` defaults to as many columns as the figure's width holds (under the
    panels) or one column per 26 entries (beside them). Returns the legend."""
    if ncols is None:
        if where.startswith(("lower", "upper")):
            longest = max((len(s) for s in labels), default=1)
            # about 6 points per character at font size 8, plus the handle and the padding
            fits = int(fig.get_figwidth() * 72 / (5.2 * longest + 48))
            ncols = max(1, min(len(labels), fits))
        else:
            ncols = max(1, -(-len(labels) // 26))
    return fig.legend(list(handles), list(labels), loc=f"outside {where}", ncols=ncols, fontsize=8)


def save_figure(fig: Any, path: Path, *, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` (its folder made; the format from its suffix) atomically,
    under the output-path rule (:func:`vlret._files.atomic_write`: never through a link or
    over a device); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = path.suffix[1:].lower() or "png"
    atomic_write(path, lambda fh: fig.savefig(fh, dpi=dpi, format=fmt))
    return path


__all__ = [
    "MARKERS",
    "PALETTE",
    "integer_epochs",
    "legend_outside",
    "new_figure",
    "require_matplotlib",
    "save_figure",
    "series_styles",
]
