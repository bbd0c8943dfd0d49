"""Running a page's blocks as a reader would: in order, in one fresh folder per page, with the
installed ``vlret`` first on PATH and ``set -e`` semantics.

Each block runs in its own ``bash`` process from a small wrapper that restores the folder and
the exported variables the previous block left (a ``cd`` or ``export`` in one block holds in the
next, as in a reader's terminal), runs the block's ``setup`` commands, then sources the block
with ``set -eET``: an ERR trap records the line of the command that failed, a DEBUG trap the
time each command starts (the per-command times of the report). HOME, TMPDIR and the caches
point into the page's own folder, the Hugging Face libraries are offline, and stdin is empty.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from docs_blocks import Block
from docs_shell import Command, ShellSyntaxError, command_words, split_commands
from docs_static import script_of

#: Lines of stderr (or stdout, when stderr is empty) a failure shows.
TAIL_LINES = 20
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_WRAPPER = """\
set -eET
S="$DOCS_CHECK_STATE"
if [ -f "$S/env" ]; then . "$S/env"; fi
if [ -f "$S/cwd" ]; then cd "$(cat "$S/cwd")"; fi
trap 'trap - DEBUG; printf "%s\\n" "${BASH_SOURCE[0]##*/}:$LINENO" > "$S/failed"' ERR
trap 'trap - DEBUG; printf "%s end\\n" "$EPOCHREALTIME" >> "$S/trace"; pwd > "$S/cwd"; \
export -p | grep -v "^declare -[a-zA-Z]*r" > "$S/env" || true' EXIT
if [ -f "$S/setup.sh" ]; then . "$S/setup.sh"; fi
trap 'if [[ "${BASH_SOURCE[0]}" == "$S/block.sh" && "$BASH_COMMAND" != "trap - DEBUG" ]]; then \
printf "%s %s\\n" "$EPOCHREALTIME" "$LINENO" >> "$S/trace"; fi' DEBUG
. "$S/block.sh"
"""


@dataclass
class Timed:
    """One documented command (the lines ``first``..``last`` of the page) and its seconds."""

    first: int
    text: str
    seconds: float


@dataclass
class RunOutcome:
    """How running one block went: ``ok``, ``failed`` or ``timeout``; on failure the page line
    and text of the failing command (when known), the exit status and the output's tail."""

    status: str
    seconds: float
    commands: list[Timed] = field(default_factory=list)
    failed_line: int | None = None
    failed_command: str | None = None
    exit_status: int | None = None
    tail: list[str] = field(default_factory=list)


def page_environment(folder: Path, bin_dir: Path) -> dict[str, str]:
    """The variables a page's blocks see: a clean environment, the venv's ``bin`` first on
    PATH, HOME / TMPDIR / caches in ``folder``, Hugging Face offline, matplotlib headless."""
    home, tmp = folder / "home", folder / "tmp"
    home.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": f"{bin_dir}:{_SYSTEM_PATH}",
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "HF_HOME": str(home / ".cache" / "huggingface"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": str(home / ".config" / "matplotlib"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "VIRTUAL_ENV": str(bin_dir.parent),
    }
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # CI may pin threads for everything
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _statements(commands: list[Command]) -> list[tuple[int, int, list[Command]]]:
    """Commands grouped into statements: those whose lines overlap (``a && b`` on one line, a
    command continued over lines) form one; ``(first, last, commands)`` in order."""
    groups: list[tuple[int, int, list[Command]]] = []
    for command in commands:
        if groups and command.first <= groups[-1][1]:
            first, last, members = groups[-1]
            groups[-1] = (first, max(last, command.last), [*members, command])
        else:
            groups.append((command.first, command.last, [command]))
    return groups


_COMMENT = re.compile(r"\s+#\s.*$")


def _without_comment(line: str) -> str:
    """``line`` without a trailing ``  # comment`` (kept when the ``#`` may be quoted)."""
    match = _COMMENT.search(line)
    if match is None:
        return line
    head = line[: match.start()]
    return head if head.count("'") % 2 == 0 and head.count('"') % 2 == 0 else line


def _display(lines: list[str]) -> str:
    """A statement on one line, continuations joined and comments dropped, at most 120
    characters."""
    text = " ".join(_without_comment(line).strip().rstrip("\\").strip() for line in lines)
    text = re.sub(r"\s+", " ", text)
    return text if len(text) <= 120 else text[:117] + "..."


def _tail(path: Path) -> list[str]:
    """The last lines of an output file as a terminal shows them: a progress bar's redraws
    (``\\r``) leave their last state, blank and repeated lines go."""
    try:
        with path.open(encoding="utf-8", errors="replace", newline="") as stream:
            text = stream.read()
    except OSError:
        return []
    lines: list[str] = []
    for row in text.split("\n"):
        shown = row.rstrip("\r").rsplit("\r", 1)[-1].rstrip()
        if shown.strip() and (not lines or lines[-1] != shown):
            lines.append(shown)
    return lines[-TAIL_LINES:]


def _kill(process: subprocess.Popen[bytes]) -> None:
    """Stop the block's process group (the block's own children too)."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _stop_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class PageRunner:
    """Runs the blocks of one page in ``folder / "work"`` (created empty), in order."""

    def __init__(self, folder: Path, *, bin_dir: Path) -> None:
        self.folder = folder
        self.work = folder / "work"
        self.state = folder / "state"
        for path in (self.work, self.state):
            if path.exists():
                shutil.rmtree(path)
            path.mkdir(parents=True)
        self.env = page_environment(folder, bin_dir)
        self.env["DOCS_CHECK_STATE"] = str(self.state)
        self.python = bin_dir / "python"
        self.killed_at: float | None = None

    def run(self, block: Block, *, timeout: float) -> RunOutcome:
        """Run ``block`` (a shell block, or a python block with its ``run`` marker) within
        ``timeout`` seconds."""
        if block.mode == "python":
            (self.state / "block.py").write_text(block.text)
            text = f'"{self.python}" "$S/block.py"\n'
            origin = [0]
            statements = [(0, 0, list(split_commands(text)))]
            shown = {0: f"python block ({len(block.lines)} lines)"}
        else:
            text, origin = script_of(block)
            try:
                statements = _statements(split_commands(text))
            except ShellSyntaxError:  # refused before running (docs_static.refusals)
                statements = []
            script_lines = text.splitlines()
            shown = {
                first: _display(script_lines[first : last + 1]) for first, last, _ in statements
            }
        (self.state / "block.sh").write_text(text)
        setup = self.state / "setup.sh"
        if block.setup:
            setup.write_text("".join(f"{command}\n" for command in block.setup))
        elif setup.exists():
            setup.unlink()
        self.killed_at = None
        for name in ("failed", "trace"):
            (self.state / name).unlink(missing_ok=True)
        (self.state / "wrapper.sh").write_text(_WRAPPER)
        stdout, stderr = self.state / "stdout.log", self.state / "stderr.log"
        start = time.monotonic()
        with stdout.open("wb") as out, stderr.open("wb") as err:
            process = subprocess.Popen(
                ["bash", str(self.state / "wrapper.sh")],
                cwd=self.work,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            try:
                status = process.wait(timeout=max(timeout, 0.1))
                timed_out = False
                _stop_group(process.pid)  # what the block left running in the background
            except subprocess.TimeoutExpired:
                self.killed_at = time.time()  # the trap bash runs as it dies is traced too
                _kill(process)
                status, timed_out = process.returncode, True
        seconds = time.monotonic() - start
        timed = self._timings(statements, origin, block, shown)
        if status == 0 and not timed_out:
            return RunOutcome("ok", seconds, timed)
        outcome = RunOutcome("timeout" if timed_out else "failed", seconds, timed)
        outcome.exit_status = None if timed_out else status
        outcome.tail = _tail(stderr) or _tail(stdout)
        where = self._failed_line(timed_out)
        if where is not None:
            source, line = where
            if source == "setup.sh":
                outcome.failed_line = block.line
                outcome.failed_command = f"setup: {block.setup[min(line, len(block.setup)) - 1]}"
            else:
                for first, last, _ in statements:
                    if first <= line - 1 <= last:
                        outcome.failed_line = block.page_line(origin[first])
                        outcome.failed_command = shown[first]
                        break
        return outcome

    def _failed_line(self, timed_out: bool) -> tuple[str, int] | None:
        """``(file, line)`` the ERR trap recorded; on a timeout, the last command started."""
        if timed_out:
            started = [line for _, line in self._trace() if line >= 0]
            return ("block.sh", started[-1]) if started else None
        try:
            source, _, line = (self.state / "failed").read_text().strip().rpartition(":")
            return source, int(line)
        except (OSError, ValueError):
            return None

    def _trace(self) -> list[tuple[float, int]]:
        """``(time, script line)`` of each command the block started, then ``(time, -1)`` at
        the end."""
        entries = []
        try:
            text = (self.state / "trace").read_text()
        except OSError:
            return []
        for row in text.splitlines():
            stamp, _, line = row.partition(" ")
            try:
                entry = (float(stamp), -1 if line == "end" else int(line))
            except ValueError:
                continue
            if entry[1] < 0 or self.killed_at is None or entry[0] < self.killed_at:
                entries.append(entry)
        return entries

    def _timings(
        self,
        statements: list[tuple[int, int, list[Command]]],
        origin: list[int],
        block: Block,
        shown: dict[int, str],
    ) -> list[Timed]:
        """Seconds per statement: from each traced command's start to the next one's."""
        trace = self._trace()
        seconds: dict[int, float] = {}
        for (stamp, line), (following, _) in zip(trace, trace[1:], strict=False):
            if line < 0:
                continue
            for first, last, _ in statements:
                if first <= line - 1 <= last:
                    seconds[first] = seconds.get(first, 0.0) + following - stamp
                    break
        timed = []
        for first, _, members in statements:
            if first in seconds and any(command_words(c.words) for c in members):
                timed.append(Timed(block.page_line(origin[first]), shown[first], seconds[first]))
        return timed
