"""``vlret configs [list | show NAME | copy NAME DIR]``: the configs shipped in the wheel."""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

from ._common import EXIT_OK, fail

NAME = "configs"
#: Joins the words that a wrapped listing keeps on one line (textwrap breaks at whitespace).
_NBSP = "\u00a0"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``configs`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(NAME, help="the shipped configs: list, show NAME, copy NAME DIR")
    p.add_argument("action", nargs="?", default="list", choices=["list", "show", "copy"])
    p.add_argument("name", nargs="?", help="a shipped config's name (see `vlret configs`)")
    p.add_argument("dir", nargs="?", type=Path, help="copy: the folder to write it to")
    p.set_defaults(func=run)
    return p


def listing(width: int | None = None) -> list[str]:
    """The lines of ``vlret configs``: each shipped config's name and its whole description
    (:func:`vlret.configs.describe`), on one line, or wrapped to ``width`` columns with the
    continuation lines indented under the description."""
    from ..configs import describe, shipped_configs

    configs = shipped_configs()
    names = max(len(n) for n in configs)
    lines = []
    for name, path in configs.items():
        text = describe(path)
        if width is None:
            lines.append(f"{name:<{names}}  {text}")
            continue
        head, sep, tail = text.rpartition(" [")  # "[loss triplet; data precomp]" kept whole
        text = f"{head}{sep}{tail.replace(' ', _NBSP)}" if sep else text
        wrapped = textwrap.wrap(text, max(width - names - 2, 30), break_on_hyphens=False)
        wrapped = [part.replace(_NBSP, " ") for part in wrapped]
        lines.append(f"{name:<{names}}  {wrapped[0]}")
        lines += [f"{'':<{names}}  {part}" for part in wrapped[1:]]
    footer = (
        f"{len(configs)} configs; `vlret train NAME` trains one (a comparison config its "
        "[loss]), `vlret compare NAME` a comparison config's [compare.losses]; `vlret configs "
        "copy NAME DIR` writes one for editing; `vlret train NAME --check-config` checks one "
        "alone, `--check` with its data, writing nothing; every key: docs/reference/config.md"
    )
    return [*lines, "", *(textwrap.wrap(footer, width) if width else [footer])]


def run(args: argparse.Namespace) -> int:
    """List the configs (name and the first sentence of their description; wrapped to the
    terminal's width on a terminal, one line each otherwise), print one, or copy one."""
    from ..configs import copy_config, shipped_config

    if args.action == "list":
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
        print("\n".join(listing(width)))
        return EXIT_OK
    command = f"{NAME} {args.action}"
    if args.name is None:
        return fail(command, "needs a config NAME")
    if args.action == "show":
        shipped = shipped_config(args.name)
        if shipped is None:
            return fail(
                command, f"{args.name!r} is not a shipped config; `vlret configs` lists them"
            )
        print(shipped.read_text(encoding="utf-8"), end="")
        return EXIT_OK
    try:
        print(copy_config(args.name, args.dir or Path(".")))
    except (KeyError, FileExistsError, ValueError) as err:  # ValueError: OutputPathError
        return fail(command, err.args[0] if isinstance(err, KeyError) else err)
    return EXIT_OK
