"""``vlret eval RUN_OR_CKPT [...] --protocol NAME [--data DIR] [--split SPLIT] [--check]``: a
thin layer over the evaluation tasks (:mod:`vlret.eval.tasks`): the ``--protocol`` choices are
the registered tasks, each of which says which of the options below it takes, prepares itself
through the run harness (:class:`vlret.run.tasks.RunHarness`: a retrieval protocol by
:func:`vlret.run.evaluate.prepare_evaluation`, zero-shot classification by loading one pixel
model and a class-labelled set) and runs (:func:`vlret.eval.evaluate`,
:func:`vlret.eval.zeroshot.evaluate_zeroshot`). A run folder is evaluated from its ``best.pt``
(else ``last.pt``), on the data folder of its config and the protocol's split of that data
unless ``--data`` / ``--split`` say otherwise; ``--check`` loads and reads everything, prints
what would be evaluated and writes nothing."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import DEFAULT_PREPROCESSINGS, EXIT_OK, fail, positive_int, require_train_extra

NAME = "eval"

#: Each task option (:attr:`vlret.eval.tasks.EvalTask.options`) and the flag that sets it
#: (named when a task does not take it).
TASK_FLAGS = {
    "shortlist": "--shortlist",
    "shortlist_from": "--shortlist-from",
    "rescore": "--rescore",
    "captions_per_image": "--captions-per-image",
    "captions_per_video": "--captions-per-video",
    "dataset": "--dataset",
    "templates": "--templates",
    "classnames": "--classnames",
    "num_workers": "--num-workers",
}
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
    from ..eval import eval_splits, get_protocol, get_task, task_names
    from ..eval.clip_benchmark import JSON_FORMATS

    # one help entry per set of accepted splits: "coco1k/coco5k: precomp testall/dev, ...; ..."
    by_splits: dict[str, list[str]] = {}
    for name in task_names():
        by_splits.setdefault(get_protocol(name).accepted(sep=", "), []).append(name)

    p = subparsers.add_parser(
        NAME,
        help="evaluate a checkpoint (or an ensemble) under a paper protocol or task",
        description="Exact protocol by default. Several checkpoints: an ensemble, the mean of "
        "their score matrices. --shortlist K: approximate, for pair-scoring (cross-attention) "
        "models: each query's top-K candidates by a two-tower score re-ranked by exact scores. "
        "--protocol zeroshot-classification: zero-shot classification of a class-labelled set "
        "(--dataset, --data) as vlret zeroshot computes it. vlret protocols --long lists what "
        "each protocol needs.",
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
        "checkpoint's data.root (required with --model-dir); zeroshot-classification: the "
        "--dataset set's folder (default: the run's train.zeroshot_root)",
    )
    p.add_argument(
        "--dataset",
        metavar="NAME",
        help="zeroshot-classification: the class-labelled set, imagenet1k, cifar10, cifar100, "
        "caltech101, food101, flowers102, pets, fgvc_aircraft (each in its released layout) or "
        "imagefolder (one folder per class); default: the run's train.zeroshot_dataset",
    )
    p.add_argument(
        "--templates",
        metavar="openai|NAME|FILE",
        help="zeroshot-classification: prompt templates, openai (OpenAI's 80 ImageNet "
        "templates), a data set's NAME, or a FILE with one template per line using {c} "
        "(default: the data set's own list)",
    )
    p.add_argument(
        "--classnames",
        type=Path,
        metavar="FILE",
        help="zeroshot-classification: class names, one per line in label order (default: the "
        "data set's own)",
    )
    p.add_argument(
        "--num-workers",
        type=int,
        metavar="N",
        help="zeroshot-classification: DataLoader workers decoding the images (default 0)",
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
        choices=task_names(),
        help="; ".join(f"{n}: {get_task(n).summary}" for n in task_names())
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
        "vlret.eval.clip_benchmark; zeroshot-classification: its zeroshot_classification "
        "record, as vlret zeroshot --json writes it)",
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
    """Evaluate, print the task's table and (``--json``) write its record."""
    require_train_extra(NAME)
    from .._files import check_json_path, write_metrics_json
    from ..eval import EvalRequest, get_task
    from ..metrics.rescore import RescoreParameterError, make_rescoring
    from ..run.tasks import RunHarness

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
        task = get_task(args.protocol)
        if args.json is not None:  # before the (slow) evaluation, not after the table
            check_json_path(args.json, overwrite=args.overwrite)
        if args.json_format != "vlret" and args.json is None:
            raise ValueError(
                f"--json-format {args.json_format}: give --json OUT, the file to write"
            )
        rescore = make_rescoring(
            args.rescore,
            names=RESCORE_FLAGS,
            temperature=args.dsl_temperature,
            beta=args.qb_beta,
            k=args.qb_k,
            dynamic=False if args.qb_static else None,
            bank_size=args.bank_size,
        )
        given = {name: getattr(args, name) for name in TASK_FLAGS if name != "rescore"}
        options = {name: value for name, value in given.items() if value is not None}
        if rescore is not None:
            options["rescore"] = rescore
        request = EvalRequest(
            checkpoints=tuple(args.checkpoint),
            model_dir=args.model_dir,
            data=args.data,
            split=args.split,
            batch_size=args.batch_size,
            device=args.device,
            progress=not args.no_progress,
            default_preprocessing=args.default_preprocessing,
            options=options,
        )
        task.check_options(request, flags=TASK_FLAGS)
        task.check_json_format(args.json_format, request)
        prepared = task.prepare(request, harness=RunHarness())
        if args.check:
            would = args.json if args.json is not None else "nothing (no --json)"
            lines = [*prepared.summary(), f"would write: {would}"]
            print("\n".join([*lines, "check passed: nothing encoded, nothing written"]))
            return EXIT_OK
        for note in prepared.notes:  # the defaults taken: checkpoint, data, split
            print(note)
        # the last phase: the task's evaluation core, on what was prepared
        result = prepared.run()
    except RescoreParameterError as err:  # named by its flag: --dsl-temperature 1e-320 is ...
        return fail(NAME, f"{RESCORE_FLAGS.get(err.param, err.param)} {err.detail}")
    except (FileNotFoundError, ValueError) as err:  # ConfigError, DataFormatError included
        return fail(NAME, err)
    print(result.table())  # the result carries its protocol and split
    if args.json is not None:
        record = result.record(json_format=args.json_format)
        print(write_metrics_json(record, args.json, overwrite=args.overwrite))
    return EXIT_OK
