"""Command line: ``vlret demo | losses | plot``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(seed=args.seed)
    return 0


def _cmd_losses(args: argparse.Namespace) -> int:
    from .losses import available_losses, loss_class, loss_parameters

    for name in available_losses():
        cls = loss_class(name)
        params = ", ".join(f"{k}={v!r}" for k, v in loss_parameters(name).items())
        print(f"{name:<18} {cls.__name__:<22} {getattr(cls, 'paper', '')}")
        print(f"{'':<18} {getattr(cls, 'equation', '')}; {params}")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    if args.what == "goal-weights":
        from .analysis.goal_plots import plot_goal_weights

        paths = plot_goal_weights(args.out)
    else:
        if args.stats is None:
            raise SystemExit("vlret plot adacl-margins: --stats FILE is required")
        from .analysis.adacl_plots import plot_adacl_margins

        paths = plot_adacl_margins(args.stats, args.out)
    for p in paths:
        print(p)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vlret",
        description="Vision-language retrieval losses, evaluation protocols and tools.",
    )
    parser.add_argument("--version", action="version", version=f"vlret {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="every loss on a seeded batch + metrics of a toy problem")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.set_defaults(func=_cmd_demo)

    losses = sub.add_parser("losses", help="list the registered losses and their defaults")
    losses.set_defaults(func=_cmd_losses)

    plot = sub.add_parser("plot", help="figures: GOAL weight diagrams, AdaCL margin curves")
    plot.add_argument("what", choices=["goal-weights", "adacl-margins"])
    plot.add_argument("--out", type=Path, required=True, help="output folder for PNG files")
    plot.add_argument("--stats", type=Path, help="AdaCL stats JSON-lines log (adacl-margins)")
    plot.set_defaults(func=_cmd_plot)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
