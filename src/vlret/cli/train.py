"""``vlret train CONFIG [--set SECTION.KEY=VALUE ...] [--resume CKPT] [--overwrite]
[--check | --check-config] [--log-gradients N]``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import EXIT_INTERRUPTED, EXIT_OK, fail, positive_int, require_train_extra

NAME = "train"
#: The keys ``vlret train --help`` lists below its options (the reference has every key).
COMMON_KEYS = (
    ("output_dir", "the run folder"),
    ("data.root", "the data folder"),
    ("train.epochs", "epochs to train"),
    ("train.batch_size", "the global batch"),
    ("train.max_steps_per_epoch", "cut each epoch to that many steps (a quick try)"),
    ("train.progress", "the per-batch progress bar (true / false)"),
    ("train.device", "auto, cpu, cuda or cuda:N"),
    ("optim.lr", "the learning rate"),
    ("optim.warmup_steps", "linear warm-up steps"),
    ("loss.name", "any registered loss (vlret losses); its parameters are loss.<param>"),
)
#: Where every key is described (a page of the docs site, generated from the declarations).
KEY_REFERENCE = "docs/reference/config.md"


def epilog() -> str:
    """The text under ``vlret train --help``'s options: the most used keys and where the others
    are described."""
    width = max(len(key) for key, _ in COMMON_KEYS)
    keys = "\n".join(f"  {key:<{width}}  {doc}" for key, doc in COMMON_KEYS)
    return (
        f"most used config keys (set in the file or with --set KEY=VALUE):\n{keys}\n\n"
        f"every key, with its type, default and constraint: {KEY_REFERENCE} in the source "
        'tree, the "Config keys" page of the docs site'
    )


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``train`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(
        NAME,
        help="train a retrieval model from a TOML/YAML config",
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "config", type=Path, help="run config (.toml or .yaml) or a shipped config's name"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config key (repeatable), e.g. --set optim.lr=1e-4",
    )
    p.add_argument("--resume", type=Path, help="checkpoint to continue from (last.pt)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run that output_dir already holds (refused without this flag)",
    )
    p.add_argument(
        "--log-gradients",
        type=positive_int,
        metavar="N",
        help="every N steps, log the tangent components of the loss's gradient on the batch "
        "to gradients.jsonl in the run folder (vlret.analysis.gradient_log; vlret plot gradients)",
    )
    checks = p.add_mutually_exclusive_group()
    checks.add_argument(
        "--check",
        action="store_true",
        help="check the config, the data, the model folder and the output folder as the run "
        "would before its first step, print the start-of-run summary and exit, writing nothing",
    )
    checks.add_argument(
        "--check-config",
        action="store_true",
        help="check the config alone (keys, types, constraints, cross-checks, the model "
        "section) without reading the data, model folder or output folder, and exit",
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Train; under torchrun only rank 0 reports. Bad input, a run folder in use by another
    run, and a write refused for room or permission (naming the file; the last checkpoint is
    left as it was) end in one line, exit status 2."""
    require_train_extra(NAME)
    from .._files import write_failure
    from ..data import DataFormatError
    from ..run import ConfigError, load_config
    from ..run.devices import env_from_torchrun
    from ..run.folder import resume_command
    from ..train import TrainingInterrupted, train

    # Errors in the config or the data: one line on stderr, exit status 2, no traceback.
    try:
        main = env_from_torchrun().is_main
        config = load_config(args.config, args.set)
        if args.check or args.check_config:
            return _check(args, config)
        hooks: list[Any] = []
        if args.log_gradients:
            from ..analysis.gradient_log import GradientLog

            hooks.append(GradientLog(every=args.log_gradients))
        result = train(config, resume=args.resume, overwrite=args.overwrite, hooks=hooks)
    except TrainingInterrupted as err:
        if main:
            logging = ["--log-gradients", str(args.log_gradients)] if args.log_gradients else []
            command = resume_command(args.config, args.set, err.checkpoint, options=logging)
            print(f"interrupted; resume with: {command}")
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:  # a second Ctrl-C outside a step (data loading, validation)
        if main:
            print("interrupted; the last checkpoint written (if any) is in the output folder")
        return EXIT_INTERRUPTED
    except (ConfigError, DataFormatError, FileNotFoundError, ValueError) as err:
        return fail(NAME, err)
    except OSError as err:  # disk full, file size limit, a folder made read-only mid-run
        line = write_failure(err)
        if line is None:
            raise
        return fail(NAME, line)
    if main:
        best = (
            f", best dev {result.select_on} {result.best_metric:.2f}"
            if result.best_metric is not None
            else ""
        )
        epochs = _plural(result.epochs_done, "epoch")
        steps = _plural(result.steps, "step")
        print(f"done: {epochs}, {steps}{best}; {result.output_dir}")
    return EXIT_OK


def _check(args: argparse.Namespace, config: Any) -> int:
    """``--check`` / ``--check-config``: the summary, then the line that says it passed."""
    from ..train.run_check import CHECK_PASSED, CONFIG_PASSED, check_config, check_run

    if args.check_config:
        print(check_config(config))
        print(CONFIG_PASSED)
        return EXIT_OK
    print(check_run(config, resume=args.resume, overwrite=args.overwrite))
    print(CHECK_PASSED)
    return EXIT_OK


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
