"""``vlret losses``: the registered losses, their class, paper, equation and defaults."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import EXIT_OK

NAME = "losses"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``losses`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(NAME, help="list the registered losses and their defaults")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Two lines per loss: name, class and paper; equation and default parameters."""
    from ..losses import available_losses, loss_class, loss_parameters

    for name in available_losses():
        cls = loss_class(name)
        params = ", ".join(f"{k}={v!r}" for k, v in loss_parameters(name).items())
        print(f"{name:<18} {cls.__name__:<22} {getattr(cls, 'paper', '')}")
        print(f"{'':<18} {getattr(cls, 'equation', '')}; {params}")
    return EXIT_OK
