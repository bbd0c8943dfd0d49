"""``vlret plot goal-weights | adacl-margins | curves | tsne | gradients``: GOAL's weight
diagrams, AdaCL's margin curves, a run's training curves, a t-SNE of a run's embeddings, the
tangent components of the loss's gradient against steps.

* ``vlret plot goal-weights --out DIR``; ``vlret plot adacl-margins --stats FILE --out DIR``.
* ``vlret plot curves RUN [RUN ...] [--out DIR]``: training and dev loss, the dev selection
  metric and dev R@1 per direction against epochs from each run's ``metrics.jsonl``
  (``training_curves.png``, :func:`vlret.analysis.epoch_curves.plot_run_curves`) and the
  same as tables (``curves.md``); ``--out`` defaults to ``plots/`` in the run folder (one run).
* ``vlret plot tsne RUN --split dev [--samples 500] [--perplexity 30] [--seed 0] [--out
  FILE.png] [--data DIR]``: :func:`vlret.analysis.tsne.tsne_plot` (RUN: a run folder, its
  ``best.pt``, or a checkpoint such as ``epoch_10.pt`` kept by ``train.keep_epochs``), with
  ``FILE.csv`` and ``FILE.json`` beside the PNG; a pair-scoring model (SCAN, BFAN, SGRAF) is
  mapped by its pooled region and word embeddings (docs/curves.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import EXIT_OK, fail, positive_int

NAME = "plot"
#: What ``vlret plot`` draws.
WHATS = ("goal-weights", "adacl-margins", "curves", "tsne", "gradients")
#: The files each figure writes in its ``--out`` folder (an existing one needs --overwrite):
#: the analysis modules' names written out, as the parser imports no torch (a test holds them
#: equal).
FILES = {
    "goal-weights": ("goal_triplet_weights.png", "goal_pair_weights.png"),
    "adacl-margins": ("adacl_margins.png",),
    "curves": ("training_curves.png", "curves.md"),
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``plot`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(
        NAME,
        help="figures: GOAL weight diagrams, AdaCL margins, training curves, t-SNE, gradients",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("what", choices=WHATS)
    p.add_argument(
        "runs", nargs="*", type=Path, metavar="RUN", help="run folders (curves, tsne, gradients)"
    )
    p.add_argument(
        "--out",
        type=Path,
        help="output folder (goal-weights, adacl-margins, curves) or PNG file (tsne, gradients)",
    )
    p.add_argument("--stats", type=Path, help="AdaCL stats JSON-lines log (adacl-margins)")
    p.add_argument("--split", default="dev", help="tsne: the split to map (default dev)")
    p.add_argument("--samples", type=positive_int, default=500, help="tsne: images drawn")
    p.add_argument("--perplexity", type=float, default=30.0, help="tsne: perplexity")
    p.add_argument("--seed", type=int, default=0, help="tsne: the draw's and t-SNE's seed")
    p.add_argument("--data", type=Path, help="tsne: data folder (default: the run's data.root)")
    p.add_argument("--device", default="auto", help="tsne: encoding device (default auto)")
    p.add_argument(
        "--relative",
        action="store_true",
        help="gradients: divide each line by its largest value (losses of different scales)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace figures and tables already in --out (refused without this flag)",
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Write the figures, print their paths. Everything that would make the command fail after
    drawing is refused first, in one line: a missing ``--stats`` or ``--out``, runs given to
    a figure that takes none, an ``--out`` that cannot be a folder, a missing matplotlib (the
    ``plot`` extra, :class:`~vlret._extras.MissingExtra` printed by :func:`vlret.cli.main`,
    status 2)."""
    from .._files import check_output_dir, check_output_file
    from ..analysis._plotting import require_matplotlib

    what = args.what
    if what in ("goal-weights", "adacl-margins"):
        if args.runs:
            return fail(NAME, f"{what} takes no RUN (got {args.runs[0]})")
        if what == "adacl-margins" and args.stats is None:
            return fail(NAME, "adacl-margins needs --stats FILE (the AdaCL stats JSON-lines log)")
        if args.out is None:
            return fail(NAME, f"{what} needs --out DIR (the folder of the PNG files)")
    elif what == "curves" and not args.runs:
        return fail(NAME, "curves needs at least one RUN folder (holding metrics.jsonl)")
    elif what == "gradients" and not args.runs:
        return fail(NAME, "gradients needs at least one RUN folder (holding gradients.jsonl)")
    elif what == "tsne" and len(args.runs) != 1:
        return fail(
            NAME, f"tsne needs exactly one RUN (a run folder or a checkpoint), got {len(args.runs)}"
        )
    out = args.out
    if what == "curves" and out is None:
        if len(args.runs) > 1:
            return fail(NAME, "curves of several runs needs --out DIR")
        out = args.runs[0] / "plots"
    if what == "gradients" and out is None:
        if len(args.runs) > 1:
            return fail(NAME, "gradients of several runs needs --out FILE.png")
        out = args.runs[0] / "gradients.png"
    try:  # the output-path rule (docs/training.md), before anything is drawn
        if what == "gradients":
            if out.suffix.lower() != ".png":
                return fail(NAME, f"--out {out}: expected a .png file for gradients")
            check_output_file(out, "--out", "gradients.png", overwrite=args.overwrite)
        elif what == "tsne":
            if out is not None and out.suffix.lower() != ".png":
                return fail(NAME, f"--out {out}: expected a .png file for tsne")
            run = args.runs[0]  # the default: tsne_<split>.png in the run folder
            png = out or (run if run.is_dir() else run.parent) / f"tsne_{args.split}.png"
            for target in (png, png.with_suffix(".csv"), png.with_suffix(".json")):
                check_output_file(target, "--out", "tsne.png", overwrite=args.overwrite)
        else:
            check_output_dir(out, "--out", files=FILES[what], overwrite=args.overwrite)
    except ValueError as err:  # OutputPathError
        return fail(NAME, err)
    require_matplotlib(f"vlret {NAME}")
    try:
        if what == "tsne":
            paths = _tsne(args, out)
        elif what == "gradients":
            paths = _gradients(args, _folder(out))
        else:
            paths = _figures(args, what, _folder(out))
    except (FileNotFoundError, ValueError) as err:  # one line naming the file or argument
        return fail(NAME, err)
    for p in paths:
        print(p)
    return EXIT_OK


def _folder(out: Path | None) -> Path:
    assert out is not None  # run checked it
    return out


def _figures(args: argparse.Namespace, what: str, out: Path) -> list[Path]:
    if what == "goal-weights":
        from ..analysis.goal_plots import plot_goal_weights

        return plot_goal_weights(out)
    if what == "adacl-margins":
        from ..analysis.adacl_plots import plot_adacl_margins

        return plot_adacl_margins(args.stats, out)
    from ..analysis.curves import write_epoch_curves
    from ..analysis.epoch_curves import plot_run_curves, run_labels

    figure = plot_run_curves(args.runs, out)
    table = write_epoch_curves({k: [v] for k, v in run_labels(args.runs).items()}, out)
    return [figure, table]


def _gradients(args: argparse.Namespace, out: Path) -> list[Path]:
    from ..analysis.gradient_log import plot_gradient_curves

    return [plot_gradient_curves(args.runs, out, relative=args.relative)]


def _tsne(args: argparse.Namespace, out: Path | None) -> list[Path]:
    from .._extras import require
    from ..analysis.tsne import tsne_plot

    require("sklearn", f"vlret {NAME} tsne")
    return tsne_plot(
        args.runs[0],
        out,
        split=args.split,
        samples=args.samples,
        perplexity=args.perplexity,
        seed=args.seed,
        data=args.data,
        device=args.device,
    )
