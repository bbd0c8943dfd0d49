"""Shard names: local paths and webdataset's URLs, checked before a run and opened while it reads.

Web-scale sets (CC3M, CC12M, LAION) live in object storage and on web servers; webdataset and
open_clip's ``--train-data`` name their shards by URL, and so do ``data.shards`` and
``data.dev_shards``, beside local paths:

- ``pipe:COMMAND``: the shard is what the shell command writes on its standard output
  (``pipe:aws s3 cp s3://bucket/cc3m/{00000..01000}.tar -``, ``pipe:gsutil cat gs://...``,
  ``pipe:curl -sfL https://...``). It runs through ``/bin/sh`` in the current folder, without a
  standard input (a command that would ask for a password fails instead of waiting), its own
  messages going to the standard error; it must end with status 0 once the shard is written.
- ``http://HOST/PATH`` and ``https://...``: read by Python's ``urllib`` (proxies from
  ``http_proxy`` / ``https_proxy``, as curl takes them; ``user:password@HOST`` sent as HTTP
  basic authentication, to that host only). A request that gets no answer for
  :data:`HTTP_TIMEOUT` seconds fails; a busy server (408, 429, 500, 502, 503, 504) or a timeout
  while connecting is asked again, :data:`HTTP_RETRIES` times, 1, 2, 4 ... seconds apart
  (:data:`HTTP_RETRY_DELAY`).
- ``file:PATH`` and ``file:///ABSOLUTE/PATH``: a local path spelled as a URL, checked and read as
  one.

Brace ranges and alternatives (``https://host/cc3m/{00000..00331}.tar``) and ``::`` between
patterns work in every form, as for local paths (webdataset's ``expand_urls``); so a host written
as an IPv6 address, which holds ``::``, must be named by a host name. ``${NAME}`` is replaced by
the environment variable ``WDS_NAME`` (webdataset's rule), in a URL only when the shard is opened:
a token kept in the environment is never written into a config, a log or an error (a shell
variable ``$NAME``, without braces, is the shell's, expanded when the command runs).

**Checked before the run** (:func:`check_url`, called by
:func:`vlret.data.formats.shards.expand_shards`): a URL's form only, since no command runs and
no request is sent before the shard is read: the scheme (``pipe``, ``http``, ``https``, ``file``;
another such as ``s3://`` is refused, naming the ``pipe:`` command that reads it), a command after
``pipe:``, a host and a numeric port in an HTTP URL, no space or control character in it (a space
is ``%20``), every ``${NAME}``'s variable set. A ``file:`` URL's file must exist, as a local
path's must.

**A shard that cannot be read** stops the run in one line naming the key and the shard as
written (``${NAME}`` not replaced, a password in a URL shown as ``***``): a command that ends with
another status than 0 (checked when its output ends: ``pipe:false``, ``pipe:cat /missing.tar``),
an HTTP error (404), a server that cannot be reached (connection refused, unknown host, no
answer), a connection lost before the end (fewer bytes than the server announced), a local file
that can no longer be opened. It is a :class:`ShardReadError`, raised by the readers as their
:class:`~vlret.data.formats.shards.ShardError`; never a bad sample, so a data set that is not
there never trains on nothing. Inside a shard that was read, a broken tar member or a bad image
is a bad sample, skipped and counted as in a local file (:mod:`vlret.data.bad_samples`). A shard
read in part (the epoch ends in it, the dev set has its images) is closed, its command stopped
(``SIGTERM`` to its process group) without a check.

Ranks, workers, the epoch's order and an exact resume are those of local shards
(:class:`~vlret.data.formats.shards.ShardStream`): a shard is a name in the list, whatever it
holds; a resumed epoch reads again the shards of the batches it skips.
"""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from http.client import HTTPException
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

from ..._extras import require

#: The URL schemes a shard may be named by, besides a local path.
URL_SCHEMES = ("pipe", "http", "https", "file")
#: Seconds an HTTP(S) shard may leave a connection or a read unanswered before it fails.
HTTP_TIMEOUT = 60.0
#: How many times a busy server or a connection timeout is asked again.
HTTP_RETRIES = 3
#: Seconds before the first new request (doubled before each next one).
HTTP_RETRY_DELAY = 1.0
#: The HTTP statuses that are asked again (a server busy or restarting).
HTTP_RETRY_STATUSES = (408, 429, 500, 502, 503, 504)

_URL = re.compile(r"^(?:pipe:|file:|[a-z][a-z0-9+.-]*://)", re.IGNORECASE)
_VARIABLE = re.compile(r"\$\{(\w+)\}")
_PASSWORD = re.compile(r"(//[^/@:\s]*:)[^/@\s]*@")
#: The ``pipe:`` command that reads a scheme vlret does not open itself.
_COMMANDS = {"s3": "pipe:aws s3 cp {url} -", "gs": "pipe:gsutil cat {url}"}


class ShardReadError(ValueError):
    """A shard that could not be read to its end: a command that failed, an HTTP error, a
    server out of reach, a connection lost, a file gone (one line naming the key and shard)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # webdataset appends the URL and the stream to ``args``
        return self.message


def is_url(name: str) -> bool:
    """Whether a shard name is a URL (``pipe:``, ``file:``, ``SCHEME://``), not a local path."""
    return _URL.match(name) is not None


def shown_url(name: str) -> str:
    """``name`` as errors show it: as written, with a URL's password as ``***``."""
    return _PASSWORD.sub(r"\1***@", name)


def substitute(text: str) -> tuple[str, list[str]]:
    """``text`` with ``${NAME}`` replaced by the environment variable ``WDS_NAME``
    (webdataset's rule, repeated while it changes, 10 rounds at most), and the names whose
    variable is not set (left as written)."""
    missing: list[str] = []

    def value(match: re.Match[str]) -> str:
        found = os.environ.get(f"WDS_{match.group(1)}")
        if found is None:
            missing.append(match.group(1))
            return match.group(0)
        return found

    for _ in range(10):
        new = _VARIABLE.sub(value, text)
        if new == text or missing:
            break
        text = new
    return new, missing


def _variables_set(text: str, *, where: str) -> str:
    """``text`` substituted (:func:`substitute`), or a ValueError naming an unset variable."""
    new, missing = substitute(text)
    if missing:
        raise ValueError(
            f"{where}: ${{{missing[0]}}} is replaced by the environment variable "
            f"WDS_{missing[0]} (webdataset's rule), which is not set"
        )
    return new


def expand_pattern(pattern: str, *, key: str) -> list[str]:
    """The shard names of one pattern: its ``::``-joined parts, each brace-expanded, in order.

    A part naming local paths only is expanded by webdataset's ``expand_urls`` (``${NAME}``
    replaced, then braces); in URLs ``${NAME}`` is kept, replaced when the shard is opened.

    Args:
        pattern: ``"cc3m/{00000..00331}.tar"``, ``"pipe:aws s3 cp s3://b/{0..9}.tar -"``, ...
        key: The config key named in errors.

    Raises:
        ValueError: Unbalanced braces, or a ``${NAME}`` whose ``WDS_NAME`` is not set.
    """
    wds = require("webdataset", "reading webdataset shards")
    out: list[str] = []
    for part in pattern.split("::"):
        try:
            names = list(wds.shardlists.braceexpand.braceexpand(part))
        except ValueError as err:  # braceexpand's UnbalancedBracesError
            raise ValueError(
                f"{key}: {shown_url(pattern)!r}: unbalanced braces ({err.__class__.__name__}); "
                "every '{' needs its '}' (a range {00000..00331} or alternatives {a,b})"
            ) from None
        where = f"{key}: {shown_url(part)!r}"
        if not any(is_url(name) for name in names):
            _variables_set(part, where=where)
            out += wds.shardlists.expand_urls(part)  # as before URLs: environment, then braces
            continue
        out += [n if is_url(n) else _variables_set(n, where=where) for n in names]
    return out


def check_url(url: str, *, key: str, pattern: str) -> str | None:
    """Check a shard URL's form before a run (the module docstring says what is checked).

    Args:
        url: One shard name that :func:`is_url`.
        key: The config key named in errors.
        pattern: The pattern it came from, named in errors.

    Returns:
        The local path of a ``file:`` URL (to check as a path), None for the others.

    Raises:
        ValueError: A scheme that is not read, or a URL of a known scheme in a wrong form.
    """
    where, source = f"{key}: {shown_url(url)}", f"(from {shown_url(pattern)!r})"
    scheme = url.split(":", 1)[0].lower()
    if scheme == "pipe":
        if not url[len("pipe:") :].strip():
            raise ValueError(
                f"{where}: no command after 'pipe:' {source}; the command writes the shard on "
                "its standard output, e.g. 'pipe:aws s3 cp s3://bucket/cc3m/00000.tar -'"
            )
        _variables_set(url, where=where)
        return None
    if scheme == "file":
        parts = urlsplit(_variables_set(url, where=where))
        if parts.netloc not in ("", "localhost"):
            raise ValueError(
                f"{where}: a file: URL names a file of this machine (file:///PATH), not one of "
                f"host {parts.netloc!r} {source}"
            )
        return unquote(parts.path)  # urllib's url2pathname on POSIX
    if scheme in ("http", "https"):
        parts = urlsplit(url)
        if re.search(r"[\x00-\x20\x7f]", url):
            raise ValueError(f"{where}: a space or control character {source}; write a space %20")
        if not parts.hostname:
            raise ValueError(f"{where}: no host {source}; e.g. 'https://host/cc3m/00000.tar'")
        try:
            parts.port  # noqa: B018 - urllib checks the port when it is read
        except ValueError:
            raise ValueError(
                f"{where}: the port is not a number from 0 to 65535 {source}"
            ) from None
        _variables_set(url, where=where)
        return None
    example = _COMMANDS.get(scheme, "pipe:aws s3 cp s3://bucket/cc3m/00000.tar -").format(url=url)
    raise ValueError(
        f"{where}: {scheme}:// is not read (shards are local paths or URLs of "
        f"{', '.join(f'{k}:' for k in URL_SCHEMES)}) {source}; read it through a command that "
        f"writes the shard on its standard output, e.g. {example!r}"
    )


def not_a_shard(path: Path, name: str, pattern: str, key: str) -> str:
    """Why the local ``path`` (``name`` of ``pattern``) is no shard file, in one line naming
    ``key``: a folder, not a regular file, or missing (a comma in its name: how to list)."""
    where = f"{key}: {path}"
    if path.is_dir():
        return (
            f"{where}: a folder, not a shard (from {pattern!r}); name its tar files, e.g. "
            f"'{path.as_posix()}/{{00000..00009}}.tar'"
        )
    if path.exists():
        return f"{where}: not a regular file (from {pattern!r}); expected a tar shard"
    line = f"{where}: missing (from {pattern!r})"
    if "," in name:  # braces have consumed theirs: this one was meant as a separator
        line += (
            "; a comma outside braces is no list separator: give a list "
            '(shards = ["a.tar", "b.tar"]) or join patterns with "::" as open_clip does'
        )
    return line


# -- reading -----------------------------------------------------------------------------------


class _LocalShard:
    """A local shard file (also a ``file:`` URL given to a reader directly)."""

    def __init__(self, name: str, *, key: str) -> None:
        path = unquote(urlsplit(name).path) if name.lower().startswith("file:") else name
        try:
            self.file: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed by finish / abandon
        except OSError as err:
            raise ShardReadError(
                f"{key}: {name}: cannot be opened ({err.strerror or err})"
            ) from None

    def read(self, size: int = -1) -> bytes:
        return self.file.read(size)

    def finish(self) -> None:
        self.file.close()

    abandon = finish


class _CommandShard:
    """The standard output of a ``pipe:`` command, checked for its exit status at its end."""

    def __init__(self, name: str, *, key: str) -> None:
        self.where = f"{key}: {shown_url(name)}"
        command, missing = substitute(name[len("pipe:") :])
        if missing:
            raise ShardReadError(
                f"{self.where}: the environment variable WDS_{missing[0]} is not set"
            )
        # a session of its own: Ctrl-C (the trainer stops after its step) does not kill it
        # mid-shard, and abandon() stops what it started with it
        try:
            self.proc = subprocess.Popen(  # noqa: S602 - the user's command, as webdataset runs it
                command,
                shell=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as err:
            raise ShardReadError(
                f"{self.where}: the command could not start ({err.strerror or err})"
            ) from None
        assert self.proc.stdout is not None
        self.out = self.proc.stdout
        self.done = False

    def read(self, size: int = -1) -> bytes:
        data = self.out.read(size)
        if not data and size != 0:
            self._end()
        return data

    def _end(self) -> None:
        if self.done:
            return
        self.done = True
        self.out.close()
        status = self.proc.wait()
        if status:
            how = (
                f"exited with status {status}" if status > 0 else f"was killed by signal {-status}"
            )
            raise ShardReadError(
                f"{self.where}: the command {how} (its own messages, if any, are above)"
            )

    def finish(self) -> None:
        """Read what follows the archive's end (its padding) and check the exit status."""
        while not self.done:
            self.read(1 << 16)

    def abandon(self) -> None:
        """Stop the command without a check (the shard was read in part)."""
        if self.done:
            return
        self.done = True
        self.out.close()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=5)
            except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
                continue


class _HttpShard:
    """The body of an HTTP(S) GET, checked against its announced length at its end."""

    def __init__(self, name: str, *, key: str) -> None:
        self.where = f"{key}: {shown_url(name)}"
        url, missing = substitute(name)
        if missing:
            raise ShardReadError(
                f"{self.where}: the environment variable WDS_{missing[0]} is not set"
            )
        parts = urlsplit(url)
        request = urllib.request.Request(
            parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        )
        if parts.username is not None:  # basic authentication, never sent on to a redirect
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            token = base64.b64encode(pair.encode()).decode()
            request.add_unredirected_header("Authorization", f"Basic {token}")
        self.response = self._open(request)
        length = self.response.headers.get("Content-Length", "")
        self.length = int(length) if length.isdigit() else None
        self.count = 0
        self.done = False

    def _fail(self, what: str) -> ShardReadError:
        return ShardReadError(f"{self.where}: {what}")

    def _open(self, request: urllib.request.Request) -> Any:
        for attempt in range(HTTP_RETRIES + 1):
            last = attempt == HTTP_RETRIES
            try:
                return urllib.request.urlopen(request, timeout=HTTP_TIMEOUT)
            except urllib.error.HTTPError as err:
                err.close()
                if last or err.code not in HTTP_RETRY_STATUSES:
                    raise self._fail(f"HTTP {err.code} {err.reason}") from None
            except urllib.error.URLError as err:
                if last or not isinstance(err.reason, TimeoutError):
                    raise self._fail(f"unreachable ({_why(err.reason)})") from None
            except TimeoutError:
                if last:
                    raise self._fail(f"no answer within {HTTP_TIMEOUT:g} s") from None
            except (OSError, HTTPException) as err:
                raise self._fail(f"unreachable ({_why(err)})") from None
            time.sleep(HTTP_RETRY_DELAY * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def read(self, size: int = -1) -> bytes:
        try:
            data = self.response.read(size if size >= 0 else None)
        except (OSError, HTTPException) as err:
            raise self._fail(
                f"the connection broke after {self.count} bytes ({_why(err)})"
            ) from None
        self.count += len(data)
        if not data and size != 0:
            self._end()
        return data

    def _end(self) -> None:
        if self.done:
            return
        self.done = True
        self.response.close()
        if self.length is not None and self.count < self.length:
            raise self._fail(f"the connection closed after {self.count} of {self.length} bytes")

    def finish(self) -> None:
        """Read what follows the archive's end and check the length."""
        while not self.done:
            self.read(1 << 16)

    def abandon(self) -> None:
        self.done = True
        self.response.close()


def _why(err: object) -> str:
    return str(getattr(err, "strerror", None) or err or type(err).__name__)


def open_shard(name: str, *, key: str) -> _LocalShard | _CommandShard | _HttpShard:
    """A shard opened for reading (``read``; ``finish`` at its end, ``abandon`` if left).

    Raises:
        ShardReadError: The shard cannot be opened (a scheme that is not read included).
    """
    scheme = name.split(":", 1)[0].lower() if is_url(name) else ""
    if scheme == "pipe":
        return _CommandShard(name, key=key)
    if scheme in ("http", "https"):
        return _HttpShard(name, key=key)
    if scheme in ("", "file"):
        return _LocalShard(name, key=key)
    raise ShardReadError(f"{key}: {shown_url(name)}: {scheme}:// is not read (see expand_shards)")


def _opened(shards: Sequence[str], *, key: str, current: list[Any]) -> Iterator[dict[str, Any]]:
    """webdataset's sources (``url``, ``stream``) of ``shards``, the one being read in
    ``current``: each finished (its end checked) when the next is asked for, abandoned when the
    reading stops inside it."""
    for name in shards:
        stream = open_shard(name, key=key)
        current[:] = [stream]
        try:
            yield {"url": name, "stream": stream}
        except BaseException:  # GeneratorExit: the reader stopped inside this shard
            stream.abandon()
            raise
        stream.finish()


def _ends_checked(files: Iterator[dict[str, Any]], current: list[Any]) -> Iterator[dict[str, Any]]:
    """The tar members, each shard's end checked at webdataset's end-of-shard marker (``{}``):
    before its last sample is grouped, so a reader that takes just that sample still sees a
    command fail after it."""
    for item in files:
        if not item and current:
            current[0].finish()
        yield item


def read_shards(
    shards: Sequence[str], *, handler: Callable[[BaseException], bool], key: str
) -> Iterator[dict[str, Any]]:
    """The samples of ``shards`` in order, as webdataset's ``tarfile_samples`` groups them
    (``__key__``, ``__url__``: the shard as written, one member per extension), over shards
    opened here (:func:`open_shard`).

    Args:
        shards: Local paths and URLs (:func:`vlret.data.formats.shards.expand_shards`).
        handler: webdataset's exception handler for a broken tar member (True: skip it); a
            :class:`ShardReadError` never reaches it.
        key: The config key named in errors.

    Raises:
        ShardReadError: A shard could not be read to its end.
    """
    tar = require("webdataset", "reading webdataset shards").tariterators

    def handle(exn: BaseException) -> bool:
        if isinstance(exn, ShardReadError):
            raise exn
        return handler(exn)

    current: list[Any] = []
    files = tar.tar_file_expander(_opened(shards, key=key, current=current), handler=handle)
    return iter(tar.group_by_keys(_ends_checked(files, current), handler=handle))


__all__ = [
    "HTTP_RETRIES",
    "HTTP_RETRY_DELAY",
    "HTTP_RETRY_STATUSES",
    "HTTP_TIMEOUT",
    "URL_SCHEMES",
    "ShardReadError",
    "check_url",
    "expand_pattern",
    "is_url",
    "not_a_shard",
    "open_shard",
    "read_shards",
    "shown_url",
    "substitute",
]
