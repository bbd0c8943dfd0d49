"""Command line: ``vlret train | eval | demo | losses | plot``."""

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


def _cmd_train(args: argparse.Namespace) -> int:
    from .train import ConfigError, TrainingInterrupted, load_config, train

    try:
        config = load_config(args.config, args.set)
    except (ConfigError, FileNotFoundError) as err:
        raise SystemExit(f"vlret train: {err}") from None
    try:
        result = train(config, resume=args.resume)
    except TrainingInterrupted as err:
        print(f"interrupted; resume with: vlret train {args.config} --resume {err.checkpoint}")
        return 130
    best = f", best dev rsum {result.best_rsum:.2f}" if result.best_rsum is not None else ""
    print(f"done: {result.epochs_done} epochs, {result.steps} steps{best}; {result.output_dir}")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from .train.evaluate import (
        evaluate_checkpoint,
        format_metrics_table,
        metrics_json,
        write_metrics_json,
    )

    metrics = evaluate_checkpoint(
        args.checkpoint,
        data=args.data,
        split=args.split,
        protocol=args.protocol,
        batch_size=args.batch_size,
        device=args.device,
    )
    print(format_metrics_table(metrics, args.protocol))
    if args.json is not None:
        record = metrics_json(
            metrics, protocol=args.protocol, split=args.split, checkpoint=str(args.checkpoint)
        )
        print(write_metrics_json(record, args.json))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vlret",
        description="Vision-language retrieval losses, evaluation protocols and tools.",
    )
    parser.add_argument("--version", action="version", version=f"vlret {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = sub.add_parser("train", help="train a retrieval model from a TOML/YAML config")
    train.add_argument("config", type=Path, help="run config (.toml or .yaml)")
    train.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config key (repeatable), e.g. --set optim.lr=1e-4",
    )
    train.add_argument("--resume", type=Path, help="checkpoint to continue from (last.pt)")
    train.set_defaults(func=_cmd_train)

    from .train.evaluate import PROTOCOLS

    ev = sub.add_parser("eval", help="evaluate a checkpoint under a paper protocol")
    ev.add_argument("checkpoint", type=Path, help="checkpoint written by vlret train")
    ev.add_argument("--data", type=Path, required=True, help="data folder of the test split")
    ev.add_argument("--split", required=True, help="split to evaluate (test or testall)")
    ev.add_argument("--protocol", required=True, choices=PROTOCOLS)
    ev.add_argument("--json", type=Path, help="also write the metrics as JSON")
    ev.add_argument("--batch-size", type=int, default=256, help="encoding batch size")
    ev.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default auto)")
    ev.set_defaults(func=_cmd_eval)

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
