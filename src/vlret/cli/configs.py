"""``vlret configs [list | show NAME | copy NAME DIR]``: the configs shipped in the wheel."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ._common import EXIT_ERROR, EXIT_OK

NAME = "configs"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``configs`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(NAME, help="the shipped configs: list, show NAME, copy NAME DIR")
    p.add_argument("action", nargs="?", default="list", choices=["list", "show", "copy"])
    p.add_argument("name", nargs="?", help="a shipped config's name (see `vlret configs`)")
    p.add_argument("dir", nargs="?", type=Path, help="copy: the folder to write it to")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """List the configs (name and one-line description), print one, or copy one."""
    from ..configs import copy_config, describe, shipped_config, shipped_configs

    if args.action == "list":
        configs = shipped_configs()
        width = max(len(n) for n in configs)
        for name, path in configs.items():
            print(f"{name:<{width}}  {describe(path)}")
        print(
            f"\n{len(configs)} configs; `vlret train NAME` runs one, `vlret configs copy NAME DIR`"
        )
        return EXIT_OK
    # the action is part of the message's prefix here, and the errors below have none
    if args.name is None:
        print(f"vlret configs {args.action}: needs a config NAME", file=sys.stderr)
        return EXIT_ERROR
    if args.action == "show":
        shipped = shipped_config(args.name)
        if shipped is None:
            print(
                f"{args.name!r} is not a shipped config; `vlret configs` lists them",
                file=sys.stderr,
            )
            return EXIT_ERROR
        print(shipped.read_text(encoding="utf-8"), end="")
        return EXIT_OK
    try:
        print(copy_config(args.name, args.dir or Path(".")))
    except (KeyError, FileExistsError) as err:
        print(err.args[0] if isinstance(err, KeyError) else err, file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK
