"""``vlret eval RUN_OR_CKPT [...] --protocol NAME [--data DIR] [--split SPLIT] [--check]``: a
thin layer over :func:`vlret.run.evaluate.prepare_evaluation` (the request checked, the
members loaded, the split opened, the scorer built) and :func:`vlret.eval.evaluate` (the
metrics, their table and JSON record). A run folder is evaluated from its ``best.pt`` (else
``last.pt``), on the data folder of its config and the protocol's split of that data unless
``--data`` / ``--split`` say otherwise; ``--check`` loads and reads everything, prints what
would be evaluated and writes nothing."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import DEFAULT_PREPROCESSINGS, EXIT_OK, fail, positive_int, require_train_extra

NAME = "eval"

#: The re-scoring parameters and the flag that sets each (named in a misplaced flag's error).
RESCORE_FLAGS = {
    "temperature": "--dsl-temperature",
    "beta": "--qb-beta",
    "k": "--qb-k",
    "dynamic": "--qb-static",
    "bank_size": "--bank-size",
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``eval`` on the ``vlret`` sub-command parsers."""
    from ..eval import eval_splits, get_protocol, protocol_names
    from ..eval.clip_benchmark import JSON_FORMATS

    # one help entry per set of accepted splits: "coco1k/coco5k: precomp testall/dev, ...; ..."
    by_splits: dict[str, list[str]] = {}
    for name in protocol_names():
        by_splits.setdefault(get_protocol(name).accepted(sep=", "), []).append(name)

    p = subparsers.add_parser(
        NAME,
        help="evaluate a checkpoint (or an ensemble) under a paper protocol",
        description="Exact protocol by default. Several checkpoints: an ensemble, the mean of "
        "their score matrices. --shortlist K: approximate, for pair-scoring (cross-attention) "
        "models: each query's top-K candidates by a two-tower score re-ranked by exact scores.",
    )
    p.add_argument(
        "checkpoint",
        type=Path,
        nargs="*",
        metavar="RUN_OR_CKPT",
        help="run folder(s) of vlret train (their best.pt, else last.pt) or checkpoint(s) "
        "(also of vlret import-checkpoint); several: an ensemble averaging their score matrices",
    )
    p.add_argument(
        "--model-dir",
        type=Path,
        metavar="DIR",
        help="instead of checkpoints: a local pretrained Hugging Face CLIP directory "
        "(CLIPModel and CLIPProcessor save_pretrained output: weights, image processor, "
        "tokenizer) evaluated zero-shot with its own projections and cosine scores, on "
        "Karpathy JSON + image data",
    )
    p.add_argument(
        "--default-preprocessing",
        choices=DEFAULT_PREPROCESSINGS,
        help="with --model-dir, a folder holding no processor_config.json or "
        "preprocessor_config.json: preprocess images as OpenAI's CLIP does (bicubic resize of "
        "the shorter side, centre crop, CLIP's mean and std) instead of refusing it",
    )
    p.add_argument(
        "--data",
        type=Path,
        help="data folder of the test split (Karpathy: dataset_*.json and images/ in it; a run "
        "trained on shards or a CSV is evaluated on Karpathy data); default: the first "
        "checkpoint's data.root (required with --model-dir)",
    )
    p.add_argument(
        "--split",
        choices=eval_splits(),
        help="; ".join(f"{'/'.join(names)}: {splits}" for splits, names in by_splits.items())
        + " (dev, val: model-selection checks; papers report the test splits); default: the "
        "first of the protocol's splits for the data (its paper's test split)",
    )
    p.add_argument(
        "--protocol",
        required=True,
        choices=protocol_names(),
        help="; ".join(f"{n}: {get_protocol(n).summary}" for n in protocol_names())
        + " (vlret protocols lists them)",
    )
    p.add_argument("--json", type=Path, help="also write the metrics as JSON")
    p.add_argument(
        "--json-format",
        choices=JSON_FORMATS,
        default="vlret",
        help="--json's record: vlret (default; every metric, folds, sizes) or clip_benchmark "
        "(CLIP_benchmark's zeroshot_retrieval record, image_retrieval_recall@K and "
        "text_retrieval_recall@K for K = 1, 5, 10, which its build step merges; "
        "vlret.eval.clip_benchmark)",
    )
    p.add_argument("--batch-size", type=int, default=256, help="encoding batch size")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default auto)")
    p.add_argument(
        "--shortlist",
        type=int,
        metavar="K",
        help="APPROXIMATE (cross-attention models): re-rank each query's top K candidates of a "
        "two-tower score with exact scores, the rest ranked below; reports the fraction of "
        "ground truths shortlisted (default: the exact protocol)",
    )
    p.add_argument(
        "--shortlist-from",
        type=Path,
        metavar="CKPT",
        help="with --shortlist: a two-tower checkpoint whose cosines pick the shortlists "
        "(default: the cosine of the model's own mean-pooled region and word features)",
    )
    p.add_argument(
        "--rescore",
        choices=("dsl", "qbnorm"),
        help="NON-STANDARD re-scoring, labelled so in the table and JSON (docs/rescoring.md): "
        "dsl = dual softmax over the test matrix (uses every test query at once); qbnorm = "
        "QB-Norm with a querybank of training captions (text->image only)",
    )
    p.add_argument(
        "--dsl-temperature", type=float, metavar="T", help="dsl: temperature (default 0.01)"
    )
    p.add_argument("--qb-beta", type=float, metavar="BETA", help="qbnorm: beta (default 20)")
    p.add_argument(
        "--qb-k", type=int, metavar="K", help="qbnorm: top-K images of a bank caption (default 1)"
    )
    p.add_argument(
        "--qb-static", action="store_true", help="qbnorm: normalise every query (not dynamic)"
    )
    p.add_argument(
        "--bank-size", type=int, metavar="N", help="qbnorm: train captions in the bank (5000)"
    )
    p.add_argument(
        "--captions-per-image",
        type=positive_int,
        metavar="N",
        help="precomp / Karpathy data: captions per test image, replacing the checkpoint's "
        "data.captions_per_image (a model trained on 1 caption per image, tested on 5)",
    )
    p.add_argument(
        "--captions-per-video",
        type=positive_int,
        metavar="N",
        help="MSR-VTT data: captions per test video, replacing data.captions_per_video",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (stderr)")
    p.add_argument(
        "--check",
        action="store_true",
        help="check everything (arguments, checkpoints or --model-dir, data, split, protocol), "
        "print what would be evaluated and the split's size, exit without encoding or writing",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --json file (refused without this flag)",
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Evaluate, print the protocol's table and (``--json``) write its record."""
    require_train_extra(NAME)
    from .._files import check_json_path, write_metrics_json
    from ..eval import evaluate
    from ..eval.clip_benchmark import check_retrieval_request, retrieval_record
    from ..metrics.rescore import RescoreParameterError, make_rescoring
    from ..run.evaluate import prepare_evaluation

    if args.model_dir is not None and args.checkpoint:
        return fail(
            NAME,
            "--model-dir evaluates a local CLIP without a checkpoint; give "
            f"checkpoints or --model-dir, not both (got {args.checkpoint[0]})",
        )
    if args.model_dir is None and not args.checkpoint:
        return fail(NAME, "give a checkpoint (or several), or --model-dir DIR (a local CLIP)")
    if args.default_preprocessing is not None and args.model_dir is None:
        return fail(
            NAME,
            "--default-preprocessing applies to --model-dir (a Hugging Face CLIP directory); a "
            "checkpoint keeps its model's preprocessing",
        )
    try:
        if args.json is not None:  # before the (slow) evaluation, not after the table
            check_json_path(args.json, overwrite=args.overwrite)
        if args.json_format == "clip_benchmark":
            if args.json is None:
                raise ValueError("--json-format clip_benchmark: give --json OUT, the file to write")
            check_retrieval_request(
                args.protocol, approximate=args.shortlist is not None, rescored=bool(args.rescore)
            )
        checkpoints = args.checkpoint
        prepared = prepare_evaluation(
            checkpoints[0] if len(checkpoints) == 1 else (checkpoints or None),
            data=args.data,
            split=args.split,
            protocol=args.protocol,
            batch_size=args.batch_size,
            device=args.device,
            shortlist=args.shortlist,
            shortlist_from=args.shortlist_from,
            progress=not args.no_progress,
            captions_per_image=args.captions_per_image,
            captions_per_video=args.captions_per_video,
            model_dir=args.model_dir,
            default_preprocessing=args.default_preprocessing,
            rescore=make_rescoring(
                args.rescore,
                names=RESCORE_FLAGS,
                temperature=args.dsl_temperature,
                beta=args.qb_beta,
                k=args.qb_k,
                dynamic=False if args.qb_static else None,
                bank_size=args.bank_size,
            ),
        )
        if args.check:
            print(_check_summary(prepared, args))
            return EXIT_OK
        for note in prepared.notes:  # the defaults taken: checkpoint, data, split
            print(note)
        # the last phase: the evaluation core, on what was prepared
        result = evaluate(prepared.scorer, prepared.data, prepared.protocol, split=prepared.split)
    except RescoreParameterError as err:  # named by its flag: --dsl-temperature 1e-320 is ...
        return fail(NAME, f"{RESCORE_FLAGS.get(err.param, err.param)} {err.detail}")
    except (FileNotFoundError, ValueError) as err:  # ConfigError, DataFormatError included
        return fail(NAME, err)
    print(result.table())  # the Evaluation carries its protocol and split
    if args.json is not None:
        record = result.record() if args.json_format == "vlret" else retrieval_record(result)
        print(write_metrics_json(record, args.json, overwrite=args.overwrite))
    return EXIT_OK


def _check_summary(prepared: Any, args: argparse.Namespace) -> str:
    """What ``vlret eval --check`` prints: the model(s), data, split, protocol and sizes of the
    evaluation :func:`~vlret.run.evaluate.prepare_evaluation` built, and what would be
    written."""
    images, texts = prepared.sizes
    visual = prepared.protocol.visual

    def why(key: str) -> str:
        return f" ({prepared.why[key]})" if key in prepared.why else ""

    models = [f"{c}{why(str(c))}" for c in prepared.checkpoints]
    models = models or [f"{args.model_dir} (a local Hugging Face CLIP folder)"]
    lines = [
        f"model: {', '.join(models)}"
        + (f"; an ensemble of {len(prepared.members)}" if len(prepared.members) > 1 else ""),
        f"data: {prepared.root}{why('data')}",
        f"split: {prepared.split}{why('split')}",
        f"protocol: {prepared.protocol.name}",
        f"title: {prepared.protocol.title_for(prepared.split, images, texts)}",
        f"size: {images} {visual}s x {texts} captions",
        f"would write: {args.json if args.json is not None else 'nothing (no --json)'}",
        "check passed: nothing encoded, nothing written",
    ]
    return "\n".join(lines)
