"""Command line: ``vlret train | eval | import-checkpoint | convert-experts | compare | sweep |
synth | demo | losses | protocols | configs | plot``.

One module per command, each with ``NAME``, ``add_parser(subparsers)`` (help, arguments,
``func=run``) and ``run(args) -> int`` (the exit status); what they share (exit statuses, the
one-line error, the ``train`` extra check) is :mod:`vlret.cli._common`. A command module
imports what it runs inside ``run``, so ``vlret --version | configs | losses | synth`` work with
the core install (torch and numpy).

The commands of :data:`PROGRESS_COMMANDS` draw progress bars on a terminal and take
``--no-progress``, added here, which switches every bar off for the command
(:mod:`vlret._progress`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from .. import __version__
from . import (
    caption,
    compare,
    configs,
    convert_experts,
    cvse_concepts,
    demo,
    export,
    import_checkpoint,
    losses,
    mine_negatives,
    plot,
    protocols,
    report,
    sweep,
    synth,
    train,
    zeroshot,
)
from . import eval as eval_command
from ._common import EXIT_ERROR, EXIT_INTERRUPTED

#: The command modules, in the order ``vlret --help`` lists them.
COMMANDS: tuple[ModuleType, ...] = (
    train,
    eval_command,
    zeroshot,
    mine_negatives,
    import_checkpoint,
    convert_experts,
    cvse_concepts,
    export,
    compare,
    sweep,
    synth,
    caption,
    demo,
    losses,
    protocols,
    configs,
    plot,
    report,
)

#: The commands that draw progress bars (on stderr, when it is a terminal): each takes
#: ``--no-progress`` (:func:`build_parser` adds it where the command's module does not).
PROGRESS_COMMANDS: tuple[str, ...] = (
    "train",
    "eval",
    "zeroshot",
    "mine-negatives",
    "caption",
    "report",
    "compare",
    "sweep",
    "demo",
)

NO_PROGRESS_HELP = "no progress bars (drawn on stderr only when it is a terminal)"


def version_line() -> str:
    """``vlret X (torch Y, device Z)``: what a bug report needs first. The device is the one
    ``train.device = "auto"`` picks (the first GPU when CUDA is available, else the CPU)."""
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        device = f"cuda ({name}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} visible)"
    else:
        build = "CPU-only build" if torch.version.cuda is None else "no GPU visible"
        device = f"cpu ({build})"
    return f"vlret {__version__} (torch {torch.__version__}, device {device})"


class _VersionAction(argparse.Action):
    """``--version``: the line is built when asked (it queries CUDA), not at parser build."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The ``vlret`` parser with every command of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="vlret",
        description="Vision-language retrieval losses, evaluation protocols and tools.",
    )
    parser.add_argument(
        "--version", action=_VersionAction, help="print vlret's, torch's version and the device"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(subparsers)
    for name in PROGRESS_COMMANDS:
        _add_no_progress(subparsers.choices[name])
    return parser


def _add_no_progress(parser: argparse.ArgumentParser) -> None:
    """``--no-progress`` on a command's parser, unless its module declares the option itself."""
    try:
        parser.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    except argparse.ArgumentError:  # already declared: argparse refuses a second one
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """The ``vlret`` command. What no command handles itself ends in one line on stderr, not a
    traceback: a missing optional dependency names the extra to install (``vlret train needs
    PyYAML: pip install 'vlret[train]'``, status 2); an output path the writer refuses (a
    device, FIFO, socket, folder or symbolic link: :class:`vlret._files.OutputPathError`,
    status 2); a write refused for room or permission
    (disk full, ``RLIMIT_FSIZE``, a read-only folder) names the file (status 2); Ctrl-C is
    ``interrupted`` with status 130. ``--no-progress`` switches every progress bar off while
    the command runs (:func:`vlret._progress.switched_off`); where no bar is drawn, Hugging
    Face's own are off too (:func:`vlret._progress.hugging_face_bars`)."""
    from .._extras import MissingExtra
    from .._files import OutputPathError, write_failure
    from .._progress import hugging_face_bars, shows, switched_off

    args = None
    try:
        args = build_parser().parse_args(argv)
        with switched_off(bool(getattr(args, "no_progress", False))):
            with hugging_face_bars(shows()):
                return args.func(args)
    except MissingExtra as err:
        print(err.for_command(getattr(args, "command", None)), file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"vlret {args.command if args else ''}: interrupted".strip(), file=sys.stderr)
        return EXIT_INTERRUPTED
    except OutputPathError as err:  # refused by the writer itself (vlret._files.atomic_write)
        print(f"vlret {args.command if args else ''}: {err}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as err:
        line = write_failure(err)
        if line is None:
            raise
        print(f"vlret {args.command if args else ''}: {line}", file=sys.stderr)
        return EXIT_ERROR


__all__ = ["COMMANDS", "PROGRESS_COMMANDS", "build_parser", "main", "version_line"]
