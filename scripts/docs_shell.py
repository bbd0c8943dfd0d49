"""The commands of a documented shell block, read the way bash reads them (for the subset of
bash that documentation uses): quotes, backslash escapes and line continuations, comments,
``$( )`` and backticks kept inside a word, the separators ``; & && || | ( )`` and newlines,
redirections (dropped with their target) and here-documents (their body skipped).

:func:`split_commands` gives each simple command's words and the lines it spans;
:func:`vlret_arguments` tells a ``vlret`` invocation (``vlret``, ``python -m vlret``,
``torchrun ... -m vlret``, after environment assignments, ``time``, ``env`` or a keyword such as
``do``) and returns its arguments; :func:`install_command` tells a package installation;
:func:`console_script` turns a ``console`` block into its commands.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

#: Operators, longest first so that ``&&`` is not read as two ``&``.
_OPERATORS = (
    "&>>",
    "<<-",
    "<<<",
    "&&",
    "||",
    ";;",
    "|&",
    ">>",
    "<<",
    "&>",
    ">&",
    "<&",
    ">|",
    "<>",
    ";",
    "&",
    "|",
    "(",
    ")",
    "<",
    ">",
)
_REDIRECTIONS = frozenset({"&>>", "<<-", "<<<", ">>", "<<", "&>", ">&", "<&", ">|", "<>", "<", ">"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
#: Words that may precede a command (the command follows them on the same line).
_PREFIX_WORDS = frozenset(
    {"if", "then", "else", "elif", "while", "until", "do", "!", "{", "exec", "nohup"}
)
#: Words that start something that is not a simple command.
_NOT_COMMANDS = frozenset({"for", "case", "select", "function", "done", "fi", "esac", "}", "in"})
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


class ShellSyntaxError(ValueError):
    """A block the reader cannot split into commands (an unclosed quote); ``line`` is the
    0-based content line where the problem starts."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True)
class _Token:
    kind: str  # "word" | "op"
    text: str
    line: int


@dataclass(frozen=True)
class Command:
    """A simple command: its words (quotes removed, redirections dropped) and the 0-based
    content lines ``first``..``last`` it spans."""

    words: tuple[str, ...]
    first: int
    last: int


def _substitution_end(text: str, i: int) -> int:
    """The index after the ``)`` that closes the ``$(`` at ``i``."""
    depth = 0
    j = i + 1
    quote = ""
    while j < len(text):
        c = text[j]
        if quote:
            if c == "\\" and quote == '"':
                j += 2
                continue
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "\\":
            j += 2
            continue
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return -1


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    word: list[str] | None = None
    word_line = 0
    word_quoted = False
    line = 0
    heredocs: list[tuple[str, bool]] = []
    i = 0
    n = len(text)

    def start(at: int) -> None:
        nonlocal word, word_line, word_quoted
        if word is None:
            word, word_line, word_quoted = [], at, False

    def end() -> None:
        nonlocal word
        if word is None:
            return
        value = "".join(word)
        if tokens and tokens[-1].kind == "op" and tokens[-1].text in ("<<", "<<-"):
            heredocs.append((value, tokens[-1].text == "<<-"))
        tokens.append(_Token("word", value, word_line))
        word = None

    while i < n:
        c = text[i]
        if c == "\\":
            if i + 1 < n and text[i + 1] == "\n":  # a line continuation
                i += 2
                line += 1
                continue
            start(line)
            assert word is not None
            word.append(text[i + 1] if i + 1 < n else "\\")
            word_quoted = True
            i += 2
            continue
        if c == "\n":
            end()
            tokens.append(_Token("op", "\n", line))
            line += 1
            i += 1
            for delimiter, strip_tabs in heredocs:  # the bodies follow the line
                while i < n:
                    eol = text.find("\n", i)
                    body_line = text[i : eol if eol >= 0 else n]
                    i = eol + 1 if eol >= 0 else n
                    line += 1
                    if (body_line.lstrip("\t") if strip_tabs else body_line) == delimiter:
                        break
            heredocs = []
            continue
        if c in " \t":
            end()
            i += 1
            continue
        if c == "#" and word is None:
            eol = text.find("\n", i)
            i = eol if eol >= 0 else n
            continue
        if c == "'":
            start(line)
            assert word is not None
            close = text.find("'", i + 1)
            if close < 0:
                raise ShellSyntaxError(line, "unclosed single quote")
            word.append(text[i + 1 : close])
            word_quoted = True
            line += text.count("\n", i, close)
            i = close + 1
            continue
        if c == '"':
            start(line)
            assert word is not None
            word_quoted = True
            opened = line
            j = i + 1
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n and text[j + 1] in '$`"\\\n':
                    if text[j + 1] == "\n":
                        line += 1
                    else:
                        word.append(text[j + 1])
                    j += 2
                    continue
                if text[j] == "\n":
                    line += 1
                word.append(text[j])
                j += 1
            if j >= n:
                raise ShellSyntaxError(opened, "unclosed double quote")
            i = j + 1
            continue
        if c == "$" and text.startswith("$(", i):
            start(line)
            assert word is not None
            close = _substitution_end(text, i + 1)
            if close < 0:
                raise ShellSyntaxError(line, "unclosed $(")
            word.append(text[i:close])
            line += text.count("\n", i, close)
            i = close
            continue
        if c == "`":
            start(line)
            assert word is not None
            close = text.find("`", i + 1)
            if close < 0:
                raise ShellSyntaxError(line, "unclosed backquote")
            word.append(text[i : close + 1])
            line += text.count("\n", i, close)
            i = close + 1
            continue
        op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
        if op is not None:
            if op[0] in "<>" and word is not None and not word_quoted and "".join(word).isdigit():
                word = None  # the 2 of 2>&1 is the redirection's file descriptor
            end()
            tokens.append(_Token("op", op, line))
            i += len(op)
            continue
        start(line)
        assert word is not None
        word.append(c)
        i += 1
    end()
    return tokens


def split_commands(text: str) -> list[Command]:
    """The simple commands of the shell ``text``, in order (see the module docstring)."""
    commands: list[Command] = []
    words: list[str] = []
    first = last = 0
    skip_next = False
    for token in _tokenize(text):
        if token.kind == "op" and token.text in _REDIRECTIONS:
            skip_next = True
            last = token.line
            continue
        if token.kind == "word":
            if skip_next:
                skip_next = False
                last = token.line
                continue
            if not words:
                first = token.line
            words.append(token.text)
            last = token.line
            continue
        skip_next = False
        if words:
            commands.append(Command(tuple(words), first, last))
            words = []
    if words:
        commands.append(Command(tuple(words), first, last))
    return commands


def command_words(words: tuple[str, ...] | list[str]) -> list[str]:
    """The command and its arguments: ``words`` without leading environment assignments,
    keywords (``do``, ``then``, ``time``, ...) and ``env`` with its options; empty for what is
    not a simple command (``for x in ...``, ``done``)."""
    rest = list(words)
    while rest:
        head = rest[0]
        if _ASSIGNMENT.match(head) or head in _PREFIX_WORDS:
            rest.pop(0)
        elif head == "time":
            rest.pop(0)
            if rest and rest[0] == "-p":
                rest.pop(0)
        elif head == "env":
            rest.pop(0)
            while rest and (rest[0].startswith("-") or _ASSIGNMENT.match(rest[0])):
                option = rest.pop(0)
                if option in ("-u", "--unset", "-C", "--chdir") and rest:
                    rest.pop(0)
        else:
            break
    if rest and rest[0] in _NOT_COMMANDS:
        return []
    return rest


def vlret_arguments(words: tuple[str, ...] | list[str]) -> list[str] | None:
    """The arguments of a ``vlret`` invocation (``vlret ARGS``, ``python -m vlret ARGS``,
    ``torchrun [OPTIONS] -m vlret ARGS``), else None."""
    argv = command_words(words)
    if not argv:
        return None
    program = PurePosixPath(argv[0]).name
    if program == "vlret":
        return argv[1:]
    if _PYTHON.match(program) or program == "torchrun":
        for k in range(1, len(argv) - 1):
            if argv[k] == "-m" and argv[k + 1] == "vlret":
                return argv[k + 2 :]
            if _PYTHON.match(program) and not argv[k].startswith("-"):
                return None  # python script.py -m vlret: not vlret
    return None


def install_command(words: tuple[str, ...] | list[str]) -> bool:
    """Whether the command installs packages (pip, python -m pip, uv pip, conda, apt)."""
    argv = command_words(words)
    if not argv:
        return False
    program = PurePosixPath(argv[0]).name
    rest = argv[1:]
    if _PYTHON.match(program) and rest[:2] == ["-m", "pip"]:
        rest = rest[2:]
        program = "pip"
    elif program == "uv" and rest[:1] == ["pip"]:
        rest = rest[1:]
        program = "pip"
    verbs = [w for w in rest if not w.startswith("-")]
    if re.match(r"^pip(\d+(\.\d+)?)?$", program):
        return verbs[:1] in (["install"], ["download"])
    if program in ("conda", "mamba", "micromamba", "apt", "apt-get", "uv"):
        return verbs[:1] in (["install"], ["add"], ["sync"])
    return False


def console_script(lines: list[str]) -> tuple[list[str], list[int]]:
    """The commands of a ``console`` block: the ``$ `` lines without the prompt, each followed
    by its continuation lines (after a line ending in a backslash; a ``> `` prompt dropped);
    returns the script's lines and, for each, its 0-based line in the block."""
    script: list[str] = []
    origin: list[int] = []
    continuing = False
    for offset, line in enumerate(lines):
        if continuing:
            text = line[2:] if line.startswith("> ") else line
        elif line.startswith("$ ") or line == "$":
            text = line[2:]
        else:
            continue
        script.append(text)
        origin.append(offset)
        continuing = _continues(text)
    return script, origin


def _continues(line: str) -> bool:
    """Whether ``line`` ends in an unescaped backslash (a line continuation)."""
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def prompt_lines(lines: list[str]) -> list[int]:
    """0-based lines of a bash/sh/shell block that start with a ``$ `` prompt (they cannot run
    as written: such a block is a ``console`` block)."""
    return [i for i, line in enumerate(lines) if line.startswith("$ ")]
