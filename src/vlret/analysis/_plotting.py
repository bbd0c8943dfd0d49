"""What every figure of :mod:`vlret.analysis` needs first: matplotlib, the ``plot`` extra."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._extras import require
from .._files import atomic_write


def require_matplotlib(what: str = "plotting") -> None:
    """Refuse, before any work, when matplotlib (the ``plot`` extra) cannot be imported:
    :class:`~vlret._extras.MissingExtra` (an ``ImportError``), one line naming ``what`` needs
    it and the install command (the command line prints it and exits with status 2).

    Raises:
        MissingExtra: matplotlib is not installed.
    """
    require("matplotlib", what)


def new_figure(figsize: tuple[float, float]) -> Any:
    """A matplotlib ``Figure`` on the Agg canvas (no display, no global pyplot state)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Any, path: Path, *, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` (its folder made; the format from its suffix) atomically,
    under the output-path rule (:func:`vlret._files.atomic_write`: never through a link or
    over a device); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = path.suffix[1:].lower() or "png"
    atomic_write(path, lambda fh: fig.savefig(fh, dpi=dpi, format=fmt))
    return path


__all__ = ["new_figure", "require_matplotlib", "save_figure"]
