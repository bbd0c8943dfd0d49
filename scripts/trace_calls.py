#!/usr/bin/env python
"""Follow one ``vlret`` command from the CLI down and count the files its call path enters.

    .venv/bin/python scripts/trace_calls.py -- eval runs/first --protocol coco5k --no-progress
    PYTHONPATH=/tmp/old/src .venv/bin/python scripts/trace_calls.py --follow all -- eval ...

The command runs in-process (``vlret.cli.main(ARGS)``) under :func:`sys.setprofile`; the
``vlret`` package traced is the one Python imports (``PYTHONPATH`` picks another tree). The
output is the sequence of entries (``caller file -> entered file:function``), then
``places``, ``returns`` and the number of entries of each file.

What is counted (the definitions behind issue 41's "at most 10 places, at most 2 returns"):

- The path starts at the command's ``run(args)``, the function ``vlret.cli.main`` dispatches
  to; building the parser and parsing the arguments are not part of it.
- A call is *between vlret modules* when the called function's source file lies in the
  ``vlret`` package and so does the file of its caller, the innermost ``vlret`` frame on the
  stack (calls through torch, argparse or dataclasses' generated methods count as calls from
  the ``vlret`` frame below them).
- An *entry* is such a call whose file differs from the caller's file (a call inside one file
  enters nothing), counted once per call site: the caller's file and line and the function
  called. A loop calling one function from one line (a check per config field, a step per
  batch) is one entry; the listing shows how many calls it made (``x90``). A generator resumed
  is the same activation, not a new entry. Module bodies run by an import (``<module>``) and
  everything they call are not the path.
- A *place* is a file the path enters at least once; *returns* are the entries into a file the
  path had already entered (and so left) before, from another call site:
  ``returns = entries - places``. A file entered from 3 call sites is one place and 2 returns.
- ``--follow harness`` (the default, the rule behind the issue's target): the path is the
  harness's, the packages that decide what is evaluated (``cli``, ``run``, ``train``,
  ``analysis``, ``demo``, ``tour``). Its places are the harness files it enters, and the file of
  the evaluation core (``--stop``, default ``vlret/eval/pipeline.py:evaluate``, where the path
  reaches the metrics). A call from the harness into a layer below it (``eval``, ``data``,
  ``models``, ``metrics``, the core modules: a protocol looked up, a split read, a model built)
  is that layer's service: it is listed under ``calls out`` with the number of files they
  reach, not counted as a place, and nothing below it is followed.
- ``--follow all``: every call between vlret modules is followed and counted, except below
  ``--stop`` (encoding, scoring and ranking are below the evaluation core). A wider view, for
  reference.

A loop adds calls, not entries (one call site), so an ensemble counts as one checkpoint does;
options such as ``--shortlist`` or ``--rescore`` add their own call sites.
"""

from __future__ import annotations

import argparse
import sys
import types
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The packages whose calls are followed under ``--follow harness``.
HARNESS = ("cli", "run", "train", "analysis", "demo", "tour", "__main__.py")
#: The evaluation core: a place, below which nothing is followed.
DEFAULT_STOP = "vlret/eval/pipeline.py:evaluate"

_GENERATOR_FLAGS = 0x20 | 0x80 | 0x200  # CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR


@dataclass(frozen=True)
class Entry:
    """One entry: a call from ``caller`` (a file, ``None`` for the start) at ``line`` into
    ``function`` of ``file``."""

    caller: str | None
    line: int
    file: str
    function: str


@dataclass
class Trace:
    """The entries of one call path in the order they were first made, and how many calls
    each made."""

    calls: dict[Entry, int] = field(default_factory=dict)
    #: calls out of the path into a layer below it (``--follow harness``), not places
    outside: dict[Entry, int] = field(default_factory=dict)

    def add(self, entry: Entry, *, place: bool = True) -> None:
        """Count a call (a new entry the first time its call site is seen); ``place=False``:
        a call out of the path."""
        calls = self.calls if place else self.outside
        calls[entry] = calls.get(entry, 0) + 1

    @property
    def entries(self) -> list[Entry]:
        """The entries, in order."""
        return list(self.calls)

    @property
    def counts(self) -> Counter[str]:
        """The number of entries into each file."""
        return Counter(e.file for e in self.calls)

    @property
    def places(self) -> int:
        """Files entered at least once."""
        return len(self.counts)

    @property
    def returns(self) -> int:
        """Entries into a file already entered before (``entries - places``)."""
        return len(self.calls) - self.places

    def report(self) -> str:
        """The entries, then ``places``, ``returns`` and the entries of each file."""
        lines = ["path:"]
        for title, calls in (("path:", self.calls), ("calls out (not places):", self.outside)):
            if title != lines[0]:
                lines.append(title)
            for e, n in calls.items():
                where = f"{e.caller}:{e.line}" if e.caller is not None else "(start)"
                call = f"  {where} -> {e.file}:{e.function}"
                lines.append(call + (f" x{n}" if n > 1 else ""))
        lines.append(f"places: {self.places}")
        lines.append(f"returns: {self.returns}")
        lines.append(f"entries: {len(self.calls)}")
        for name, count in sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {count}  {name}")
        if self.outside:
            reached = len({e.file for e in self.outside})
            lines.append(f"calls out: {len(self.outside)} call sites into {reached} file(s)")
        return "\n".join(lines)


# Stack states: a followed vlret frame, a frame outside vlret (transparent), a frame whose
# callees are not followed (an import, a leaf below the followed layers), before the start.
_VLRET, _OTHER, _BLIND, _BEFORE = "vlret", "other", "blind", "before"


class CallTracer:
    """Records the :class:`Trace` of calls under ``root`` (a package folder), starting at the
    first call that ``starts(file, function, caller_file, caller_function)`` accepts.

    Args:
        root: The package folder whose files are counted (their paths are relative to its
            parent: ``vlret/run/evaluate.py``).
        starts: Whether a call (relative file, function name, and the same of the innermost
            calling vlret frame) starts the path; ``None``: the first call into ``root``.
        follows: Whether a relative file is on the path: a call into it is a place's entry and
            its calls are followed; a call into another file is a call out (listed, not a
            place) and nothing below it is followed.
        stop: ``file:function``: a place whatever ``follows`` says, below which nothing is
            followed.
    """

    def __init__(
        self,
        root: Path,
        *,
        starts: Callable[[str, str, str | None, str | None], bool] | None = None,
        follows: Callable[[str], bool] = lambda _file: True,
        stop: str | None = None,
    ) -> None:
        self.root = root.resolve()
        self.starts = starts
        self.follows = follows
        self.stop = stop
        self.trace = Trace()
        # per active frame: its state and the innermost vlret frame (itself or below it)
        self._stack: list[tuple[str, types.FrameType | None]] = []
        self._files: dict[str, str | None] = {}
        self._resumable: dict[int, types.FrameType] = {}  # generators already entered

    def relative(self, filename: str) -> str | None:
        """``filename`` relative to the package's parent (``vlret/...``), ``None`` outside."""
        if filename not in self._files:
            rel = None
            path = Path(filename)
            if path.is_absolute() and path.exists():
                try:
                    rel = path.resolve().relative_to(self.root).as_posix()
                except ValueError:
                    rel = None
            self._files[filename] = None if rel is None else f"{self.root.name}/{rel}"
        return self._files[filename]

    def _profile(self, frame: types.FrameType, event: str, _arg: Any) -> None:
        if event == "return":
            if self._stack:
                self._stack.pop()
            return
        if event != "call":
            return
        state, inner = self._stack[-1] if self._stack else (_BEFORE, None)
        code = frame.f_code
        file = self.relative(code.co_filename)
        if state == _BLIND or code.co_name == "<module>":
            self._stack.append((_BLIND, inner))
            return
        caller = None if inner is None else self.relative(inner.f_code.co_filename)
        if state == _BEFORE:
            caller_fn = None if inner is None else inner.f_code.co_name
            if file is None or not (
                self.starts is None or self.starts(file, code.co_name, caller, caller_fn)
            ):
                self._stack.append((_BEFORE, frame if file is not None else inner))
                return
            caller, inner = None, None  # the start
        if file is None:
            self._stack.append((_OTHER, inner))
            return
        resumed = False
        if code.co_flags & _GENERATOR_FLAGS:
            resumed = self._resumable.get(id(frame)) is frame
            self._resumable[id(frame)] = frame
        stopped = self.stop is not None and f"{file}:{code.co_name}" == self.stop
        on_path = self.follows(file)
        if file != caller and not resumed:
            line = inner.f_lineno if inner is not None else 0
            self.trace.add(Entry(caller, line, file, code.co_name), place=on_path or stopped)
        self._stack.append((_VLRET if on_path and not stopped else _BLIND, frame))

    def run(self, call: Callable[[], Any]) -> Any:
        """``call()`` under the profiler; its result (the trace is :attr:`trace`)."""
        previous = sys.getprofile()
        self._stack = [(_BEFORE, None)]  # this frame (its return pops it)
        sys.setprofile(self._profile)
        try:
            return call()
        finally:
            sys.setprofile(previous)
            self._resumable.clear()


def harness_file(file: str) -> bool:
    """Whether ``file`` (``vlret/...``) is in a harness package (:data:`HARNESS`)."""
    parts = file.split("/")
    return len(parts) > 1 and parts[1] in HARNESS


def command_start(file: str, function: str, caller: str | None, caller_fn: str | None) -> bool:
    """The command's ``run(args)`` as ``vlret.cli.main`` calls it."""
    return (
        function == "run" and caller == "vlret/cli/__init__.py" and caller_fn == "main"
    ) or False


def trace_command(args: Sequence[str], *, follow: str = "harness", stop: str = DEFAULT_STOP):
    """Run ``vlret ARGS`` in-process and return ``(exit status, Trace)``."""
    import vlret
    from vlret.cli import main

    root = Path(vlret.__file__).resolve().parent
    tracer = CallTracer(
        root,
        starts=command_start,
        follows=harness_file if follow == "harness" else (lambda _file: True),
        stop=stop,
    )
    status = tracer.run(lambda: main(list(args)))
    return status, tracer.trace


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Count the vlret files one CLI command's call path enters (see the module "
        "docstring for the rule)."
    )
    parser.add_argument(
        "--follow",
        choices=("harness", "all"),
        default="harness",
        help="harness (default): places are the cli/run/train/analysis files the path enters "
        "and the evaluation core (--stop), a call into a lower layer is a call out; all: "
        "every call between vlret modules down to --stop",
    )
    parser.add_argument(
        "--stop",
        default=DEFAULT_STOP,
        help=f"FILE:FUNCTION, the evaluation core: a place, below which nothing is followed "
        f"(default {DEFAULT_STOP})",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the vlret command and options")
    ns = parser.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        parser.error("give the vlret command after --, e.g. -- eval RUN --protocol coco5k")
    status, trace = trace_command(command, follow=ns.follow, stop=ns.stop)
    print(trace.report())
    print(f"exit status of vlret {command[0]}: {status}")
    return 0 if status == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
