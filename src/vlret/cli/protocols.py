"""``vlret protocols [--long]``: the evaluation tasks ``vlret eval --protocol`` runs, one line
each (name, what it scores, the data and splits it runs on); ``--long`` adds what each needs
(model, data, split, class set), how it runs and the metric keys it reports."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import EXIT_OK

NAME = "protocols"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``protocols`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(
        NAME,
        help="list the evaluation protocols and tasks (vlret eval --protocol NAME)",
        description="One line per task vlret eval runs: retrieval under each registered "
        "protocol, and zero-shot classification.",
    )
    p.add_argument(
        "--long",
        action="store_true",
        help="also say what each needs (model, data, split, class set), how it runs and the "
        "metric keys it reports",
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """One line per registered task: name, what it scores, the splits it accepts (and, with
    ``--long``, its needs, command and metric keys, indented beneath)."""
    from ..eval import get_task, task_names

    for name in task_names():
        task = get_task(name)
        print(task.line())
        if getattr(args, "long", False):
            print("\n".join(task.details()))
    return EXIT_OK
