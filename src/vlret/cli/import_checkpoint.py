"""``vlret import-checkpoint PATH --arch scan|bfan|sgraf|dime --vocab VOCAB --out model.pt``: the
conversion is :func:`vlret.run.import_checkpoint.import_reference_checkpoint` (DIME's:
:func:`vlret.run.import_dime.import_dime_checkpoint`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import EXIT_OK, fail, require_train_extra

NAME = "import-checkpoint"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``import-checkpoint`` on the ``vlret`` sub-command parsers."""
    from ..run.import_checkpoint import ARCHS

    archs = (*ARCHS, "dime")

    p = subparsers.add_parser(
        NAME,
        help="convert a released SCAN / BFAN / SGRAF / DIME checkpoint into a vlret checkpoint",
        description=(
            "Read a model_best.pth.tar of kuanghuei/SCAN, CrossmodalGroup/BFAN, "
            "Paranioar/SGRAF or LgQu/DIME safely (weights_only, only argparse.Namespace "
            "allowed) and write a checkpoint that vlret eval reads."
        ),
    )
    p.add_argument("checkpoint", type=Path, metavar="PATH", help="the reference checkpoint")
    p.add_argument("--arch", required=True, choices=archs, help="the system that wrote it")
    p.add_argument(
        "--vocab",
        required=True,
        type=Path,
        metavar="VOCAB",
        help="its vocabulary: the JSON of the reference code (e.g. "
        "vocab/f30k_precomp_vocab.json); for dime, the BERT folder it was trained with",
    )
    p.add_argument("--out", required=True, type=Path, help="the vlret checkpoint to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Convert, print the written checkpoint's path."""
    require_train_extra(NAME)
    from .._files import check_output_file
    from ..run.import_checkpoint import import_reference_checkpoint

    try:
        # the output-path rule (docs/training.md), before the reference checkpoint is read
        check_output_file(args.out, "--out", "model.pt", overwrite=args.overwrite)
        if args.arch == "dime":  # its own layout and vocabulary (a BERT folder)
            from ..run.import_dime import import_dime_checkpoint

            out = import_dime_checkpoint(
                args.checkpoint, vocab=args.vocab, out=args.out, overwrite=args.overwrite
            )
        else:
            out = import_reference_checkpoint(
                args.checkpoint,
                arch=args.arch,
                vocab=args.vocab,
                out=args.out,
                overwrite=args.overwrite,
            )
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        return fail(NAME, err)
    print(out)
    return EXIT_OK
