"""The data commands: ``vlret convert-experts SRC --out DIR`` (the CE / MMT released expert
features in vlret's multi-expert layout, :func:`vlret.data.experts.convert_experts`) and
``vlret synth PRESET --out DIR`` (a synthetic world, :mod:`vlret.data.synthetic`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def _expert_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected NAME,NAME,... with no empty name, got {text!r}")
    return names


def _max_frames(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    try:
        frames = int(value)
    except ValueError:
        frames = 0
    if not sep or not name.strip() or frames < 1:
        raise argparse.ArgumentTypeError(f"expected EXPERT=FRAMES (a positive int), got {text!r}")
    return name.strip(), frames


def add_convert_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``convert-experts`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(
        "convert-experts",
        help="convert the CE / MMT released expert feature pickles into vlret's layout",
        description=(
            "Read the expert features released with Collaborative Experts or the Multi-modal "
            "Transformer (pickled dicts of numpy arrays: a folder with one pickle per expert, or "
            "one pickle {video_id: {expert: array}}) with a restricted unpickler (numpy arrays "
            "and builtin containers only) and write the memory-mapped multi-expert layout that "
            "[data] experts reads (docs: vlret.data.experts)."
        ),
    )
    p.add_argument("src", type=Path, metavar="SRC", help="the folder of pickles, or one pickle")
    p.add_argument("--out", required=True, type=Path, help="the feature folder to write")
    p.add_argument(
        "--experts",
        type=_expert_list,
        metavar="NAME,...",
        help="only these experts (file stems in SRC; default: every one found)",
    )
    p.add_argument(
        "--max-frames",
        type=_max_frames,
        action="append",
        metavar="EXPERT=FRAMES",
        help="keep at most FRAMES frames of a temporal expert (repeatable)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace existing expert features")
    p.set_defaults(func=_cmd_convert)
    return p


def _cmd_convert(args: argparse.Namespace) -> int:
    from .checks import DataFormatError
    from .experts import convert_experts

    try:
        out = convert_experts(
            args.src,
            args.out,
            experts=args.experts,
            max_frames=dict(args.max_frames) if args.max_frames else None,
            overwrite=args.overwrite,
        )
    except (FileNotFoundError, FileExistsError, DataFormatError, ValueError) as err:
        print(f"vlret convert-experts: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


def add_synth_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``synth`` on the ``vlret`` sub-command parsers."""
    syn = subparsers.add_parser(
        "synth", help="write a synthetic retrieval world in a real data format"
    )
    syn.add_argument(
        "preset",
        help="a preset (docs/synthetic.md): tiny, small (the worlds of `vlret demo --preset "
        "tiny|small`), f30k-like, coco-like, video, video-experts",
    )
    syn.add_argument("--out", type=Path, required=True, help="output data folder")
    syn.add_argument("--seed", type=int, help="world seed (default: the preset's)")
    syn.add_argument(
        "--format", choices=["precomp", "karpathy", "msrvtt"], help="on-disk format to write"
    )
    syn.add_argument(
        "--noise",
        metavar="MODE:RATE",
        help="noisy correspondence on the train split, e.g. permute_captions:0.2 "
        "(modes: permute_captions, permute_images, falsify)",
    )
    syn.add_argument(
        "--random-bert",
        action="store_true",
        help="also write OUT/random-bert: a small randomly initialised BERT on the world's words "
        "(MMT's text encoder for the synthetic runs; needs transformers)",
    )
    syn.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing world (or write into a non-empty folder); without it the "
        "folder is refused",
    )
    syn.set_defaults(func=_cmd_synth)
    return syn


def _cmd_synth(args: argparse.Namespace) -> int:
    try:
        from .synthetic import synth_main
    except ImportError as err:
        print(f"vlret synth: the synthetic world is not available: {err}", file=sys.stderr)
        return 2
    options = {
        k: v
        for k, v in (("seed", args.seed), ("format", args.format), ("noise", args.noise))
        if v is not None
    }
    if args.overwrite:
        options["overwrite"] = True
    try:
        path = synth_main(args.preset, args.out, **options)
    except (ValueError, FileExistsError) as err:
        print(f"vlret synth: {err}", file=sys.stderr)
        return 2
    print(path)
    if args.random_bert:  # MMT's text side: a local BERT, trained from scratch on the world
        from .msrvtt import DATA_JSON, read_msrvtt_json
        from .synthetic.bert import write_random_bert

        if not (Path(path) / DATA_JSON).is_file():
            print("vlret synth: --random-bert needs an MSR-VTT-format world", file=sys.stderr)
            return 2
        captions = read_msrvtt_json(Path(path) / DATA_JSON).captions.values()
        print(write_random_bert(Path(path) / "random-bert", (c for cs in captions for c in cs)))
    from .synthetic import train_hint_lines

    for line in train_hint_lines(path):  # the --set overrides a shipped config needs
        print(line)
    return 0


__all__ = ["add_convert_parser", "add_synth_parser"]
