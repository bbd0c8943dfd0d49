"""``vlret zeroshot --model PATH --dataset NAME --data-root DIR``: zero-shot classification of
a class-labelled image set by a vlret checkpoint or a local Hugging Face CLIP, as
CLIP_benchmark does it (:mod:`vlret.eval.zeroshot`); prints a table and, with ``--json``,
writes CLIP_benchmark's record."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

from ._common import DEFAULT_PREPROCESSINGS, EXIT_OK, fail, positive_int, require_train_extra

NAME = "zeroshot"

#: What kind of model ``--model`` is, per kind (the JSON record's ``vlret.model_source``; the
#: same as :data:`vlret.run.tasks.MODEL_SOURCES`, written out: the parsers import no torch).
MODEL_SOURCES = {"checkpoint": "vlret-checkpoint", "hf": "hf-clip"}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``zeroshot`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(
        NAME,
        help="zero-shot classification (CLIP_benchmark's protocol) of an image set",
        description="Each class's prompts (every template filled with the class name) are "
        "encoded and normalised, averaged and renormalised; each image is classified by 100 x "
        "its cosine with each class. Reports acc1, acc5 and mean per-class recall.",
    )
    p.add_argument(
        "--model",
        type=Path,
        required=True,
        metavar="PATH",
        help="a checkpoint written by vlret train (a model that reads pixels), or a local "
        "Hugging Face CLIP directory (config.json with model_type clip)",
    )
    p.add_argument(
        "--dataset",
        required=True,
        metavar="NAME",
        help="imagenet1k, cifar10, cifar100, caltech101, food101, flowers102, pets, "
        "fgvc_aircraft (each in its released layout) or imagefolder (one folder per class)",
    )
    p.add_argument(
        "--data-root", type=Path, required=True, metavar="DIR", help="the data set's folder"
    )
    p.add_argument("--split", default="test", help="the split to classify (default test)")
    p.add_argument(
        "--templates",
        metavar="openai|NAME|FILE",
        help="prompt templates: openai (OpenAI's 80 ImageNet templates), a data set's NAME, or "
        "a FILE with one template per line using {c} (default: the data set's own list)",
    )
    p.add_argument(
        "--classnames",
        type=Path,
        metavar="FILE",
        help="class names, one per line in label order (default: the data set's own)",
    )
    p.add_argument("--batch-size", type=positive_int, default=64, help="images (prompts) per batch")
    p.add_argument(
        "--num-workers", type=int, default=0, help="DataLoader workers decoding the images"
    )
    p.add_argument(
        "--json",
        type=Path,
        metavar="OUT",
        help="also write CLIP_benchmark's JSON record: dataset (imagefolder/<folder> for an "
        "image folder), model (the architecture, e.g. ViT-B-32), pretrained (--model's path)",
    )
    p.add_argument(
        "--default-preprocessing",
        choices=DEFAULT_PREPROCESSINGS,
        help="a Hugging Face CLIP directory with no processor_config.json or "
        "preprocessor_config.json: preprocess images as OpenAI's CLIP does (bicubic resize of "
        "the shorter side, centre crop, CLIP's mean and std) instead of refusing it",
    )
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default auto)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (stderr)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --json file (refused without this flag)",
    )
    p.set_defaults(func=run)
    return p


def load_zeroshot_model(
    path: str | Path, *, device: Any = "cpu", default_preprocessing: str | None = None
) -> tuple[Any, Any, str]:
    """``(model, tokenizer, source)`` of ``--model`` (source: :data:`MODEL_SOURCES`): a
    local Hugging Face CLIP directory (:func:`vlret.eval.zeroshot.load_hf_clip`, with
    ``default_preprocessing`` for a folder without processor file) or a ``vlret train``
    checkpoint (:func:`vlret.run.tasks.load_pixel_checkpoint`), which must read pixels.

    Raises:
        FileNotFoundError: ``path`` does not exist, or a CLIP directory lacks a file it needs.
        ValueError: Not a CLIP directory nor a readable checkpoint, a checkpoint whose model
            encodes precomputed features, or ``default_preprocessing`` with a checkpoint.
    """
    from ..eval.zeroshot import load_hf_clip
    from ..run.tasks import load_pixel_checkpoint

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"{path}: missing; expected a vlret checkpoint (.pt) or a local Hugging Face CLIP "
            "directory"
        )
    if path.is_dir():
        model, tokenizer = load_hf_clip(
            path, device=device, default_preprocessing=default_preprocessing
        )
        return model, tokenizer, MODEL_SOURCES["hf"]
    if default_preprocessing is not None:
        raise ValueError(
            f"--default-preprocessing: applies to a Hugging Face CLIP directory; {path} is a "
            "checkpoint, which keeps its model's preprocessing"
        )
    model, encoder, _ = load_pixel_checkpoint(path, device=device)
    return model, encoder, MODEL_SOURCES["checkpoint"]


def _classification() -> Any:
    """:mod:`vlret.data.classification` (the data sets, class names and templates), imported
    when the command runs."""
    return importlib.import_module("vlret.data.classification")


def run(args: argparse.Namespace) -> int:
    """Classify, print the table and (``--json``) write CLIP_benchmark's record."""
    if not args.no_progress:
        require_train_extra(NAME)
    from .._files import check_json_path, write_metrics_json
    from ..eval.clip_benchmark import architecture_name
    from ..eval.zeroshot import evaluate_zeroshot
    from ..run.devices import resolve_device

    try:
        if args.json is not None:  # before the (slow) evaluation, not after the table
            check_json_path(args.json, overwrite=args.overwrite)
        if args.num_workers < 0:
            raise ValueError(f"--num-workers must be >= 0, got {args.num_workers}")
        try:
            device = resolve_device(args.device)
        except ValueError as err:
            raise ValueError(f"--device: {err}") from None
        sets = _classification()
        # the file itself: load_classification reads it and checks its count of names
        data = sets.load_classification(
            args.dataset, args.data_root, split=args.split, classnames=args.classnames
        )
        if args.templates is not None:
            templates = sets.load_templates(args.templates)
        else:
            templates = sets.default_templates(args.dataset)
        model, tokenizer, source = load_zeroshot_model(
            args.model, device=device, default_preprocessing=args.default_preprocessing
        )
        result = evaluate_zeroshot(
            model,
            data,
            templates,
            tokenizer=tokenizer,
            batch_size=args.batch_size,
            device=device,
            num_workers=args.num_workers,
            progress=not args.no_progress,
        )
    except (FileNotFoundError, ValueError) as err:  # DataFormatError, ConfigError included
        return fail(NAME, err)
    print(result.table())
    if args.json is not None:
        record = result.record(
            model=architecture_name(model), pretrained=str(args.model), source=source
        )
        print(write_metrics_json(record, args.json, overwrite=args.overwrite))
    return EXIT_OK
