"""``vlret mine-negatives CKPT --data DIR --out FILE``: AOQ's offline candidates of a split (each
image's top-K captions, each caption's top-K images, own positives excluded) by a trained
model's scores, written as one ``.npz`` (:mod:`vlret.data.offline_negatives`); a thin layer over
:func:`vlret.run.mine.mine_checkpoint`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import EXIT_OK, fail, positive_int, require_train_extra

NAME = "mine-negatives"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``mine-negatives`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(
        NAME,
        help="mine AOQ's offline negatives of a split with a trained checkpoint",
        description="Score every image x caption pair of a split with a trained checkpoint, in "
        "blocks of captions, and write each image's top-K captions and each caption's top-K "
        "images (own positives excluded; equal scores: lower index first) to one .npz that "
        "AOQ's data loader draws from (docs/aoq.md).",
    )
    p.add_argument("checkpoint", type=Path, help="a checkpoint written by vlret train")
    p.add_argument(
        "--data", type=Path, required=True, help="the data folder (read as the checkpoint's)"
    )
    p.add_argument("--out", type=Path, required=True, help="the .npz file to write")
    p.add_argument("--split", default="train", help="the split to mine (default train)")
    p.add_argument(
        "--k",
        type=positive_int,
        default=300,
        help="candidates kept per image and per caption (default 300, AOQ's)",
    )
    p.add_argument("--batch-size", type=positive_int, default=256, help="encoding batch size")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default auto)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --out file (refused without this flag)",
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Mine, write the file and print its path and sizes."""
    require_train_extra(NAME)
    from .._files import check_output_file
    from ..run.mine import mine_checkpoint

    try:
        # before the (slow) scoring: the output-path rule (docs/training.md)
        check_output_file(args.out, "--out", "negatives.npz", overwrite=args.overwrite)
        mined = mine_checkpoint(
            args.checkpoint,
            data=args.data,
            split=args.split,
            k=args.k,
            batch_size=args.batch_size,
            device=args.device,
            progress=not args.no_progress,
        )
    except (FileNotFoundError, ValueError) as err:  # DataFormatError, OutputPathError included
        return fail(NAME, err)
    path = mined.save(args.out)
    print(
        f"{path}: {mined.num_images} images x {mined.num_captions} captions, top {mined.k} "
        f"each ({args.split}, {mined.header.get('scoring')})"
    )
    return EXIT_OK
