"""What every figure of :mod:`vlret.analysis` needs first: matplotlib, the ``plot`` extra."""

from __future__ import annotations

from .._extras import require


def require_matplotlib(what: str = "plotting") -> None:
    """Refuse, before any work, when matplotlib (the ``plot`` extra) cannot be imported:
    :class:`~vlret._extras.MissingExtra` (an ``ImportError``), one line naming ``what`` needs
    it and the install command (the command line prints it and exits with status 2).

    Raises:
        MissingExtra: matplotlib is not installed.
    """
    require("matplotlib", what)


__all__ = ["require_matplotlib"]
