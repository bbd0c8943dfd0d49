"""``vlret train CONFIG [--set SECTION.KEY=VALUE ...] [--resume CKPT] [--overwrite]``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import EXIT_INTERRUPTED, EXIT_OK, fail, require_train_extra

NAME = "train"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``train`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(NAME, help="train a retrieval model from a TOML/YAML config")
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
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Train; under torchrun only rank 0 reports. Bad input, a run folder in use by another
    run, and a write refused for room or permission (naming the file; the last checkpoint is
    left as it was) end in one line, exit status 2."""
    require_train_extra(NAME)
    from .._files import write_failure
    from ..data import DataFormatError
    from ..train import ConfigError, TrainingInterrupted, load_config, train
    from ..train.distributed import env_from_torchrun
    from ..train.run_folder import resume_command

    # Errors in the config or the data: one line on stderr, exit status 2, no traceback.
    try:
        main = env_from_torchrun().is_main
        config = load_config(args.config, args.set)
        result = train(config, resume=args.resume, overwrite=args.overwrite)
    except TrainingInterrupted as err:
        if main:
            command = resume_command(args.config, args.set, err.checkpoint)
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


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
