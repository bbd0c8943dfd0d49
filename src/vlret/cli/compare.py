"""``vlret compare CONFIG``: train every loss variant x seed, test each, write the paper-style
report; also the run options, the run and the report printing that ``sweep`` and ``demo
--preset`` share with it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._common import EXIT_INTERRUPTED, EXIT_OK, fail, positive_int, require_train_extra

NAME = "compare"


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The CONFIG argument and the options of every command that runs a comparison."""
    p.add_argument("config", type=Path, help="run config (.toml or .yaml) with optional [compare]")
    p.add_argument(
        "--seeds",
        type=positive_int,
        help="number of seeds per variant (train.seed + 0, 1, ...; default [compare] seeds or 1)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="output folder (default [compare] output_dir, else <output_dir>/compare|sweep)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config key (repeatable); compare.KEY=VALUE overrides [compare]",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def print_report(report: Any) -> None:
    """The comparison's table (and GOAL grid), the run counts and every file written."""
    print(report.table_text(), end="")
    if report.goal_table is not None:
        print()
        print(report.goal_table.read_text(encoding="utf-8"), end="")
    counts = ", ".join(
        f"{report.count(s)} {s}" for s in ("trained", "resumed", "cached") if report.count(s)
    )
    print(f"\nruns: {counts}")
    curves = [report.curves] if report.curves is not None else []
    for path in (report.table, report.results_csv, report.results_json, *curves, *report.plots):
        print(path)


def run_report(
    command: str, fn: Callable[..., Any], args: argparse.Namespace, **kwargs: Any
) -> int:
    """Run ``fn`` (:func:`vlret.analysis.compare.compare` or ``sweep``) on the run options and
    print its report; an interrupted run is resumed by the same command."""
    from ..train import TrainingInterrupted

    try:
        report = fn(
            args.config,
            seeds=args.seeds,
            out=args.out,
            overrides=args.set,
            progress=not args.no_progress,
            **kwargs,
        )
    except (FileNotFoundError, ValueError) as err:  # CompareError, ConfigError, DataFormatError
        return fail(command, err)
    except TrainingInterrupted as err:
        print(f"interrupted ({err.checkpoint}); run the same command again to continue")
        return EXIT_INTERRUPTED
    print_report(report)
    return EXIT_OK


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``compare`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(
        NAME,
        help="train the same model with each loss and seed; paper-style table and plots",
        description="Train every loss variant x seed (resuming unfinished runs), test each, "
        "and write table.md, results.csv, results.json and plots/*.png.",
    )
    add_run_options(p)
    p.add_argument(
        "--losses",
        metavar="A,B,...",
        help="comma-separated losses or [compare.losses] labels "
        "(default: the config's [compare.losses], else the papers' losses: "
        "vlret.losses.compared_losses())",
    )
    p.add_argument(
        "--goal-grid",
        action="store_true",
        help="also run the 15 GOAL (triplet weight, pair weight) combinations and a heatmap",
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Compare the losses; a bad ``--losses`` is refused before anything trains."""
    require_train_extra(NAME)
    from ..analysis.compare import CompareError, compare, parse_losses

    try:
        losses = parse_losses(args.losses) if args.losses is not None else None
    except CompareError as err:
        return fail(NAME, err)
    return run_report(NAME, compare, args, losses=losses, goal_grid=args.goal_grid)
