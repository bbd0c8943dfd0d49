"""``vlret protocols``: the registered evaluation protocols, one line each."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import EXIT_OK

NAME = "protocols"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``protocols`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(
        NAME, help="list the evaluation protocols (vlret eval --protocol NAME)"
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """One line per registered protocol: name, what it scores, the splits it accepts."""
    from ..eval import get_protocol, protocol_names

    for name in protocol_names():
        print(get_protocol(name).line())
    return EXIT_OK
