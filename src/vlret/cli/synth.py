"""``vlret synth PRESET --out DIR``: a synthetic world (:mod:`vlret.worlds`) written in
a real data format, with the commands that train a shipped config on it (its ``--set``
overrides), evaluate the run and classify its pictures: they run as printed from the folder
``vlret synth`` ran in, a relative ``--out`` included (:mod:`vlret.worlds.hint`).
``vlret synth persons --out DIR`` writes the person-search world
(:mod:`vlret.worlds.persons`, the CUHK-PEDES layout) and prints one summary line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ._common import EXIT_OK, fail

NAME = "synth"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``synth`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(NAME, help="write a synthetic retrieval world in a real data format")
    p.add_argument(
        "preset",
        help="a preset (docs/synthetic.md): tiny, small (the worlds of `vlret demo --preset "
        "tiny|small`), f30k-like, coco-like, video, video-experts; or persons, the "
        "person-search world in the CUHK-PEDES layout",
    )
    p.add_argument("--out", type=Path, required=True, help="output data folder")
    p.add_argument("--seed", type=int, help="world seed (default: the preset's)")
    p.add_argument(
        "--format", choices=["precomp", "karpathy", "msrvtt"], help="on-disk format to write"
    )
    p.add_argument(
        "--noise",
        metavar="MODE:RATE",
        help="noisy correspondence on the train split, e.g. permute_captions:0.2 "
        "(modes: permute_captions, permute_images, falsify)",
    )
    p.add_argument(
        "--random-bert",
        action="store_true",
        help="also write OUT/random-bert: a small randomly initialised BERT on the world's words "
        "(the text encoder of MMT, DIME, CHAN-BERT and USER for the synthetic runs; a "
        "video-experts or precomp world; needs transformers)",
    )
    p.add_argument(
        "--webdataset",
        action="store_true",
        help="also write the rendered pictures as webdataset shards in the img2dataset layout, "
        "OUT/webdataset/{train,dev,test}/00000.tar ... (needs webdataset and Pillow: the pixels "
        "extra)",
    )
    p.add_argument(
        "--imagefolder",
        action="store_true",
        help="also write classification sets, one folder per class: "
        "OUT/imagefolder/{category,colour}/{train,dev,test}/CLASS/*.jpg, labelled by the primary "
        "object's category or colour (needs Pillow)",
    )
    p.add_argument(
        "--shard-size",
        type=int,
        metavar="N",
        help="samples per shard with --webdataset (1..10000, default 1000)",
    )
    p.add_argument(
        "--shard-samples",
        choices=["pairs", "images"],
        help="the train shards' samples: one per (image, caption) pair (pairs, the default) or "
        "one per image with its first caption (images, img2dataset's one caption per image); "
        "dev and test shards hold one per image",
    )
    p.add_argument(
        "--pseudo-captions",
        action="store_true",
        help="also write OUT/pseudo/train_caps.txt (+ .json sidecar): one terse caption per "
        "training image from the world's own captioner, the stand-in for BLIP's pseudo "
        "captions (data.train_captions; docs/captions.md)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing world (or write into a non-empty folder); without it the "
        "folder is refused, unless it holds a world whose writing stopped half-way",
    )
    persons = p.add_argument_group("persons (vlret synth persons only)")
    for flag, meta, what in (
        ("--train-ids", "N", "train identities (default 200)"),
        ("--val-ids", "N", "val identities (default 50; 0 writes no val split)"),
        ("--test-ids", "N", "test identities (default 50)"),
        ("--images-per-id", "N", "pictures per identity (default 4)"),
        ("--captions-per-image", "N", "captions per picture (default 2, as CUHK-PEDES)"),
    ):
        persons.add_argument(flag, type=int, metavar=meta, help=what)
    persons.add_argument(
        "--image-size", metavar="HxW", help="picture height x width in pixels (default 96x32)"
    )
    persons.add_argument(
        "--image-format", choices=["jpg", "png"], help="picture files (default jpg, quality 90)"
    )
    persons.add_argument(
        "--domain",
        type=int,
        metavar="N",
        help="camera network and annotators (default 0): another domain's captions prefer "
        "other words and its pictures and features get its colour cast (domain generalisation: "
        "train on one domain, test on another)",
    )
    persons.add_argument(
        "--features",
        action="store_true",
        default=None,
        help="also write precomputed region features, features/{train,val,test}_ims.npy "
        "(data.features_dir; the same extractor for every world and domain)",
    )
    p.set_defaults(func=run)
    return p


#: The options of ``vlret synth persons`` (argparse dest, flag).
_PERSONS_OPTIONS = (
    ("train_ids", "--train-ids"),
    ("val_ids", "--val-ids"),
    ("test_ids", "--test-ids"),
    ("images_per_id", "--images-per-id"),
    ("captions_per_image", "--captions-per-image"),
    ("image_size", "--image-size"),
    ("image_format", "--image-format"),
    ("domain", "--domain"),
    ("features", "--features"),
)
#: The options of the retrieval presets, refused with ``persons`` (dest, flag, unset value).
_PRESET_OPTIONS = (
    ("format", "--format", None),
    ("noise", "--noise", None),
    ("random_bert", "--random-bert", False),
    ("webdataset", "--webdataset", False),
    ("imagefolder", "--imagefolder", False),
    ("shard_size", "--shard-size", None),
    ("shard_samples", "--shard-samples", None),
    ("pseudo_captions", "--pseudo-captions", False),
)


def _image_size(text: str) -> tuple[int, int]:
    height, sep, width = text.lower().partition("x")
    if not sep or not height.strip().isdigit() or not width.strip().isdigit():
        raise ValueError(f"--image-size {text}: expected HEIGHTxWIDTH in pixels, e.g. 96x32")
    return int(height), int(width)


def run_persons(args: argparse.Namespace) -> int:
    """``vlret synth persons``: write the world, print its summary line."""
    from .._extras import MissingExtra
    from ..worlds.persons import summary_line, write_persons

    for key, flag, unset in _PRESET_OPTIONS:
        if getattr(args, key) != unset:
            return fail(NAME, f"{flag}: not an option of the persons world")
    options: dict[str, Any] = {"overwrite": args.overwrite}
    if args.seed is not None:
        options["seed"] = args.seed
    sizes = {
        split: value
        for split, value in (
            ("train", args.train_ids),
            ("val", args.val_ids),
            ("test", args.test_ids),
        )
        if value is not None
    }
    try:
        if args.image_size is not None:
            options["height"], options["width"] = _image_size(args.image_size)
        for key in ("images_per_id", "captions_per_image", "image_format", "domain", "features"):
            if getattr(args, key) is not None:
                options[key] = getattr(args, key)
        world = write_persons(args.out, sizes=sizes, **options)
    except (ValueError, FileExistsError, MissingExtra) as err:
        return fail(NAME, err)
    print(summary_line(world, args.out))
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Write the world (everything it needs checked first), print its folder and the overrides
    to train on it."""
    if args.preset == "persons":
        return run_persons(args)
    for key, flag in _PERSONS_OPTIONS:
        if getattr(args, key) is not None:
            return fail(NAME, f"{flag}: an option of `vlret synth persons` only")
    try:
        from ..worlds import synth_main
    except ImportError as err:
        return fail(NAME, f"the synthetic world is not available: {err}")
    from .._extras import MissingExtra

    options: dict[str, Any] = {
        k: v
        for k, v in (("seed", args.seed), ("format", args.format), ("noise", args.noise))
        if v is not None
    }
    if args.overwrite:
        options["overwrite"] = True
    if args.random_bert:
        options["random_bert"] = True
    for key, flag in (("shard_size", "--shard-size"), ("shard_samples", "--shard-samples")):
        if getattr(args, key) is not None and not args.webdataset:
            return fail(NAME, f"{flag} {getattr(args, key)}: shards are written with --webdataset")
    for flag in ("webdataset", "imagefolder"):
        if getattr(args, flag):
            options[flag] = True
    for key in ("shard_size", "shard_samples"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    from ..data.formats import formats_where, get_format

    if args.pseudo_captions and not get_format(args.format or "precomp").captions_files:
        readers = " and ".join(formats_where(lambda f: f.captions_files))
        return fail(NAME, f"--pseudo-captions: captions files are read by the {readers} formats")
    if args.webdataset or args.imagefolder:  # a line per shard and per folder, on stderr
        options["progress"] = lambda line: print(line, file=sys.stderr, flush=True)
    try:
        path = synth_main(args.preset, args.out, **options)
    except (ValueError, FileExistsError, MissingExtra) as err:
        return fail(NAME, err)
    print(path)
    if args.pseudo_captions:  # the world's own captioner (vlret.worlds.terse)
        from ..worlds.terse import write_terse_captions

        print(write_terse_captions(path, split="train"))
    if args.random_bert:  # MMT's text side: a local BERT, trained from scratch on the world
        from ..worlds.hint import RANDOM_BERT_DIR

        print(Path(path) / RANDOM_BERT_DIR)
    from ..worlds import train_hint_lines

    for line in train_hint_lines(path):  # train, evaluate and classify, runnable as printed
        print(line)
    return EXIT_OK
