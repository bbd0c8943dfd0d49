"""``vlret convert-experts SRC --out DIR``: the CE / MMT released expert features in vlret's
multi-expert layout (:func:`vlret.data.formats.experts.features.convert_experts`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import EXIT_OK, fail

NAME = "convert-experts"
#: how the conversion's errors name what to change: this command's options
FLAGS = {
    "experts": "--experts NAME=PATH,... (a pickle under SRC, or a key of its per-video dicts)",
    "experts_paths": "--experts NAME=PATH,... (PATH relative to SRC)",
    "overwrite": "--overwrite",
    "out": "--out",
}


def _expert_list(text: str) -> list[str] | dict[str, str]:
    """``NAME,...`` (experts by file stem or key) or ``NAME=PATH,...`` (named explicitly)."""
    items = [n.strip() for n in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"expected NAME,NAME,... with no empty name, got {text!r}")
    pairs = [item.partition("=") for item in items]
    if not any(sep for _, sep, _ in pairs):
        return items
    if not all(sep and name.strip() and path.strip() for name, sep, path in pairs):
        raise argparse.ArgumentTypeError(
            f"expected NAME,... or NAME=PATH,... (every entry with a name and a path), got {text!r}"
        )
    return {name.strip(): path.strip() for name, _, path in pairs}


def _max_frames(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    try:
        frames = int(value)
    except ValueError:
        frames = 0
    if not sep or not name.strip() or frames < 1:
        raise argparse.ArgumentTypeError(f"expected EXPERT=FRAMES (a positive int), got {text!r}")
    return name.strip(), frames


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``convert-experts`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(
        NAME,
        help="convert the CE / MMT released expert feature pickles into vlret's layout",
        description=(
            "Read the expert features released with Collaborative Experts or the Multi-modal "
            "Transformer (pickled dicts of numpy arrays: a folder with one pickle per expert, or "
            "one pickle {video_id: {expert: array}}) with a restricted unpickler (numpy arrays "
            "and builtin containers only) and write the memory-mapped multi-expert layout that "
            "[data] experts reads (docs: vlret.data.formats.experts.features)."
        ),
    )
    p.add_argument("src", type=Path, metavar="SRC", help="the folder of pickles, or one pickle")
    p.add_argument("--out", required=True, type=Path, help="the feature folder to write")
    p.add_argument(
        "--experts",
        type=_expert_list,
        metavar="NAME,...|NAME=PATH,...",
        help=(
            "only these experts (file stems in SRC, or keys of its per-video dicts; default: "
            "every one found); NAME=PATH names each: PATH a pickle relative to the SRC folder, "
            "or a key of the per-video dicts of the SRC pickle"
        ),
    )
    p.add_argument(
        "--max-frames",
        type=_max_frames,
        action="append",
        metavar="EXPERT=FRAMES",
        help="keep at most FRAMES frames of a temporal expert (repeatable)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace existing expert features")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Convert, print the written folder."""
    from .._files import check_output_dir
    from ..data.checks import DataFormatError
    from ..data.formats.experts.features import convert_experts

    try:
        check_output_dir(args.out, "--out")
        out = convert_experts(
            args.src,
            args.out,
            experts=args.experts,
            max_frames=dict(args.max_frames) if args.max_frames else None,
            overwrite=args.overwrite,
            flags=FLAGS,
        )
    except (FileNotFoundError, FileExistsError, DataFormatError, ValueError) as err:
        return fail(NAME, err)
    print(out)
    return EXIT_OK
