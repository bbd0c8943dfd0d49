"""``vlret plot goal-weights | adacl-margins``: GOAL's weight diagrams, AdaCL's margin curves."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import EXIT_OK, fail

NAME = "plot"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``plot`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(NAME, help="figures: GOAL weight diagrams, AdaCL margin curves")
    p.add_argument("what", choices=["goal-weights", "adacl-margins"])
    p.add_argument("--out", type=Path, required=True, help="output folder for PNG files")
    p.add_argument("--stats", type=Path, help="AdaCL stats JSON-lines log (adacl-margins)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Write the figures, print their paths. Everything that would make the command fail after
    drawing is refused first, in one line: a missing ``--stats``, an ``--out`` that cannot be
    a folder, a missing matplotlib (the ``plot`` extra, :class:`~vlret._extras.MissingExtra`
    printed by :func:`vlret.cli.main`, status 2)."""
    from .._files import check_output_dir
    from ..analysis._plotting import require_matplotlib

    if args.what == "adacl-margins" and args.stats is None:
        return fail(NAME, "adacl-margins needs --stats FILE (the AdaCL stats JSON-lines log)")
    try:
        check_output_dir(args.out, "--out")
    except ValueError as err:  # OutputPathError
        return fail(NAME, err)
    require_matplotlib(f"vlret {NAME}")
    if args.what == "goal-weights":
        from ..analysis.goal_plots import plot_goal_weights

        paths = plot_goal_weights(args.out)
    else:
        from ..analysis.adacl_plots import plot_adacl_margins

        # A missing file or one without AdaCL margins: one line naming the file, exit 2.
        try:
            paths = plot_adacl_margins(args.stats, args.out)
        except (FileNotFoundError, ValueError) as err:
            return fail(NAME, err)
    for p in paths:
        print(p)
    return EXIT_OK
