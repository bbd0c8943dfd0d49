"""What every command module of :mod:`vlret.cli` shares: exit statuses, the one-line error, the
``train`` extra check and the argument types used by several commands."""

from __future__ import annotations

import argparse
import sys

from .._extras import require

#: A command that ran and did what was asked.
EXIT_OK = 0
#: Bad input (config, data, arguments, a missing extra): one line on stderr, no traceback.
EXIT_ERROR = 2
#: Ctrl-C, or a run that stopped at a signal after writing its checkpoint (128 + SIGINT).
EXIT_INTERRUPTED = 130

#: ``--default-preprocessing`` of ``vlret zeroshot`` and ``vlret eval --model-dir``:
#: :data:`vlret.models.clip_folder.DEFAULT_PREPROCESSINGS`, written out (the parsers import no
#: torch; a test holds the two equal).
DEFAULT_PREPROCESSINGS = ("openai-clip",)

#: The modules of the ``train`` extra that commands training, evaluating or writing run folders
#: cannot run without (PyYAML, for a run folder's config.yaml). The extra's tqdm is not one:
#: without it the commands run and draw no progress bar (:mod:`vlret._progress`).
TRAIN_EXTRA_MODULES = ("yaml",)


def fail(command: str, error: object) -> int:
    """Print ``vlret COMMAND: ERROR`` on stderr and return :data:`EXIT_ERROR`."""
    print(f"vlret {command}: {error}", file=sys.stderr)
    return EXIT_ERROR


def require_train_extra(command: str) -> None:
    """Refuse (:class:`vlret._extras.MissingExtra`, printed by :func:`vlret.cli.main` as one
    line) before anything runs when the ``train`` extra is not installed."""
    for module in TRAIN_EXTRA_MODULES:
        require(module, f"vlret {command}")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "TRAIN_EXTRA_MODULES",
    "fail",
    "positive_int",
    "require_train_extra",
]
