"""Command line: ``vlret train | eval | import-checkpoint | convert-experts | compare | sweep |
synth | demo | losses | configs | plot``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.preset is None:  # the quick demo: losses on a seeded batch, toy metrics
        from .demo import run_demo

        run_demo(seed=0 if args.seed is None else args.seed)
        return 0
    from .analysis.compare import CompareError, parse_losses
    from .demo import run_comparison_demo
    from .train import TrainingInterrupted

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
        print(f"vlret demo: {err}{hint}", file=sys.stderr)
        return 2
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"vlret demo: {err}", file=sys.stderr)
        return 2
    except TrainingInterrupted as err:
        print(f"interrupted ({err.checkpoint}); run the same command again to continue")
        return 130
    _print_report(result.report)
    print(f"\nreproduce: {result.command}")
    print(f"done in {result.seconds:.1f} s")
    return 0


def _cmd_losses(args: argparse.Namespace) -> int:
    from .losses import available_losses, loss_class, loss_parameters

    for name in available_losses():
        cls = loss_class(name)
        params = ", ".join(f"{k}={v!r}" for k, v in loss_parameters(name).items())
        print(f"{name:<18} {cls.__name__:<22} {getattr(cls, 'paper', '')}")
        print(f"{'':<18} {getattr(cls, 'equation', '')}; {params}")
    return 0


def _cmd_configs(args: argparse.Namespace) -> int:
    from .configs import copy_config, describe, shipped_config, shipped_configs

    if args.action == "list":
        configs = shipped_configs()
        width = max(len(n) for n in configs)
        for name, path in configs.items():
            print(f"{name:<{width}}  {describe(path)}")
        print(
            f"\n{len(configs)} configs; `vlret train NAME` runs one, `vlret configs copy NAME DIR`"
        )
        return 0
    if args.name is None:
        print(f"vlret configs {args.action}: needs a config NAME", file=sys.stderr)
        return 2
    if args.action == "show":
        shipped = shipped_config(args.name)
        if shipped is None:
            print(
                f"{args.name!r} is not a shipped config; `vlret configs` lists them",
                file=sys.stderr,
            )
            return 2
        print(shipped.read_text(encoding="utf-8"), end="")
        return 0
    try:
        print(copy_config(args.name, args.dir or Path(".")))
    except (KeyError, FileExistsError) as err:
        print(err.args[0] if isinstance(err, KeyError) else err, file=sys.stderr)
        return 2
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    if args.what == "goal-weights":
        from .analysis.goal_plots import plot_goal_weights

        paths = plot_goal_weights(args.out)
    else:
        if args.stats is None:
            raise SystemExit("vlret plot adacl-margins: --stats FILE is required")
        from .analysis.adacl_plots import plot_adacl_margins

        # A missing file or one without AdaCL margins: one line naming the file, exit 2.
        try:
            paths = plot_adacl_margins(args.stats, args.out)
        except (FileNotFoundError, ValueError) as err:
            print(f"vlret plot: {err}", file=sys.stderr)
            return 2
    for p in paths:
        print(p)
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from .data import DataFormatError
    from .train import ConfigError, TrainingInterrupted, load_config, train
    from .train.distributed import env_from_torchrun
    from .train.run_folder import resume_command

    # Errors in the config or the data: one line on stderr, exit status 2, no traceback.
    try:
        main = env_from_torchrun().is_main  # under torchrun only rank 0 reports
        config = load_config(args.config, args.set)
        result = train(config, resume=args.resume, overwrite=args.overwrite)
    except TrainingInterrupted as err:
        if main:
            command = resume_command(args.config, args.set, err.checkpoint)
            print(f"interrupted; resume with: {command}")
        return 130
    except KeyboardInterrupt:  # a second Ctrl-C outside a step (data loading, validation)
        if main:
            print("interrupted; the last checkpoint written (if any) is in the output folder")
        return 130
    except (ConfigError, DataFormatError, FileNotFoundError, ValueError) as err:
        print(f"vlret train: {err}", file=sys.stderr)
        return 2
    if main:
        best = f", best dev rsum {result.best_rsum:.2f}" if result.best_rsum is not None else ""
        print(f"done: {result.epochs_done} epochs, {result.steps} steps{best}; {result.output_dir}")
    return 0


_RESCORE_FLAGS = {
    "temperature": "--dsl-temperature",
    "beta": "--qb-beta",
    "k": "--qb-k",
    "dynamic": "--qb-static",
    "bank_size": "--bank-size",
}


def _cmd_eval(args: argparse.Namespace) -> int:
    from ._files import check_json_path, write_metrics_json
    from .metrics.rescore import make_rescoring
    from .train.evaluate import (
        evaluation_record,
        evaluation_title,
        format_metrics_table,
        run_evaluation,
    )

    try:
        if args.json is not None:  # before the (slow) evaluation, not after the table
            check_json_path(args.json)
        result = run_evaluation(
            args.checkpoint[0] if len(args.checkpoint) == 1 else args.checkpoint,
            data=args.data,
            split=args.split,
            protocol=args.protocol,
            batch_size=args.batch_size,
            device=args.device,
            shortlist=args.shortlist,
            shortlist_from=args.shortlist_from,
            progress=not args.no_progress,
            rescore=make_rescoring(
                args.rescore,
                names=_RESCORE_FLAGS,
                temperature=args.dsl_temperature,
                beta=args.qb_beta,
                k=args.qb_k,
                dynamic=False if args.qb_static else None,
                bank_size=args.bank_size,
            ),
        )
    except (FileNotFoundError, ValueError) as err:  # ConfigError, DataFormatError included
        print(f"vlret eval: {err}", file=sys.stderr)
        return 2
    title = evaluation_title(result, args.protocol, args.split)
    print(format_metrics_table(result.metrics, args.protocol, title=title))
    if args.json is not None:
        record = evaluation_record(result, protocol=args.protocol, split=args.split)
        print(write_metrics_json(record, args.json))
    return 0


def _print_report(report) -> None:
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


def _run_report(command: str, fn, args: argparse.Namespace, **kwargs) -> int:
    from .train import TrainingInterrupted

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
        print(f"vlret {command}: {err}", file=sys.stderr)
        return 2
    except TrainingInterrupted as err:
        print(f"interrupted ({err.checkpoint}); run the same command again to continue")
        return 130
    _print_report(report)
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from .analysis.compare import CompareError, compare, parse_losses

    try:
        losses = parse_losses(args.losses) if args.losses is not None else None
    except CompareError as err:
        print(f"vlret compare: {err}", file=sys.stderr)
        return 2
    return _run_report("compare", compare, args, losses=losses, goal_grid=args.goal_grid)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from .analysis.compare import sweep

    return _run_report("sweep", sweep, args, params=args.param, loss=args.loss)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, help="run config (.toml or .yaml) with optional [compare]")
    p.add_argument(
        "--seeds",
        type=_positive_int,
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


def version_line() -> str:
    """``vlret X (torch Y, device Z)``: what a bug report needs first. The device is the one
    ``train.device = "auto"`` picks (the first GPU when CUDA is available, else the CPU)."""
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        device = f"cuda ({name}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} visible)"
    else:
        build = "CPU-only build" if torch.version.cuda is None else "no GPU visible"
        device = f"cpu ({build})"
    return f"vlret {__version__} (torch {torch.__version__}, device {device})"


class _VersionAction(argparse.Action):
    """``--version``: the line is built when asked (it queries CUDA), not at parser build."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vlret",
        description="Vision-language retrieval losses, evaluation protocols and tools.",
    )
    parser.add_argument(
        "--version", action=_VersionAction, help="print vlret's, torch's version and the device"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = sub.add_parser("train", help="train a retrieval model from a TOML/YAML config")
    train.add_argument(
        "config", type=Path, help="run config (.toml or .yaml) or a shipped config's name"
    )
    train.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config key (repeatable), e.g. --set optim.lr=1e-4",
    )
    train.add_argument("--resume", type=Path, help="checkpoint to continue from (last.pt)")
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run that output_dir already holds (refused without this flag)",
    )
    train.set_defaults(func=_cmd_train)

    from .train.evaluate import EVAL_SPLITS, PROTOCOLS

    ev = sub.add_parser(
        "eval",
        help="evaluate a checkpoint (or an ensemble) under a paper protocol",
        description="Exact protocol by default. Several checkpoints: an ensemble, the mean of "
        "their score matrices. --shortlist K: approximate, for pair-scoring (cross-attention) "
        "models: each query's top-K candidates by a two-tower score re-ranked by exact scores.",
    )
    ev.add_argument(
        "checkpoint",
        type=Path,
        nargs="+",
        help="checkpoint(s) written by vlret train (or vlret import-checkpoint); several: "
        "an ensemble averaging their score matrices",
    )
    ev.add_argument(
        "--data",
        type=Path,
        required=True,
        help="data folder of the test split (Karpathy: dataset_*.json and images/ in it)",
    )
    ev.add_argument(
        "--split",
        required=True,
        choices=EVAL_SPLITS,
        help="f30k: test; coco1k/coco5k: testall (Karpathy COCO: test); msrvtt-*: test; "
        "dev for model-selection checks (not msrvtt-1ka)",
    )
    ev.add_argument("--protocol", required=True, choices=PROTOCOLS)
    ev.add_argument("--json", type=Path, help="also write the metrics as JSON")
    ev.add_argument("--batch-size", type=int, default=256, help="encoding batch size")
    ev.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default auto)")
    ev.add_argument(
        "--shortlist",
        type=int,
        metavar="K",
        help="APPROXIMATE (cross-attention models): re-rank each query's top K candidates of a "
        "two-tower score with exact scores, the rest ranked below; reports the fraction of "
        "ground truths shortlisted (default: the exact protocol)",
    )
    ev.add_argument(
        "--shortlist-from",
        type=Path,
        metavar="CKPT",
        help="with --shortlist: a two-tower checkpoint whose cosines pick the shortlists "
        "(default: the cosine of the model's own mean-pooled region and word features)",
    )
    ev.add_argument(
        "--rescore",
        choices=("dsl", "qbnorm"),
        help="NON-STANDARD re-scoring, labelled so in the table and JSON (docs/rescoring.md): "
        "dsl = dual softmax over the test matrix (uses every test query at once); qbnorm = "
        "QB-Norm with a querybank of training captions (text->image only)",
    )
    ev.add_argument(
        "--dsl-temperature", type=float, metavar="T", help="dsl: temperature (default 0.01)"
    )
    ev.add_argument("--qb-beta", type=float, metavar="BETA", help="qbnorm: beta (default 20)")
    ev.add_argument(
        "--qb-k", type=int, metavar="K", help="qbnorm: top-K images of a bank caption (default 1)"
    )
    ev.add_argument(
        "--qb-static", action="store_true", help="qbnorm: normalise every query (not dynamic)"
    )
    ev.add_argument(
        "--bank-size", type=int, metavar="N", help="qbnorm: train captions in the bank (5000)"
    )
    ev.add_argument("--no-progress", action="store_true", help="no progress bar (stderr)")
    ev.set_defaults(func=_cmd_eval)

    from .train.import_checkpoint import add_import_parser

    add_import_parser(sub)
    from .data.cli import add_convert_parser, add_synth_parser

    add_convert_parser(sub)

    cmp = sub.add_parser(
        "compare",
        help="train the same model with each loss and seed; paper-style table and plots",
        description="Train every loss variant x seed (resuming unfinished runs), test each, "
        "and write table.md, results.csv, results.json and plots/*.png.",
    )
    _add_run_options(cmp)
    cmp.add_argument(
        "--losses",
        metavar="A,B,...",
        help="comma-separated losses or [compare.losses] labels "
        "(default: the config's [compare.losses], else the papers' losses: "
        "vlret.losses.compared_losses())",
    )
    cmp.add_argument(
        "--goal-grid",
        action="store_true",
        help="also run the 15 GOAL (triplet weight, pair weight) combinations and a heatmap",
    )
    cmp.set_defaults(func=_cmd_compare)

    sw = sub.add_parser(
        "sweep",
        help="grid over loss parameters; rsum against each parameter (Unified Fig. 5)",
        description="Train the product of the --param values (each seed), test each, and write "
        "the comparison report plus plots/sweep_<param>.png.",
    )
    _add_run_options(sw)
    sw.add_argument(
        "--param",
        action="append",
        required=True,
        metavar="NAME=V1,V2,...",
        help="loss parameter and its values (repeatable; the grid is their product)",
    )
    sw.add_argument("--loss", help="loss or [compare.losses] label (default: the config's loss)")
    sw.set_defaults(func=_cmd_sweep)

    add_synth_parser(sub)

    from .demo import DEMO_PRESETS

    demo = sub.add_parser(
        "demo",
        help="quick: every loss on a seeded batch + toy metrics; --preset: a loss comparison",
        description="Without --preset (a few seconds): every registered loss on a seeded batch "
        "(value, gradient norm) and the metrics of a seeded toy problem. With --preset: write "
        "the preset's synthetic world (reused when present), compare triplet-HN, InfoNCE, "
        "Unified, GOAL, VSL and AdaCL with their papers' hyper-parameters, and print the table "
        "and the paths of the plots. Presets: "
        + "; ".join(f"{k}: {p.description}" for k, p in DEMO_PRESETS.items())
        + ".",
    )
    demo.add_argument(
        "--preset",
        choices=list(DEMO_PRESETS),
        help="run the loss comparison on the synthetic world of that name (vlret synth NAME)",
    )
    demo.add_argument(
        "--seed", type=int, help="random seed (default 0; with --preset: the first train seed)"
    )
    demo.add_argument(
        "--out",
        type=Path,
        default=Path("runs/demo"),
        help="with --preset: folder of the world, the config and the comparison (runs/demo)",
    )
    demo.add_argument("--epochs", type=_positive_int, help="with --preset: epochs per run")
    demo.add_argument("--seeds", type=_positive_int, help="with --preset: seeds per loss")
    demo.add_argument("--losses", metavar="A,B,...", help="with --preset: a subset of the losses")
    demo.add_argument(
        "--fresh", action="store_true", help="with --preset: retrain instead of reusing runs"
    )
    demo.add_argument(
        "--workers",
        type=_positive_int,
        help="with --preset: runs trained at once, one thread each (default: one per core)",
    )
    demo.add_argument(
        "--no-progress", action="store_true", help="with --preset: one line per run, not per epoch"
    )
    demo.set_defaults(func=_cmd_demo)

    losses = sub.add_parser("losses", help="list the registered losses and their defaults")
    losses.set_defaults(func=_cmd_losses)

    cfg = sub.add_parser("configs", help="the shipped configs: list, show NAME, copy NAME DIR")
    cfg.add_argument("action", nargs="?", default="list", choices=["list", "show", "copy"])
    cfg.add_argument("name", nargs="?", help="a shipped config's name (see `vlret configs`)")
    cfg.add_argument("dir", nargs="?", type=Path, help="copy: the folder to write it to")
    cfg.set_defaults(func=_cmd_configs)

    plot = sub.add_parser("plot", help="figures: GOAL weight diagrams, AdaCL margin curves")
    plot.add_argument("what", choices=["goal-weights", "adacl-margins"])
    plot.add_argument("--out", type=Path, required=True, help="output folder for PNG files")
    plot.add_argument("--stats", type=Path, help="AdaCL stats JSON-lines log (adacl-margins)")
    plot.set_defaults(func=_cmd_plot)
    return parser


#: The commands that train, evaluate or write run folders: the ``train`` extra (PyYAML for the
#: run folder's config.yaml, tqdm for the progress bars), checked before anything runs.
_TRAIN_EXTRA_COMMANDS = ("train", "eval", "compare", "sweep", "import-checkpoint")


def main(argv: Sequence[str] | None = None) -> int:
    """The ``vlret`` command; a missing optional dependency is one line naming the extra to
    install (``vlret train needs PyYAML: pip install 'vlret[train]'``) and status 2."""
    from ._extras import MissingExtra, require

    args = None
    try:
        args = build_parser().parse_args(argv)
        if args.command in _TRAIN_EXTRA_COMMANDS or (
            args.command == "demo" and args.preset is not None
        ):
            for module in ("yaml", "tqdm"):
                require(module, f"vlret {args.command}")
        return args.func(args)
    except MissingExtra as err:
        print(err.for_command(getattr(args, "command", None)), file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
