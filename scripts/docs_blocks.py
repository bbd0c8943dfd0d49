"""The fenced code blocks of a Markdown page and their ``docs-check`` markers.

The convention (every shell block of README.md and docs/ runs in CI, `make docs-check`):

- Shell blocks are fenced blocks whose language is ``bash``, ``sh``, ``shell`` or ``console``.
  Each one is run by default (``mode == "run"``); a ``console`` block's ``$ `` lines are its
  commands, its other lines expected output.
- ``<!-- docs-check: skip REASON: why -->`` on the line before a shell block (blank lines
  allowed) makes it checked without running (``mode == "check"``); REASON is one of
  :data:`REASONS`, written ``skip long: why``.
- ``<!-- docs-check: setup: COMMAND -->`` before a run block runs COMMAND first.
- ``<!-- docs-check: run -->`` before a ``python`` block runs it (``mode == "python"``); other
  blocks are not run (``mode == "none"``).

Fences open with three or more backticks or tildes at any indentation (a fence inside a list
item is indented); the block's lines lose that indentation, and it closes at a fence of the
same character at least as long. A marker that cannot be read, names an unknown reason, or
precedes no block (or the wrong kind of block) is an error naming its line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: The languages of shell blocks.
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
#: The languages a ``<!-- docs-check: run -->`` marker may precede.
PYTHON_LANGUAGES = ("python", "py")
#: Why a shell block may be checked without running.
REASONS = ("real-data", "weights", "gpu", "long", "install", "multi-process")

_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_FENCE_CLOSE = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*$")
_MARKER_START = re.compile(r"^\s*<!--\s*docs-check\b")
_MARKER = re.compile(r"^\s*<!--\s*docs-check:\s*(?P<body>.*?)\s*-->\s*$")
#: ``skip long: why``: the reason word, a colon, the free text.
_SKIP = re.compile(r"^skip\s+(?P<reason>[^\s:]+)\s*:\s*(?P<why>.*)$")
_SETUP = re.compile(r"^setup\s*:\s*(?P<command>.*)$")


@dataclass(frozen=True)
class DocsError:
    """A problem with a page, at ``page:line``."""

    page: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.message}"


@dataclass
class Block:
    """One fenced code block: ``line`` is the opening fence's line number (1-based) and
    ``lines`` the content without the fence's indentation; content line ``i`` (0-based) is on
    the page's line ``line + 1 + i``."""

    page: str
    line: int
    language: str
    lines: list[str]
    mode: str = "none"
    reason: str | None = None
    why: str | None = None
    setup: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The block's content, one string."""
        return "".join(f"{line}\n" for line in self.lines)

    def page_line(self, offset: int) -> int:
        """The page's line number of content line ``offset`` (0-based)."""
        return self.line + 1 + offset

    @property
    def where(self) -> str:
        """``page:line`` of the opening fence."""
        return f"{self.page}:{self.line}"


@dataclass
class _Marker:
    line: int
    kind: str  # "skip" | "setup" | "run"
    value: str = ""
    why: str = ""


def _language(info: str) -> str:
    """The first word of a fence's info string: ``bash title="x"`` and ``{.bash}`` are bash."""
    words = info.strip().split()
    if not words:
        return ""
    return words[0].strip("{}").lstrip(".").lower()


def _parse_marker(text: str, page: str, line: int) -> _Marker | DocsError:
    m = _MARKER.match(text)
    if m is None:
        return DocsError(
            page,
            line,
            "docs-check marker not understood: write it on one line as "
            "<!-- docs-check: skip REASON: why -->, <!-- docs-check: setup: COMMAND --> or "
            "<!-- docs-check: run -->",
        )
    body = m["body"]
    if body == "run":
        return _Marker(line, "run")
    skip = _SKIP.match(body)
    if skip is not None:
        if skip["reason"] not in REASONS:
            return DocsError(
                page,
                line,
                f"docs-check skip: unknown reason {skip['reason']!r}; expected one of "
                f"{', '.join(REASONS)}",
            )
        if not skip["why"]:
            return DocsError(page, line, "docs-check skip: say why after the reason's colon")
        return _Marker(line, "skip", skip["reason"], skip["why"])
    setup = _SETUP.match(body)
    if setup is not None:
        if not setup["command"]:
            return DocsError(page, line, "docs-check setup: no command after 'setup:'")
        return _Marker(line, "setup", setup["command"])
    if body.startswith("skip"):
        return DocsError(
            page,
            line,
            f"docs-check skip: expected 'skip REASON: why' with REASON one of "
            f"{', '.join(REASONS)}, got {body!r}",
        )
    return DocsError(
        page,
        line,
        f"docs-check marker {body!r} not understood; expected 'skip REASON: why', "
        "'setup: COMMAND' or 'run'",
    )


def _apply_markers(block: Block, markers: list[_Marker]) -> list[DocsError]:
    """Set ``block.mode`` from its language and the markers before it."""
    errors = []
    shell = block.language in SHELL_LANGUAGES
    python = block.language in PYTHON_LANGUAGES
    block.mode = "run" if shell else "none"
    kinds = [m.kind for m in markers]
    for marker in markers:
        if marker.kind == "run":
            if shell:
                errors.append(
                    DocsError(
                        block.page, marker.line, "docs-check run: shell blocks run by default"
                    )
                )
            elif not python:
                errors.append(
                    DocsError(
                        block.page,
                        marker.line,
                        f"docs-check run: the block below is {block.language or 'untagged'}; "
                        "only python blocks take this marker",
                    )
                )
            else:
                block.mode = "python"
        elif not shell:
            errors.append(
                DocsError(
                    block.page,
                    marker.line,
                    f"docs-check {marker.kind}: the block below is "
                    f"{block.language or 'untagged'}, not a shell block "
                    f"({', '.join(SHELL_LANGUAGES)})",
                )
            )
        elif marker.kind == "skip":
            block.mode, block.reason, block.why = "check", marker.value, marker.why
        else:
            block.setup.append(marker.value)
    if kinds.count("skip") > 1 or kinds.count("run") > 1:
        errors.append(DocsError(block.page, markers[0].line, "docs-check: marker given twice"))
    if "skip" in kinds and "setup" in kinds:
        errors.append(
            DocsError(
                block.page,
                markers[0].line,
                "docs-check: setup before a skipped block (it is not run, so nothing uses it)",
            )
        )
    return errors


def extract_blocks(text: str, page: str) -> tuple[list[Block], list[DocsError]]:
    """Every fenced block of the Markdown ``text`` of ``page``, with the errors of its
    markers and fences (an unclosed fence, a marker before no block)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    errors: list[DocsError] = []
    markers: list[_Marker] = []
    i = 0
    while i < len(lines):
        raw = lines[i]
        number = i + 1
        opening = _FENCE_OPEN.match(raw)
        if opening is not None and not (opening["fence"][0] == "`" and "`" in opening["info"]):
            indent = len(opening["indent"].expandtabs(4))
            fence = opening["fence"]
            content: list[str] = []
            j = i + 1
            closed = False
            while j < len(lines):
                closing = _FENCE_CLOSE.match(lines[j])
                if (
                    closing is not None
                    and closing["fence"][0] == fence[0]
                    and len(closing["fence"]) >= len(fence)
                ):
                    closed = True
                    break
                content.append(_dedent(lines[j], indent))
                j += 1
            if not closed:
                errors.append(DocsError(page, number, f"fence {fence} is never closed"))
            block = Block(page, number, _language(opening["info"]), content)
            errors += _apply_markers(block, markers)
            markers = []
            blocks.append(block)
            i = j + 1
            continue
        if _MARKER_START.match(raw):
            parsed = _parse_marker(raw, page, number)
            if isinstance(parsed, DocsError):
                errors.append(parsed)
            else:
                markers.append(parsed)
        elif raw.strip() and markers:
            errors.append(
                DocsError(
                    page,
                    markers[0].line,
                    "docs-check marker not followed by a fenced block (only blank lines may "
                    "come between)",
                )
            )
            markers = []
        i += 1
    if markers:
        errors.append(
            DocsError(page, markers[0].line, "docs-check marker not followed by a fenced block")
        )
    return blocks, errors


def _dedent(line: str, indent: int) -> str:
    """``line`` without up to ``indent`` columns of leading whitespace."""
    expanded = line.expandtabs(4)
    stripped = expanded.lstrip(" ")
    removed = min(indent, len(expanded) - len(stripped))
    return expanded[removed:]


#: Lines of untagged blocks that look like commands nobody runs.
_COMMAND_LIKE = re.compile(
    r"^\s*(\$\s+)?(vlret\s+--?[a-z]|vlret\s+[a-z][a-z-]*(?=\s|$)|python3? -m vlret\b|torchrun\s)"
)


def unrun_command_lines(block: Block) -> list[int]:
    """Content offsets of lines that look like ``vlret`` commands in an untagged block (a
    shell block left untagged escapes the check: reported as a warning; a ``text`` block is
    taken to be a synopsis or output on purpose)."""
    if block.language:
        return []
    return [i for i, line in enumerate(block.lines) if _COMMAND_LIKE.match(line)]
