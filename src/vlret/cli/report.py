"""``vlret report RUN_OR_CKPT [...] [--data DIR] [--split SPLIT] [--protocol NAME] [--queries
SPEC ...] [--compare CKPT2] --out DIR``: a static HTML report of what a checkpoint (or an
ensemble) retrieves, query by query, beside a second checkpoint with ``--compare``
(:mod:`vlret.analysis.report`; docs/report.md). A run folder and a missing ``--data`` /
``--split`` are resolved as ``vlret eval RUN`` resolves them
(:mod:`vlret.run.eval_inputs`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import EXIT_OK, fail, require_train_extra

NAME = "report"


#: the count options and the least value each takes (checked in :func:`run`, so that a bad
#: value is one line naming the flag, not argparse's usage block)
_COUNTS = {"--top-k": 1, "--samples": 0, "--worst": 0, "--batch-size": 1}
#: The files a report writes in ``--out`` (an existing one needs --overwrite).
REPORT_FILES = ("index.html", "report.json")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``report`` on the ``vlret`` sub-command parsers."""
    from ..eval import eval_splits
    from ..eval.tasks import retrieval_protocol_names

    p = subparsers.add_parser(
        NAME,
        help="write a static HTML report of ranked retrievals (chosen, sampled and worst "
        "queries; two checkpoints side by side)",
        description="Evaluate as vlret eval does, then write OUT/index.html (open it in any "
        "browser, no server) and OUT/report.json: summary metrics, the top-K items of chosen "
        "(--queries), sampled and worst queries in both directions with their scores (beside a "
        "second checkpoint's with --compare), the ground truth "
        "marked, the ground truths ranked below the top K with their pictures or captions and "
        "positions, in rank order; on person search who each result is; thumbnails where the "
        "data has images, pair-scoring models' word attention over regions, and a rank "
        "histogram per direction.",
    )
    p.add_argument(
        "checkpoint",
        type=Path,
        nargs="+",
        help="run folder(s) (their best.pt, else last.pt) or checkpoint(s) written by vlret "
        "train; several: an ensemble (mean of score matrices)",
    )
    p.add_argument(
        "--data",
        type=Path,
        help="data folder of the split (default: the run's data.root, as vlret eval RUN)",
    )
    p.add_argument(
        "--split",
        help=f"one of {', '.join(eval_splits())} (default: the protocol's test split of the "
        "run's data)",
    )
    p.add_argument(
        "--protocol",
        help=f"one of {', '.join(retrieval_protocol_names())} (default: the checkpoint's data "
        "format's protocol that evaluates --split; without --split, the default protocol of its "
        "data)",
    )
    p.add_argument("--out", type=Path, required=True, help="the report folder (created)")
    p.add_argument("--top-k", type=int, default=5, help="items shown per query (5)")
    p.add_argument("--samples", type=int, default=20, help="sampled queries per direction (20)")
    p.add_argument("--worst", type=int, default=20, help="worst queries per direction (20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled queries (0)")
    p.add_argument(
        "--queries",
        action="append",
        metavar="SPEC",
        help="chosen queries, shown first in the order given: DIRECTION:I,J,... (i2t: image "
        "queries, t2i: caption queries; 0-based indices of the split) or a file of "
        "'DIRECTION INDEX' lines (# comments); repeatable",
    )
    p.add_argument(
        "--compare",
        type=Path,
        metavar="CKPT2",
        help="a second run folder or checkpoint scored on the same data: its top-K of each "
        "reported query shown side by side with the first's",
    )
    p.add_argument(
        "--word",
        help="pair-scoring models: the word whose attention over regions is drawn (default: "
        "the caption's most sharply attended content word)",
    )
    p.add_argument("--batch-size", type=int, default=256, help="encoding batch size (256)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default auto)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (stderr)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the index.html and report.json --out holds (refused without this flag)",
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Build the report and print the path of its page."""
    require_train_extra(NAME)
    from .._files import check_output_dir
    from ..analysis.report import build_report
    from ..eval import eval_splits
    from ..eval.tasks import retrieval_protocol_names

    for flag, least in _COUNTS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value < least:
            which = "a positive integer" if least else "an integer >= 0"
            return fail(NAME, f"{flag}: expected {which}, got {value}")
    if args.split is not None and args.split not in eval_splits():
        return fail(
            NAME, f"--split: expected one of {', '.join(eval_splits())}, got {args.split!r}"
        )
    if args.protocol is not None and args.protocol not in retrieval_protocol_names():
        names = ", ".join(retrieval_protocol_names())
        return fail(NAME, f"--protocol: expected one of {names}, got {args.protocol!r}")
    try:
        queries = parse_queries(args.queries or [])
    except (FileNotFoundError, ValueError) as err:
        return fail(NAME, err)
    try:  # run folders, and the data and split of the run where not given (as vlret eval)
        inputs = _inputs(args)
        compare = _compared(args.compare)
    except (FileNotFoundError, ValueError) as err:
        return fail(NAME, err)
    if not inputs.data.exists():
        return fail(NAME, f"--data {inputs.data}: missing")
    for note in inputs.notes():
        print(note)
    try:  # the output-path rule (docs/training.md), before the evaluation
        check_output_dir(args.out, "--out", files=REPORT_FILES, overwrite=args.overwrite)
    except ValueError as err:  # OutputPathError
        return fail(NAME, err)
    try:
        facts, page = build_report(
            inputs.checkpoints,
            data=inputs.data,
            split=inputs.split,
            out=args.out,
            protocol=args.protocol,
            queries=queries,
            compare=compare,
            top_k=args.top_k,
            samples=args.samples,
            worst=args.worst,
            seed=args.seed,
            word=args.word,
            batch_size=args.batch_size,
            device=args.device,
            progress=not args.no_progress,
        )
    except (FileNotFoundError, ValueError) as err:
        return fail(NAME, err)
    print(facts.evaluation.table(protocol=facts.protocol, split=facts.split))
    if facts.compared is not None:
        print(facts.compared.evaluation.table(protocol=facts.protocol, split=facts.split))
    print(page)
    return EXIT_OK


def _inputs(args: argparse.Namespace) -> Any:
    """The checkpoints, data folder and split (:class:`vlret.run.eval_inputs.EvalInputs`):
    run folders give their checkpoint; a missing ``--data`` / ``--split`` is taken from the run
    for ``--protocol``, or for the default protocol of the run's data."""
    from ..run.eval_inputs import EvalInputs, resolve_eval_inputs, run_protocol
    from ..run.eval_members import run_checkpoint

    if args.data is not None and args.split is not None and args.protocol is None:
        return EvalInputs([run_checkpoint(p) for p in args.checkpoint], args.data, args.split)
    protocol = args.protocol if args.protocol is not None else run_protocol(args.checkpoint[0])
    return resolve_eval_inputs(args.checkpoint, protocol=protocol, data=args.data, split=args.split)


def _compared(path: Path | None) -> Path | None:
    """``--compare``: a run folder gives its checkpoint (``best.pt``, else ``last.pt``)."""
    from ..run.eval_members import run_checkpoint

    if path is None:
        return None
    try:
        return run_checkpoint(path)
    except (FileNotFoundError, ValueError) as err:
        raise type(err)(f"--compare {err}") from None


def parse_queries(specs: list[str]) -> dict[str, list[int]]:
    """``--queries``: each SPEC ``DIRECTION:I,J,...`` or a file of ``DIRECTION INDEX`` lines
    (blank lines and ``#`` comments skipped), merged in the order given, per direction
    (``i2t``: image queries, ``t2i``: caption queries). Whether an index is in range is checked
    against the split (:func:`vlret.analysis.report.data.check_queries`)."""
    out: dict[str, list[int]] = {}

    def add(direction: str, index: str, where: str) -> None:
        if direction not in ("i2t", "t2i"):
            raise ValueError(f"--queries {where}: direction {direction!r} is not i2t or t2i")
        try:
            value = int(index)
        except ValueError:
            raise ValueError(f"--queries {where}: {index!r} is not a query index") from None
        if value < 0:
            raise ValueError(f"--queries {where}: {value} is not a query index (>= 0)")
        out.setdefault(direction, []).append(value)

    for spec in specs:
        head, sep, tail = spec.partition(":")
        if sep and head in ("i2t", "t2i"):
            for index in tail.split(","):
                add(head, index.strip(), spec)
            continue
        path = Path(spec)
        if not path.is_file():
            raise FileNotFoundError(
                f"--queries {spec}: neither DIRECTION:I,J,... (i2t or t2i) nor a file"
            )
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) != 2:
                raise ValueError(f"--queries {path}:{n}: expected 'DIRECTION INDEX', got {line!r}")
            add(words[0], words[1], f"{path}:{n}")
    return out
