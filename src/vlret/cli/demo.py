"""``vlret demo``: the quick tour (:func:`vlret.tour.run_demo`), or with ``--preset`` the loss
comparison on a synthetic world (:func:`vlret.demo.run_comparison_demo`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import EXIT_INTERRUPTED, EXIT_OK, fail, positive_int, require_train_extra
from .compare import print_report

NAME = "demo"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``demo`` on the ``vlret`` sub-command parsers."""
    from ..demo import DEMO_PRESETS

    p = subparsers.add_parser(
        NAME,
        help="quick: every loss on a seeded batch + toy metrics; --preset: a loss comparison",
        description="Without --preset (a few seconds): every registered loss on a seeded batch "
        "(value, gradient norm) and the metrics of a seeded toy problem. With --preset: write "
        "the preset's synthetic world (reused when present), compare triplet-HN, InfoNCE, "
        "Unified, GOAL, VSL and AdaCL with their papers' hyper-parameters, and print the table "
        "and the paths of the plots. Presets: "
        + "; ".join(f"{k}: {p.description}" for k, p in DEMO_PRESETS.items())
        + ".",
    )
    p.add_argument(
        "--preset",
        choices=list(DEMO_PRESETS),
        help="run the loss comparison on the synthetic world of that name (vlret synth NAME)",
    )
    p.add_argument(
        "--seed", type=int, help="random seed (default 0; with --preset: the first train seed)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("runs/demo"),
        help="with --preset: folder of the world, the config and the comparison (runs/demo)",
    )
    p.add_argument("--epochs", type=positive_int, help="with --preset: epochs per run")
    p.add_argument("--seeds", type=positive_int, help="with --preset: seeds per loss")
    p.add_argument("--losses", metavar="A,B,...", help="with --preset: a subset of the losses")
    p.add_argument(
        "--fresh", action="store_true", help="with --preset: retrain instead of reusing runs"
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        help="with --preset: runs trained at once, one thread each (default: one per core)",
    )
    p.add_argument(
        "--no-progress", action="store_true", help="with --preset: one line per run, not per epoch"
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """The quick tour, or the comparison (which trains: the ``train`` extra)."""
    if args.preset is None:  # the quick demo: losses on a seeded batch, toy metrics
        from ..tour import run_demo

        run_demo(seed=0 if args.seed is None else args.seed)
        return EXIT_OK
    require_train_extra(NAME)
    from ..analysis.compare import CompareError, parse_losses
    from ..demo import run_comparison_demo
    from ..train import TrainingInterrupted

    try:
        losses = parse_losses(args.losses) if args.losses is not None else None
        result = run_comparison_demo(
            args.preset,
            out=args.out,
            epochs=args.epochs,
            seeds=args.seeds,
            seed=args.seed,
            losses=losses,
            fresh=args.fresh,
            workers=args.workers,
            progress=not args.no_progress,
        )
    except CompareError as err:
        hint = " (or pass --fresh)" if "other settings" in str(err) else ""
        return fail(NAME, f"{err}{hint}")
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        return fail(NAME, err)
    except TrainingInterrupted as err:
        print(f"interrupted ({err.checkpoint}); run the same command again to continue")
        return EXIT_INTERRUPTED
    print_report(result.report)
    print(f"\nreproduce: {result.command}")
    print(f"done in {result.seconds:.1f} s")
    return EXIT_OK
