"""``vlret sweep CONFIG --param NAME=V1,V2,...``: a grid over loss parameters, rsum against each
parameter (Unified Fig. 5)."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import require_train_extra
from .compare import add_run_options, run_report

NAME = "sweep"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``sweep`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(
        NAME,
        help="grid over loss parameters; rsum against each parameter (Unified Fig. 5)",
        description="Train the product of the --param values (each seed), test each, and write "
        "the comparison report plus plots/sweep_<param>.png.",
    )
    add_run_options(p)
    p.add_argument(
        "--param",
        action="append",
        required=True,
        metavar="NAME=V1,V2,...",
        help="loss parameter and its values (repeatable; the grid is their product)",
    )
    p.add_argument("--loss", help="loss or [compare.losses] label (default: the config's loss)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Train and test the grid, print the report."""
    require_train_extra(NAME)
    from ..analysis.compare import sweep

    return run_report(NAME, sweep, args, params=args.param, loss=args.loss)
