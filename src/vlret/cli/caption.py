"""``vlret caption MODEL_DIR --data DIR --split SPLIT --out FILE``: pseudo captions for a
split's images from a local Hugging Face captioner (BLIP, BLIP-2, GIT), written as a captions
file that ``data.train_captions`` reads (:mod:`vlret.captioning`, docs/captions.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import EXIT_OK, fail, positive_int

NAME = "caption"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``caption`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(
        NAME,
        help="caption a split's images with a local BLIP / BLIP-2 / GIT (pseudo captions)",
        description="Generate captions for the images of a split with a local Hugging Face "
        "captioner (nothing is downloaded) and write them as a captions file, one caption per "
        "line in the split's image order, with a FILE.json sidecar. Resumable: chunks go to "
        "FILE.partial/ and a rerun skips the chunks written. CoCa (AdaCL's fourth captioner) is "
        "not available: it needs open_clip, which cannot be installed here; caption with CoCa "
        "elsewhere and give data.train_captions a file in the same format (one caption per line "
        "in the split's image order, optional FILE.json sidecar; docs/captions.md, 'Captions "
        "made elsewhere').",
    )
    p.add_argument("model_dir", type=Path, help="the captioner's local directory")
    p.add_argument("--data", type=Path, required=True, help="the data folder (or Karpathy JSON)")
    p.add_argument("--split", required=True, help="train, dev, test or testall")
    p.add_argument("--out", type=Path, required=True, help="the captions file to write")
    p.add_argument(
        "--format",
        choices=["precomp", "karpathy"],
        help="the data format (default: karpathy when --data holds a dataset_*.json; precomp "
        "needs a synthetic world, whose pictures are rendered)",
    )
    p.add_argument(
        "--arch",
        default="auto",
        help="blip, blip2, git or auto (config.json's model_type; default); not coca: CoCa "
        "needs open_clip, which cannot be installed here",
    )
    p.add_argument("--batch-size", type=positive_int, default=16, help="images per batch (16)")
    p.add_argument("--beams", type=positive_int, default=1, help="beam width (1: greedy)")
    p.add_argument(
        "--max-new-tokens", type=positive_int, default=30, help="tokens per caption (30, AdaCL's)"
    )
    p.add_argument(
        "--per-image",
        type=positive_int,
        default=1,
        help="captions per image: the best beams (needs --beams >= N; default 1)",
    )
    p.add_argument("--prompt", help="text each caption continues (removed from the caption)")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="auto: bfloat16 on a CUDA device that supports it, float32 on the CPU",
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--chunk", type=positive_int, default=256, help="images per resumable chunk (256)"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing FILE and discard the chunks of an earlier run",
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Caption the split; print the file and a summary line."""
    from .._extras import MissingExtra
    from .._files import OutputPathError
    from ..captioning.generate import CaptionSettings, caption_split

    settings = CaptionSettings(
        batch_size=args.batch_size,
        beams=args.beams,
        max_new_tokens=args.max_new_tokens,
        prompt=args.prompt,
        per_image=args.per_image,
        dtype=args.dtype,
        device=args.device,
        chunk=args.chunk,
    )
    try:
        result = caption_split(
            args.model_dir,
            args.data,
            args.split,
            args.out,
            format=args.format,
            arch=args.arch,
            settings=settings,
            overwrite=args.overwrite,
            progress=not args.no_progress,
        )
    except (ValueError, FileNotFoundError, FileExistsError, OutputPathError) as err:
        return fail(NAME, err)
    except MissingExtra:
        raise
    print(result.path)
    print(
        f"{result.images} images of {args.split}: {result.generated} captioned now, "
        f"{result.skipped} by an earlier run; {result.empty} empty captions"
    )
    return EXIT_OK
