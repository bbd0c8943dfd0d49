#!/usr/bin/env python
"""Documentation that runs: every shell block of README.md and docs/**/*.md, as written.

    .venv/bin/python scripts/check_docs.py                # every page (make docs-check)
    .venv/bin/python scripts/check_docs.py --page README.md --keep
    .venv/bin/python scripts/check_docs.py --list         # the blocks and what is done to each
    .venv/bin/python scripts/check_docs.py --dry-run      # check every block, run nothing
    .venv/bin/python scripts/check_docs.py --keep-going   # run on past a failed block
    .venv/bin/python scripts/check_docs.py --json build/docs-check.json   # the times, as JSON

The marker convention is in docs_blocks.py. The blocks of a page run in order in one fresh
folder per page (outside the repository), with this interpreter's ``bin`` folder (the
installed ``vlret``) first on PATH, under a per-page time limit and a total budget; a block
marked ``<!-- docs-check: skip REASON: why -->`` is checked without running (its ``vlret``
commands parsed by vlret's parser, the configs they name validated). CI never installs: a
runnable block with ``pip install`` is refused. One line per block with its time (and one per
command it ran), then a table per page; a failure names the page, the line, the command and
the tail of its stderr, and the exit status is 1. ``--dry-run`` checks runnable blocks the way
skipped ones are checked.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docs_blocks import Block, extract_blocks, unrun_command_lines  # noqa: E402
from docs_run import PageRunner, RunOutcome  # noqa: E402
from docs_static import check_block, refusals  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
#: Seconds one page's blocks may take together, and all pages together (CI's budget).
PAGE_TIMEOUT = 300.0
BUDGET = 600.0


@dataclass
class PageReport:
    """What happened to one page: blocks run, blocks checked only, seconds, failures."""

    page: str
    run: int = 0
    checked: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    blocks: list[dict[str, Any]] = field(default_factory=list)


def find_pages(root: Path) -> list[Path]:
    """README.md and every Markdown file under docs/, in path order."""
    pages = [root / "README.md"] if (root / "README.md").is_file() else []
    docs = root / "docs"
    if docs.is_dir():
        pages += sorted(p for p in docs.rglob("*.md") if p.is_file())
    return pages


def _name(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def _say(line: str) -> None:
    print(line, flush=True)


def _failure(block: Block, outcome: RunOutcome, limit: str) -> str:
    """The failure's report: page:line, the command, how it ended, its stderr's tail."""
    line = outcome.failed_line or block.line
    command = outcome.failed_command or f"the {block.language or 'python'} block"
    if outcome.status == "timeout":
        how = f"stopped after {outcome.seconds:.0f} s in this block: {limit} was reached"
    else:
        how = f"exit status {outcome.exit_status}"
    tail = "\n".join(f"    | {row}" for row in outcome.tail) or "    | (no output)"
    return (
        f"{block.page}:{line}: {command}\n    (the block at line {block.line}) {how}; "
        f"output tail:\n{tail}"
    )


class DocsCheck:
    """Checks pages one by one, printing as it goes; ``reports`` holds the page results."""

    def __init__(
        self,
        *,
        root: Path,
        bin_dir: Path,
        work_root: Path,
        page_timeout: float,
        budget: float,
        dry_run: bool,
        keep_going: bool = False,
        keep: bool = False,
    ) -> None:
        self.root = root
        self.bin_dir = bin_dir
        self.work_root = work_root
        self.page_timeout = page_timeout
        self.budget = budget
        self.dry_run = dry_run
        self.keep_going = keep_going
        self.keep = keep
        self.start = time.monotonic()
        self.reports: list[PageReport] = []

    def page(self, path: Path) -> PageReport:
        """Check one page: its markers, its skipped blocks, then its runnable blocks in order
        (none when a marker is wrong: the block may be one its author meant to skip)."""
        name = _name(path, self.root)
        report = PageReport(name)
        self.reports.append(report)
        page_start = time.monotonic()
        blocks, errors = extract_blocks(path.read_text(encoding="utf-8"), name)
        report.failures += [str(e) for e in errors]
        for error in errors:
            _say(f"{error}  FAIL")
        for block in blocks:
            if (
                block.language == "console"
                and block.mode != "none"
                and not any(line.startswith("$ ") for line in block.lines)
            ):
                report.warnings.append(
                    f"{block.where}: a console block without '$ ' lines (nothing to run or check)"
                )
            for offset in unrun_command_lines(block):
                report.warnings.append(
                    f"{name}:{block.page_line(offset)}: a command in "
                    f"{'a ' + block.language if block.language else 'an untagged'} block "
                    "(not run; tag it bash or console?)"
                )
        runner: PageRunner | None = None
        stopped: str | None = "a docs-check marker of this page is wrong" if errors else None
        for block in blocks:
            if block.mode == "check" or (self.dry_run and block.mode == "run"):
                self._check(block, report)
            elif block.mode in ("run", "python") and not self.dry_run:
                if stopped is not None:
                    report.failures.append(f"{block.where}: not run ({stopped})")
                    _say(f"{block.where:<28} {block.mode:<20} {'-':>7}  not run: {stopped}")
                    continue
                if runner is None:
                    runner = PageRunner(self.work_root / _slug(name), bin_dir=self.bin_dir)
                if not self._run(block, report, runner, page_start) and not self.keep_going:
                    stopped = f"an earlier block failed: {report.failures[-1].splitlines()[0]}"
        report.seconds = time.monotonic() - page_start
        if runner is not None and not self.keep:  # a page's worlds go before the next page's
            shutil.rmtree(runner.folder, ignore_errors=True)
        return report

    def _check(self, block: Block, report: PageReport) -> None:
        began = time.monotonic()
        result = check_block(block, self.root)
        errors = list(result.errors)
        if block.mode == "run":
            errors = refusals(block) + errors
        report.checked += 1
        seconds = time.monotonic() - began
        notes = [f"{result.parsed} vlret command{'s' if result.parsed != 1 else ''} parsed"]
        if result.validated:
            notes.append(f"configs validated: {', '.join(dict.fromkeys(result.validated))}")
        if result.not_validated:
            names = ", ".join(dict.fromkeys(result.not_validated))
            notes.append(f"not a shipped or repository config, parsed only: {names}")
        status = "FAIL" if errors else "ok"
        label = f"check ({block.reason})" if block.reason else "check"
        _say(f"{block.where:<28} {label:<20} {seconds:6.1f}s  {status}  ({'; '.join(notes)})")
        report.blocks.append(
            {
                "line": block.line,
                "mode": "check",
                "reason": block.reason,
                "seconds": round(seconds, 2),
                "ok": not errors,
                "vlret_commands_parsed": result.parsed,
                "configs_validated": list(dict.fromkeys(result.validated)),
            }
        )
        for error in errors:
            report.failures.append(str(error))
            _say(f"    {error}")

    def _run(self, block: Block, report: PageReport, runner: PageRunner, page_start: float) -> bool:
        refused = refusals(block) if block.mode == "run" else []
        if refused:
            report.failures += [str(e) for e in refused]
            _say(f"{block.where:<28} {block.mode:<20} {'-':>7}  FAIL (refused, not run)")
            for error in refused:
                _say(f"    {error}")
            return False
        now = time.monotonic()
        page_left = self.page_timeout - (now - page_start)
        budget_left = self.budget - (now - self.start)
        left = min(page_left, budget_left)
        limit = (
            f"the page's time limit (--page-timeout {self.page_timeout:.0f} s for all its blocks)"
            if page_left <= budget_left
            else f"the total budget (--budget {self.budget:.0f} s for all pages)"
        )
        if left <= 0:
            report.failures.append(f"{block.where}: not run (the time limit is spent)")
            _say(f"{block.where:<28} {block.mode:<20} {'-':>7}  FAIL: the time limit is spent")
            return False
        outcome = runner.run(block, timeout=left)
        report.blocks.append(
            {
                "line": block.line,
                "mode": block.mode,
                "seconds": round(outcome.seconds, 2),
                "ok": outcome.status == "ok",
                "commands": [
                    {"line": c.first, "command": c.text, "seconds": round(c.seconds, 2)}
                    for c in outcome.commands
                ],
            }
        )
        report.run += 1
        status = "ok" if outcome.status == "ok" else "FAIL"
        _say(f"{block.where:<28} {block.mode:<20} {outcome.seconds:6.1f}s  {status}")
        for command in outcome.commands:
            _say(f"    {block.page}:{command.first:<6} {command.seconds:6.1f}s  {command.text}")
        if outcome.status != "ok":
            message = _failure(block, outcome, limit)
            report.failures.append(message)
            _say("    " + message.replace("\n", "\n    "))
            return False
        return True

    def summary(self) -> str:
        """The per-page table, the warnings, and every failure again."""
        width = max([len("page"), *(len(r.page) for r in self.reports)])
        rows = [
            f"{'page':<{width}}  {'run':>4}  {'checked':>7}  {'seconds':>8}  result",
            f"{'-' * width}  {'-' * 4}  {'-' * 7}  {'-' * 8}  ------",
        ]
        for r in self.reports:
            result = f"FAIL ({len(r.failures)})" if r.failures else "ok"
            rows.append(
                f"{r.page:<{width}}  {r.run:>4}  {r.checked:>7}  {r.seconds:8.1f}  {result}"
            )
        total = sum(r.seconds for r in self.reports)
        runs = sum(r.run for r in self.reports)
        checked = sum(r.checked for r in self.reports)
        failures = [f for r in self.reports for f in r.failures]
        rows.append(
            f"{'total':<{width}}  {runs:>4}  {checked:>7}  {total:8.1f}  "
            f"{'FAIL (' + str(len(failures)) + ')' if failures else 'ok'}"
        )
        warnings = [w for r in self.reports for w in r.warnings]
        if warnings:
            rows += ["", f"warnings ({len(warnings)}):", *(f"  {w}" for w in warnings)]
        if failures:
            rows += ["", f"failures ({len(failures)}):", *(f"  {f}" for f in failures)]
        return "\n".join(rows)


def _slug(page: str) -> str:
    return page.replace("/", "__").removesuffix(".md")


def write_json(path: Path, reports: list[PageReport]) -> None:
    """The per-page record of ``--json`` (written whole: a temporary file renamed)."""
    record = {
        "pages": [
            {
                "page": r.page,
                "blocks_run": r.run,
                "blocks_checked": r.checked,
                "seconds": round(r.seconds, 2),
                "failures": r.failures,
                "blocks": r.blocks,
            }
            for r in reports
        ],
        "seconds": round(sum(r.seconds for r in reports), 2),
        "ok": not any(r.failures for r in reports),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(partial, path)


def list_blocks(pages: list[Path], root: Path) -> int:
    """``--list``: each block's page:line, language and what the check does to it."""
    status = 0
    for path in pages:
        name = _name(path, root)
        blocks, errors = extract_blocks(path.read_text(encoding="utf-8"), name)
        for error in errors:
            print(f"{error}  FAIL")
            status = 1
        for block in blocks:
            what = {
                "run": "run",
                "python": "run (python)",
                "check": f"check only ({block.reason}: {block.why})",
                "none": "not run",
            }[block.mode]
            setup = f"; setup: {' && '.join(block.setup)}" if block.setup else ""
            print(f"{block.where:<28} {block.language or '(untagged)':<10} {what}{setup}")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="check_docs.py",
        description="Run every shell block of README.md and docs/ as written; check the "
        "skip-marked ones without running them.",
    )
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the repository (default: this one)"
    )
    parser.add_argument(
        "--page",
        action="append",
        type=Path,
        help="only this page (repeatable; a path from the root, e.g. docs/synthetic.md)",
    )
    parser.add_argument("--list", action="store_true", help="list the blocks; run nothing")
    parser.add_argument(
        "--dry-run", action="store_true", help="check every shell block without running any"
    )
    parser.add_argument(
        "--page-timeout",
        type=float,
        default=PAGE_TIMEOUT,
        help=f"seconds one page's blocks may take ({PAGE_TIMEOUT:.0f})",
    )
    parser.add_argument(
        "--budget", type=float, default=BUDGET, help=f"seconds for all pages ({BUDGET:.0f})"
    )
    parser.add_argument(
        "--json",
        type=Path,
        help="also write the pages, blocks and commands with their times to this JSON file",
    )
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="after a failed block, run the page's next blocks anyway (to see every failure)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the pages' folders (their path is printed)"
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.page:
        pages = [p if p.is_absolute() else root / p for p in args.page]
        missing = [str(p) for p in pages if not p.is_file()]
        if missing:
            print(f"check_docs.py: --page {missing[0]}: no such file", file=sys.stderr)
            return 2
    else:
        pages = find_pages(root)
    if args.list:
        return list_blocks(pages, root)
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "vlret").is_file():
        print(
            f"check_docs.py: no vlret in {bin_dir}; run this script with the venv's python "
            "(.venv/bin/python scripts/check_docs.py)",
            file=sys.stderr,
        )
        return 2
    work_root = Path(tempfile.mkdtemp(prefix="vlret-docs-check-"))
    check = DocsCheck(
        root=root,
        bin_dir=bin_dir,
        work_root=work_root,
        page_timeout=args.page_timeout,
        budget=args.budget,
        dry_run=args.dry_run,
        keep_going=args.keep_going,
        keep=args.keep,
    )
    try:
        for path in pages:
            check.page(path)
    finally:
        if args.keep:
            print(f"the pages' folders: {work_root}")
        else:
            shutil.rmtree(work_root, ignore_errors=True)
    print()
    print(check.summary())
    if args.json is not None:
        write_json(args.json, check.reports)
    return 1 if any(r.failures for r in check.reports) else 0


if __name__ == "__main__":
    sys.exit(main())
