"""``vlret losses``: the registered losses, their class, paper, equation and defaults;
``vlret losses --params NAME``: one loss's parameters with their one-line descriptions."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import EXIT_OK, fail

NAME = "losses"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``losses`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(
        NAME,
        help="list the registered losses and their defaults",
        description="List every registered loss (name, class, paper; equation, defaults), or "
        "with --params NAME one loss's parameters, defaults and descriptions.",
    )
    p.add_argument(
        "--params",
        metavar="NAME",
        help="show this loss's parameters: name, default and the declaration's one-line "
        "description (vlret.losses.params)",
    )
    p.set_defaults(func=run)
    return p


def _header(name: str, cls: Any, parameters: str) -> None:
    """A loss's two listing lines: name, class and paper; equation and then ``parameters``."""
    print(f"{name:<18} {cls.__name__:<22} {getattr(cls, 'paper', '')}")
    print(f"{'':<18} {getattr(cls, 'equation', '')}{parameters}")


def run(args: argparse.Namespace) -> int:
    """Two lines per loss: name, class and paper; equation and default parameters. With
    ``--params NAME``: that loss's two lines, then one line per parameter."""
    from ..losses import available_losses, loss_class, loss_parameters

    if args.params is not None:
        try:
            cls = loss_class(args.params)
        except ValueError as err:
            return fail(NAME, f"--params: {err}")
        _header(args.params, cls, "")
        defaults, docs = cls.Params.defaults(), cls.Params.docs()
        width = max(len(k) for k in defaults)
        shown = {k: repr(v) for k, v in defaults.items()}
        value_width = max(len(v) for v in shown.values())
        for key, doc in docs.items():
            print(f"  {key:<{width}}  {shown[key]:<{value_width}}  {doc}")
        return EXIT_OK
    for name in available_losses():
        params = ", ".join(f"{k}={v!r}" for k, v in loss_parameters(name).items())
        _header(name, loss_class(name), f"; {params}")
    return EXIT_OK
