"""Checks of documented commands that run nothing: each ``vlret`` command parsed by vlret's own
parser (:func:`vlret.cli.build_parser`), the configs that ``vlret train | compare | sweep``
name validated at the config level as ``vlret train CONFIG --check-config`` does (no data,
model folder or output folder read), and the refusals of a runnable block
(a package installation, a ``$ `` prompt in a bash block, an unclosed quote).

A config is validated when it is a shipped config's name or a ``.toml`` / ``.yaml`` file of the
repository; any other name (``CONFIG``, a file an earlier command writes) is parsed only, and
the result says so.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docs_blocks import Block, DocsError
from docs_shell import (
    ShellSyntaxError,
    console_script,
    install_command,
    prompt_lines,
    split_commands,
    vlret_arguments,
)

_CONFIG_SUFFIXES = (".toml", ".yaml", ".yml")
#: Where a comparison checked without running would write (nothing is written there).
_NOWHERE = Path("/nonexistent/docs-check")


@dataclass
class StaticResult:
    """What checking a block without running it found: errors naming ``page:line``, the
    number of ``vlret`` commands parsed, the configs validated and those only parsed."""

    errors: list[DocsError] = field(default_factory=list)
    parsed: int = 0
    validated: list[str] = field(default_factory=list)
    not_validated: list[str] = field(default_factory=list)


def script_of(block: Block) -> tuple[str, list[int]]:
    """The shell text a block runs and, for each of its lines, the block's content line: a
    ``console`` block's commands, any other shell block as written."""
    if block.language == "console":
        lines, origin = console_script(block.lines)
        return "".join(f"{line}\n" for line in lines), origin
    return block.text, list(range(len(block.lines)))


@functools.cache
def _parser() -> argparse.ArgumentParser:
    from vlret.cli import build_parser

    return build_parser()


def parse_vlret(arguments: list[str]) -> tuple[argparse.Namespace | None, str | None]:
    """``(namespace, None)`` when vlret's parser accepts ``arguments``, ``(None, None)`` for
    ``--help`` / ``--version`` (the parser exits 0), ``(None, message)`` when it refuses them
    (argparse's own error line)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            namespace = _parser().parse_args(arguments)
    except SystemExit as stop:
        if stop.code in (0, None):
            return None, None
        lines = err.getvalue().strip().splitlines()
        return None, lines[-1] if lines else f"vlret's parser exited with {stop.code}"
    return namespace, None


def config_file(name: str, root: Path) -> Path | None:
    """The file a command's CONFIG names: a shipped config, or a config file of the
    repository at ``root``; None for anything else (a placeholder, a file made at run time)."""
    from vlret.configs import shipped_config

    if "$" in name or not name:
        return None
    shipped = shipped_config(name)
    if shipped is not None:
        return Path(shipped)
    path = Path(name)
    candidate = path if path.is_absolute() else root / path
    if candidate.suffix in _CONFIG_SUFFIXES and candidate.is_file():
        return candidate
    return None


def validate_config(namespace: argparse.Namespace, path: Path) -> str | None:
    """Validate the config of a ``train`` / ``compare`` / ``sweep`` command with its ``--set``
    overrides (and ``--losses``, ``--seeds``, ``--param``) without data; the error, or None."""
    from vlret._extras import MissingExtra
    from vlret.analysis.compare.spec import CompareError
    from vlret.run import ConfigError

    try:
        if namespace.command == "train":
            _validate_train(namespace, path)
        else:
            _validate_comparison(namespace, path)
    except (ConfigError, CompareError, MissingExtra, ValueError, OSError) as err:
        return str(err)
    except Exception as err:  # a bug in a check is reported at the line, the others still run
        return f"{type(err).__name__}: {err}"
    return None


def _validate_train(namespace: argparse.Namespace, path: Path) -> None:
    """What ``vlret train CONFIG --check-config`` checks: the config with its overrides, and
    its model section built once with a stand-in vocabulary."""
    from vlret.run import load_config
    from vlret.train.run_check import check_config

    check_config(load_config(path, namespace.set, note=None))


def _validate_comparison(namespace: argparse.Namespace, path: Path) -> None:
    """The checks ``vlret compare`` / ``vlret sweep`` make before their first run: the
    ``[compare]`` section, the variants and every run's resolved config, then the config check
    of ``vlret train --check-config`` on each variant's first seed."""
    from vlret.analysis.compare import spec, sweeps
    from vlret.train.run_check import check_config

    raw, section = spec.read_compare_config(path, namespace.set)
    spec.eval_settings(raw, section)
    seeds = namespace.seeds if namespace.seeds is not None else section.get("seeds", 1)
    if namespace.command == "compare":
        losses = spec.parse_losses(namespace.losses) if namespace.losses is not None else None
        variants = spec.resolve_variants(raw, section, losses, goal_grid=namespace.goal_grid)
    else:
        grid: dict[str, list[Any]] = {}
        for item in namespace.param:
            name, values = sweeps.parse_param(item)
            grid[name] = values
        label = namespace.loss or (raw.get("loss", {}) or {}).get("name")
        if not label:
            raise spec.CompareError("--loss: no loss given and the config has no [loss] name")
        base = spec.make_variant(label, section.get("losses", {}).get(label, {}), raw)
        spec.check_params(base.label, base.loss, dict.fromkeys(grid), "--param")
        variants = sweeps.sweep_variants(base, grid)
    checked: set[str] = set()
    for run in spec.plan_runs(raw, variants, seeds, _NOWHERE):
        if run.variant.label not in checked:  # the seed changes no key the check reads
            checked.add(run.variant.label)
            check_config(run.config)


def check_block(block: Block, root: Path) -> StaticResult:
    """Check a ``skip``-marked block without running it: every ``vlret`` command parsed, the
    configs they name validated."""
    result = StaticResult()
    text, origin = script_of(block)
    try:
        commands = split_commands(text)
    except ShellSyntaxError as err:
        result.errors.append(DocsError(block.page, block.page_line(origin[err.line]), str(err)))
        return result
    for command in commands:
        arguments = vlret_arguments(command.words)
        if arguments is None:
            continue
        line = block.page_line(origin[command.first])
        shown = shlex.join(command.words)
        namespace, error = parse_vlret(arguments)
        result.parsed += 1
        if error is not None:
            result.errors.append(DocsError(block.page, line, f"{shown}\n    {error}"))
            continue
        if namespace is None or namespace.command not in ("train", "compare", "sweep"):
            continue
        name = str(namespace.config)
        path = config_file(name, root)
        if path is None:
            result.not_validated.append(name)
            continue
        problem = validate_config(namespace, path)
        if problem is not None:
            result.errors.append(
                DocsError(block.page, line, f"{shown}\n    config {name}: {problem}")
            )
        else:
            result.validated.append(name)
    return result


def refusals(block: Block) -> list[DocsError]:
    """Why a runnable shell block cannot run as written in CI: a package installation (mark it
    ``<!-- docs-check: skip install: ... -->``), a bash block with ``$ `` prompts (tag it
    ``console``), text the shell reader cannot split."""
    errors = []
    if block.language != "console":
        for offset in prompt_lines(block.lines):
            errors.append(
                DocsError(
                    block.page,
                    block.page_line(offset),
                    f"{block.language} block line starts with a '$ ' prompt; tag the block "
                    "console (its '$ ' lines are the commands) or drop the prompt",
                )
            )
    text, origin = script_of(block)
    try:
        commands = split_commands(text)
    except ShellSyntaxError as err:
        return [*errors, DocsError(block.page, block.page_line(origin[err.line]), str(err))]
    for command in commands:
        if install_command(command.words):
            errors.append(
                DocsError(
                    block.page,
                    block.page_line(origin[command.first]),
                    f"{shlex.join(command.words)}: CI does not install packages; mark the block "
                    "<!-- docs-check: skip install: WHY --> on the line before it",
                )
            )
    return errors
